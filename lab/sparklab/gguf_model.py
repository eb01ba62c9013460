"""A real GGUF model for the lab's llama.cpp: a small llama with random weights and a real vocabulary.

Written with PyPI's `gguf` package (llama.cpp's own GGUF writer), from the Llama 3 BPE vocabulary
that llama.cpp's source ships (`models/ggml-vocab-llama-bpe.gguf`: tokens, merges, special
tokens). The weights are seeded random numbers, so the text it writes is nonsense, but every
token is computed by the real llama-server (and, over RPC, the real rpc-server) from real
tensors. Big enough that loading and the RPC split move real data (~80 MB, mostly the 128k x 256
embedding), small enough for 2 cores (hundreds of tokens a second).

Published as the lab hub's repo `sparklab/tiny-llama-gguf` (a folder under the hub root that
the lab's `hf download` serves like any repo): the .gguf, a `tokenizer.json` in Hugging Face's
format built from the same vocabulary (what clients such as llama-benchy count tokens with), a
`config.json` and a README. Deterministic: the same inputs give the same bytes, and the folder
is rebuilt only when they change (`.sparklab-inputs` holds their digest).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = "sparklab/tiny-llama-gguf"
GGUF_FILE = "tiny-llama-f16.gguf"
VOCAB = "models/ggml-vocab-llama-bpe.gguf"
GENERATOR = 1
"""Bump when the way the model is written changes (it is part of the inputs' digest)."""
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
                r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
"""The Llama 3 pre-tokenizer's split (llama.cpp's `llama-bpe` pre-tokenizer is the same)."""
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    "\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
"""Llama 3's chat format: llama.cpp recognises it (its llama3 template) and stops at <|eot_id|>."""


@dataclass(frozen=True)
class Shape:
    n_embd: int = 256
    n_layer: int = 8
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 768
    n_ctx: int = 4096
    seed: int = 20261125


def _vocab(source: Path) -> dict[str, Any]:
    from gguf import GGUFReader

    reader = GGUFReader(source / VOCAB)

    def value(key: str) -> Any:
        return reader.fields[key].contents()

    return {"tokens": value("tokenizer.ggml.tokens"), "types": value("tokenizer.ggml.token_type"),
            "merges": value("tokenizer.ggml.merges"),
            "bos": value("tokenizer.ggml.bos_token_id"), "eos": value("tokenizer.ggml.eos_token_id")}


def inputs_digest(source: Path, shape: Shape) -> str:
    digest = hashlib.sha256((source / VOCAB).read_bytes())
    digest.update(json.dumps({"shape": asdict(shape), "generator": GENERATOR,
                              "template": CHAT_TEMPLATE}, sort_keys=True).encode())
    return digest.hexdigest()


def write_gguf(path: Path, vocab: dict[str, Any], shape: Shape) -> None:
    import numpy as np
    from gguf import GGUFWriter, LlamaFileType

    rng = np.random.default_rng(shape.seed)
    head_dim = shape.n_embd // shape.n_head
    kv_dim = head_dim * shape.n_head_kv
    writer = GGUFWriter(str(path), "llama")
    writer.add_name("sparklab tiny llama (random weights)")
    writer.add_block_count(shape.n_layer)
    writer.add_context_length(shape.n_ctx)
    writer.add_embedding_length(shape.n_embd)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(vocab["tokens"]))
    writer.add_file_type(LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])
    writer.add_token_merges(vocab["merges"])
    writer.add_bos_token_id(vocab["bos"])
    writer.add_eos_token_id(vocab["eos"])
    writer.add_eot_token_id(vocab["tokens"].index("<|eot_id|>"))
    writer.add_chat_template(CHAT_TEMPLATE)

    def matrix(rows: int, cols: int) -> Any:  # numpy order: (out, in); ggml sees [in, out]
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    def norm() -> Any:
        return np.ones(shape.n_embd, dtype=np.float32)

    writer.add_tensor("token_embd.weight", matrix(len(vocab["tokens"]), shape.n_embd))
    for i in range(shape.n_layer):
        blk = f"blk.{i}"
        writer.add_tensor(f"{blk}.attn_norm.weight", norm())
        writer.add_tensor(f"{blk}.attn_q.weight", matrix(shape.n_embd, shape.n_embd))
        writer.add_tensor(f"{blk}.attn_k.weight", matrix(kv_dim, shape.n_embd))
        writer.add_tensor(f"{blk}.attn_v.weight", matrix(kv_dim, shape.n_embd))
        writer.add_tensor(f"{blk}.attn_output.weight", matrix(shape.n_embd, shape.n_embd))
        writer.add_tensor(f"{blk}.ffn_norm.weight", norm())
        writer.add_tensor(f"{blk}.ffn_gate.weight", matrix(shape.n_ff, shape.n_embd))
        writer.add_tensor(f"{blk}.ffn_up.weight", matrix(shape.n_ff, shape.n_embd))
        writer.add_tensor(f"{blk}.ffn_down.weight", matrix(shape.n_embd, shape.n_ff))
    writer.add_tensor("output_norm.weight", norm())  # no output.weight: tied to the embedding
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tokenizer_json(vocab: dict[str, Any]) -> dict[str, Any]:
    """Hugging Face's tokenizer.json for the same vocabulary: byte-level BPE with Llama 3's
    split; control tokens (type 3) are added special tokens, as in Meta's own file."""
    special = [i for i, kind in enumerate(vocab["types"]) if kind == 3]
    added = [{"id": i, "content": vocab["tokens"][i], "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True} for i in special]
    skip = set(special)
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": {tok: i for i, tok in enumerate(vocab["tokens"]) if i not in skip},
                  "merges": list(vocab["merges"])},
    }


def hf_config(vocab: dict[str, Any], shape: Shape) -> dict[str, Any]:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": shape.n_embd, "num_hidden_layers": shape.n_layer,
            "num_attention_heads": shape.n_head, "num_key_value_heads": shape.n_head_kv,
            "intermediate_size": shape.n_ff, "max_position_embeddings": shape.n_ctx,
            "vocab_size": len(vocab["tokens"]), "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": True, "bos_token_id": vocab["bos"],
            "eos_token_id": vocab["eos"], "torch_dtype": "float16",
            "sparklab_gguf": GGUF_FILE}


README = f"""# {REPO}

A llama-architecture model with seeded random weights and Llama 3's vocabulary, written by
sparklab (lab/sparklab/gguf_model.py) with PyPI's `gguf` package for the simulated DGX Spark
lab. It runs in the real llama.cpp; what it writes is nonsense. `tokenizer.json` matches the
GGUF's vocabulary.
"""


def publish(hub: Path, source: Path, shape: Shape = Shape()) -> Path:
    """The repo folder under `hub` (HUB_IN_NODE in the nodes), written when missing or stale."""
    def write(staging: Path) -> None:
        vocab = _vocab(source)
        write_gguf(staging / GGUF_FILE, vocab, shape)
        (staging / "tokenizer.json").write_text(json.dumps(tokenizer_json(vocab), ensure_ascii=False))
        (staging / "config.json").write_text(json.dumps(hf_config(vocab, shape), indent=2) + "\n")
        (staging / "README.md").write_text(README)

    return publish_repo(hub / REPO, inputs_digest(source, shape), write)


def publish_repo(target: Path, digest: str, write: Callable[[Path], None]) -> Path:
    """TARGET as WRITE fills it, unless it already holds what DIGEST (its inputs' digest) says:
    written into a staging folder beside it and renamed into place whole, so a node never sees
    a half-written repo and an interrupted write leaves the old one."""
    marker = target / ".sparklab-inputs"
    if marker.is_file() and marker.read_text().strip() == digest:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(staging)
        (staging / ".sparklab-inputs").write_text(digest + "\n")
        staging.chmod(0o755)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
