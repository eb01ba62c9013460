"""advise reads a model's architecture from the model itself (issue 35): a GGUF header (written
here in GGUF's own layout: magic, version 3, key-values, tensor table), a config.json, from the
Hugging Face cache or a hub on loopback (Range requests for the header), cached afterwards."""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from orchestrator.advise.architecture import Unreadable, facts_from_config, facts_from_gguf, read_gguf_header
from orchestrator.advise.modelsource import ModelUnreadable, model_facts

F16, Q8_0, MXFP4 = 1, 8, 39


def _s(text: str) -> bytes:
    return struct.pack("<Q", len(text.encode())) + text.encode()


def _kv(key: str, value: Any) -> bytes:
    if isinstance(value, str):
        return _s(key) + struct.pack("<I", 8) + _s(value)
    if isinstance(value, list):
        return _s(key) + struct.pack("<IIQ", 9, 4, len(value)) + b"".join(
            struct.pack("<I", v) for v in value)
    return _s(key) + struct.pack("<II", 4, value)


def gguf(values: dict[str, Any], tensors: list[tuple[str, list[int], int]]) -> bytes:
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(values))
    out += b"".join(_kv(k, v) for k, v in values.items())
    for name, dims, kind in tensors:
        out += _s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", kind, 0)
    return out + b"\0" * 64  # the data section would follow


MOE = {"general.architecture": "moe", "moe.block_count": 2, "moe.embedding_length": 64,
       "moe.expert_count": 8, "moe.expert_used_count": 2, "moe.attention.head_count": 4,
       "moe.attention.head_count_kv": 2, "moe.attention.key_length": 16}
TENSORS = [("token_embd.weight", [64, 1000], Q8_0), ("output.weight", [64, 1000], Q8_0)] + [
    t for i in range(2) for t in (
        (f"blk.{i}.attn_q.weight", [64, 64], F16),
        (f"blk.{i}.ffn_up_exps.weight", [64, 128, 8], MXFP4),
        (f"blk.{i}.ffn_down_exps.weight", [128, 64, 8], MXFP4))]


def test_a_gguf_header_gives_what_a_token_reads() -> None:
    facts = facts_from_gguf([read_gguf_header(gguf(MOE, TENSORS))], "test")
    # read per token: the LM head (64k Q8_0: 34 bytes per 32), 2 x attn_q (4096 f16), and of
    # each layer's 8 experts (2 x 64 x 128 x 8 MXFP4: 17 bytes per 32) 2; not the embedding
    lm, attn = 64_000 * 34 / 32, 2 * 4096 * 2
    experts = 2 * 2 * 64 * 128 * 8 * 17 / 32 * 2 / 8
    assert facts.active_params_b * 1e9 == pytest.approx(64_000 + 8192 + 2 * 2 * 64 * 128 * 2)
    assert facts.active_params_b * 1e9 * facts.bytes_per_param == pytest.approx(lm + attn + experts)
    assert (facts.layers, facts.hidden, facts.experts, facts.experts_per_token) == (2, 64, 8, 2)
    assert facts.expert_share == pytest.approx(experts / (lm + attn + experts))
    assert facts.kv_bytes_per_token == 2 * 2 * (16 + 16) * 2
    # tied LM head (no output.weight): the embedding is read whole every token
    tied = facts_from_gguf([read_gguf_header(gguf(MOE, TENSORS[:1] + TENSORS[2:]))], "t")
    assert tied.active_params_b == pytest.approx(facts.active_params_b)
    with pytest.raises(Unreadable, match="GGUF magic"):
        read_gguf_header(b"PK\3\4" + b"\0" * 64)


def test_config_json_moe_counts_and_quantization() -> None:
    config = {"architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 94,
              "hidden_size": 4096, "num_attention_heads": 64, "num_key_value_heads": 4,
              "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
              "moe_intermediate_size": 1536, "intermediate_size": 12288, "vocab_size": 151936,
              "quantization_config": {"quant_method": "gptq", "bits": 4}}
    facts = facts_from_config(config, "test")
    assert facts.active_params_b == pytest.approx(21.6, abs=0.2)  # the card's "22B activated"
    assert (facts.experts, facts.experts_per_token, facts.bytes_per_param) == (128, 8, 0.53)
    assert facts.expert_share == pytest.approx(0.66, abs=0.01)
    dense = facts_from_config({"num_hidden_layers": 36, "hidden_size": 4096,
                               "num_attention_heads": 32, "num_key_value_heads": 8,
                               "intermediate_size": 12288, "vocab_size": 151936,
                               "torch_dtype": "bfloat16"}, "t")
    assert dense.active_params_b == pytest.approx(7.6, abs=0.05) and dense.bytes_per_param == 2.0
    with pytest.raises(Unreadable, match="num_experts_per_tok"):
        facts_from_config({**config, "num_experts_per_tok": None}, "t")


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return tmp_path


def test_downloaded_files_are_read_and_the_result_cached(isolated: Path) -> None:
    snap = isolated / "hub" / "models--org--moe-GGUF" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (isolated / "hub" / "models--org--moe-GGUF" / "refs").mkdir()
    (isolated / "hub" / "models--org--moe-GGUF" / "refs" / "main").write_text("abc123")
    # a split model: the first part holds the key-values, each part its own tensors
    (snap / "m-00001-of-00002.gguf").write_bytes(gguf(MOE, TENSORS[:4]))
    (snap / "m-00002-of-00002.gguf").write_bytes(gguf({"split.no": 1}, TENSORS[4:]))
    facts = model_facts("org/moe-GGUF", "main", "m-00001-of-00002.gguf")
    whole = facts_from_gguf([read_gguf_header(gguf(MOE, TENSORS))], "x")
    assert facts.active_params_b == pytest.approx(whole.active_params_b)
    assert "GGUF header" in facts.note and "Hugging Face cache" in facts.note
    for part in snap.iterdir():
        part.unlink()
    assert model_facts("org/moe-GGUF", "main", "m-00001-of-00002.gguf") == facts  # the cache
    with pytest.raises(ModelUnreadable, match="cannot read the architecture of org/other"):
        model_facts("org/other", "main", None)


class Hub(BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}
    seen: list[tuple[str, str | None, str | None]] = []

    def do_GET(self) -> None:  # http.server's name for it
        self.seen.append((self.path, self.headers.get("Range"), self.headers.get("Authorization")))
        body = self.files.get(self.path)
        if body is None:
            self.send_response(404)
            self.end_headers()
            return
        wanted = self.headers.get("Range")
        if wanted:
            end = int(wanted.split("-")[1])
            body = body[:end + 1]
        self.send_response(206 if wanted else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hub(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[type[Hub]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    Hub.files, Hub.seen = {}, []
    yield Hub
    server.shutdown()


def test_the_hub_is_asked_for_config_json_and_the_gguf_header_only(
        hub: type[Hub], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    hub.files["/org/dense/resolve/main/config.json"] = json.dumps(
        {"num_hidden_layers": 36, "hidden_size": 4096, "num_attention_heads": 32,
         "num_key_value_heads": 8, "intermediate_size": 12288, "vocab_size": 151936,
         "quantization_config": {"quant_method": "fp8"}}).encode()
    big = gguf(MOE, TENSORS) + b"\0" * (8 << 20)
    hub.files["/org/moe/resolve/v1/m.gguf"] = big
    dense = model_facts("org/dense")
    assert dense.bytes_per_param == 1.0 and "FP8" in dense.note and "hub" in dense.note
    moe = model_facts("org/moe", "v1", "m.gguf")
    assert moe.experts == 8
    ranges = [r for path, r, _ in hub.seen if path.endswith(".gguf")]
    assert ranges == ["bytes=0-4194303"]  # the header, never the 8 MB of weights
    assert all(auth == "Bearer hf_secret" for _, _, auth in hub.seen)
    with pytest.raises(ModelUnreadable) as missing:
        model_facts("org/absent")
    assert "HTTP 404" in str(missing.value) and "hf_secret" not in str(missing.value)
