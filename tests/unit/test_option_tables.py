"""The extracted engine option tables, the checker over them, and the extraction script itself."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import textwrap
from pathlib import Path

import pytest

from orchestrator.engines.optiontable import OptionTable, load_table

ROOT = Path(__file__).resolve().parents[2]
ENGINES = ROOT / "orchestrator" / "engines"
PINNED = {"vllm": "0.31.0", "sglang": "0.5.12", "trtllm": "1.3.0rc13"}


def _extractor():
    path = ROOT / "scripts" / "extract-engine-options"
    loader = importlib.machinery.SourceFileLoader("extract_engine_options", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _present(engine: str) -> bool:
    return (ENGINES / engine / "options.json").exists()


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_table_carries_provenance(engine: str) -> None:
    if not _present(engine):
        pytest.skip(f"no {engine} table extracted yet (see docs/option-tables.md)")
    prov = json.loads((ENGINES / engine / "options.json").read_text())["provenance"]
    assert prov["version"] == PINNED[engine]
    assert prov["script"] == "scripts/extract-engine-options"
    assert prov["files"] and all(len(sha) == 64 for sha in prov["files"].values())
    assert "package" in prov or "source" in prov


# ---------------------------------------------------------------- vLLM

def test_vllm_flags() -> None:
    t = load_table("vllm")
    assert t.label == "vLLM 0.31.0"
    ok = ["serve", "m", "--tensor-parallel-size", "2", "-pp", "1", "--distributed-executor-backend=ray",
          "--gpu-memory-utilization", "0.8", "--host", "0.0.0.0", "--port=8000", "--enforce-eager",
          "--no-enable-prefix-caching", "--max_model_len", "4096"]
    assert t.check_flags(ok) == []
    [unknown] = t.check_flags(["--tensor-paralel-size", "2"])
    assert unknown.suggestion == "--tensor-parallel-size" and "vLLM 0.31.0" in str(unknown)
    [choice] = t.check_flags(["--distributed-executor-backend", "slurm"])
    assert "not one of" in choice.message
    [bad_int] = t.check_flags(["--port", "eighty"])
    assert "integer" in bad_int.message
    [missing] = t.check_flags(["--port"])
    assert missing.message == "needs a value"
    assert t.check_flags(["--tensor-parallel", "2", "--max_model", "4096", "--no-enable-prefix"]) == []
    assert t.canonical("--no-enable-prefix") == "--enable-prefix-caching"
    assert "could match --distributed-executor-backend, --distributed-timeout-seconds" in \
        t.check_flags(["--dist", "ray"])[0].message


def test_click_has_no_abbreviations() -> None:
    if not _present("trtllm"):
        pytest.skip("no trtllm table")
    assert load_table("trtllm").check_flags(["--tensor_parallel", "2"])[0].message == "unknown option"


# ---------------------------------------------------------------- SGLang

def test_sglang_flags() -> None:
    t = load_table("sglang")
    ok = ["--model-path", "m", "--tp-size", "2", "--nnodes", "2", "--node-rank=1",
          "--dist-init-addr", "10.0.0.1:5000", "--speculative-algorithm", "EAGLE",
          "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--mem-fraction-static", "0.8",
          "--enable-metrics"]
    assert t.check_flags(ok) == []
    [stored] = t.check_flags(["--enable-metrics=1"])
    assert stored.message == "takes no value"
    [choice] = t.check_flags(["--dtype", "fp64"])
    assert "not one of" in choice.message
    [unknown] = t.check_flags(["--mem-fractoin-static", "0.8"])
    assert unknown.suggestion == "--mem-fraction-static"
    # argparse's unique abbreviations are the option itself; an ambiguous one names its candidates
    assert t.check_flags(["--tp", "1", "--mem-fraction", "0.8", "--trust-remote"]) == []
    assert t.canonical("--tp") == "--tensor-parallel-size"
    [ambiguous] = t.check_flags(["--pp", "2"])
    assert ambiguous.message == ("ambiguous option: could match --pp-async-batch-depth, "
                                 "--pp-max-micro-batch-size, --pp-size")
    # underscores are not dashes to SGLang's plain argparse
    assert t.check_flags(["--tp_size", "2"])[0].message == "unknown option"


# ---------------------------------------------------------------- TensorRT-LLM (audit facts)

trtllm = pytest.mark.skipif(not _present("trtllm"), reason="TensorRT-LLM sources at the pin not extracted")

REJECTED = [
    {"use_cuda_graph": True}, {"enable_trtllm_sampler": True}, {"enable_mixed_sampler": True},
    {"enable_prompt_adapter": True}, {"max_prompt_adapter_token": 8}, {"calib_config": {}},
    {"kv_cache_dtype": "fp8"}, {"speculative_model": "x"}, {"allow_advanced_sampling": True},
    {"speculative_config": {"decoding_type": "Eagle3", "pytorch_weights_path": "x"}},
]
ACCEPTED = [
    {"attention_dp_config": {}}, {"nvfp4_gemm_config": {}}, {"env_overrides": {}},
    {"kv_cache_config": {"use_kv_cache_manager_v2": True}},
    # at 1.3.0rc13 allow_advanced_sampling is a speculative-config field (DecodingBaseConfig)
    {"speculative_config": {"decoding_type": "MTP", "allow_advanced_sampling": True}},
    {"speculative_config": {"decoding_type": "PARD"}},
    {"speculative_config": {"decoding_type": "NGram", "max_draft_len": 2, "allow_advanced_sampling": 1}},
    {"kv_cache_config": {"enable_block_reuse": 0}},
]


@trtllm
@pytest.mark.parametrize("mapping", REJECTED, ids=lambda m: next(iter(m)))
def test_trtllm_rejects(mapping: dict) -> None:
    problems = load_table("trtllm").check_llm_args(mapping)
    assert problems and "TensorRT-LLM 1.3.0rc13" in str(problems[0])


@trtllm
@pytest.mark.parametrize("mapping", ACCEPTED, ids=lambda m: json.dumps(m))
def test_trtllm_accepts(mapping: dict) -> None:
    assert load_table("trtllm").check_llm_args(mapping) == []


@trtllm
def test_trtllm_serve_flags() -> None:
    t = load_table("trtllm")
    assert t.check_flags(["--tensor_parallel_size", "2", "--free_gpu_memory_fraction", "0.9"]) == []
    assert t.check_flags(["--tp_size", "2", "--kv_cache_dtype", "fp8", "--trust_remote_code",
                          "--no-telemetry", "--backend", "pytorch"]) == []
    assert t.check_flags(["--disable_log_stats"])[0].message == "unknown option"
    assert "not one of" in t.check_flags(["--kv_cache_dtype", "int4"])[0].message
    assert "integer" in t.check_flags(["--tp_size", "two"])[0].message


@trtllm
@pytest.mark.parametrize(("key", "replacement"), [("use_cuda_graph", "cuda_graph_config"),
                                                  ("enable_trtllm_sampler", "sampler_type"),
                                                  ("kv_cache_dtype", "kv_cache_config")])
def test_trtllm_removed_keys_name_their_replacement(key: str, replacement: str) -> None:
    [problem] = load_table("trtllm").check_llm_args({key: True})
    assert problem.key == key and problem.suggestion == replacement
    assert f"use {replacement}" in str(problem) and "TensorRT-LLM 1.3.0rc13" in str(problem)


@trtllm
def test_trtllm_rc13_contract_details() -> None:
    t = load_table("trtllm")
    # Draft_Target is rc13's spelling; the old DraftTarget is refused with the new one suggested
    [old] = t.check_llm_args({"speculative_config": {"decoding_type": "DraftTarget"}})
    assert old.suggestion == "Draft_Target"
    assert t.check_llm_args({"speculative_config": {"decoding_type": "Draft_Target", "max_draft_len": 4,
                                                    "speculative_model_dir": "/d"}}) == []
    # ge/le bounds, the sparse-attention union's own tag, enum values
    assert "<= 1" in str(t.check_llm_args({"kv_cache_config": {"free_gpu_memory_fraction": 1.5}})[0])
    assert t.check_llm_args({"sparse_attention_config": {"algorithm": "dsa"}}) == []
    assert t.check_llm_args({"sparse_attention_config": {"algorithm": "x"}})[0].key == \
        "sparse_attention_config.algorithm"
    assert t.check_llm_args({"scheduler_config": {"capacity_scheduler_policy": "MAX_UTILIZATION"}}) == []
    assert t.check_llm_args({"scheduler_config": {"capacity_scheduler_policy": "FAST"}})
    # a plain alias replaces the field's name (populate_by_name is off)
    assert t.check_llm_args({"_mpi_session": None}) == []
    assert t.check_llm_args({"mpi_session": None})


def test_transcription_in_the_repo_regenerates_the_table(tmp_path: Path) -> None:
    """The committed table is exactly what the extractor makes of the committed transcription."""
    committed = json.loads((ENGINES / "trtllm" / "options.json").read_text())
    out = tmp_path / "t.json"
    _extractor().main(["--engine", "trtllm", "--version", "1.3.0rc13", "--transcribed",
                       str(ROOT / "scripts/engine-sources/tensorrt-llm-1.3.0rc13/options-transcribed.json"),
                       "--output", str(out), "--date", committed["provenance"]["extracted_at"]])
    assert json.loads(out.read_text()) == committed
    prov = committed["provenance"]["transcription"]
    assert prov["repository"] == "NVIDIA/TensorRT-LLM" and len(prov["commit"]) == 40
    assert prov["pages"] and prov["method"]


def test_transcription_that_contradicts_itself_is_refused(tmp_path: Path) -> None:
    data = json.loads((ROOT / "scripts/engine-sources/tensorrt-llm-1.3.0rc13/"
                       "options-transcribed.json").read_text())
    data["classes"]["AttentionDpConfig"]["accepted_keys_resolved"].append("enable_magic")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="AttentionDpConfig"):
        _extractor().main(["--engine", "trtllm", "--version", "x", "--transcribed", str(bad),
                           "--output", str(tmp_path / "o.json")])


# ---------------------------------------------------------------- checker on a small table

def test_llm_args_checks_on_a_synthetic_table() -> None:
    models = {
        "Root": {"forbid_extra": True, "fields": {
            "flag": {"kind": "bool", "default": False},
            "mode": {"kind": "literal", "literals": ["a", "b"], "default": "a"},
            "spec": {"kind": "str", "refs": ["Eagle", "Ngram"], "optional": True, "default": None}}},
        "Eagle": {"forbid_extra": True, "fields": {
            "decoding_type": {"kind": "literal", "literals": ["Eagle"]},
            "max_draft_len": {"kind": "int", "default": None}}},
        "Ngram": {"forbid_extra": True, "fields": {
            "decoding_type": {"kind": "literal", "literals": ["NGram"]}}},
    }
    t = OptionTable("Fake", "1.0", {}, models, "Root")
    good = {"flag": 0, "mode": "b", "spec": {"decoding_type": "Eagle", "max_draft_len": 3}}
    assert t.check_llm_args(good) == []
    assert t.check_llm_args({"flag": 2})[0].message.endswith("valid bool")
    assert t.check_llm_args({"flg": True})[0].suggestion == "flag"
    assert t.check_llm_args({"mode": "c"})[0].key == "mode"
    [p] = t.check_llm_args({"spec": {"decoding_type": "NGram", "max_draft_len": 3}})
    assert p.key == "spec.max_draft_len" and "Fake 1.0" in str(p)
    assert t.check_llm_args({"spec": {"decoding_type": "Eagl"}})[0].suggestion == "Eagle"


# ---------------------------------------------------------------- the extraction script

def test_extracts_pydantic_models_and_click_options(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "tensorrt_llm" / "llmapi").mkdir(parents=True)
    (src / "tensorrt_llm" / "commands").mkdir(parents=True)
    (src / "tensorrt_llm" / "llmapi" / "llm_args.py").write_text(textwrap.dedent('''
        from typing import Literal, Optional, Union
        from pydantic import BaseModel, Field
        class StrictBaseModel(BaseModel):
            model_config = ConfigDict(extra="forbid")
        class EagleConfig(StrictBaseModel):
            decoding_type: Literal["Eagle"] = "Eagle"
            max_draft_len: Optional[int] = None
        class KvCacheConfig(StrictBaseModel):
            enable_block_reuse: bool = Field(default=True, description="x")
            dtype: str = "auto"
        SpeculativeConfig = Union[EagleConfig, None]
        class BaseLlmArgs(StrictBaseModel):
            tensor_parallel_size: int = Field(default=1, alias="tp_size")
            kv_cache_config: KvCacheConfig = Field(default_factory=KvCacheConfig)
        class TorchLlmArgs(BaseLlmArgs):
            speculative_config: SpeculativeConfig = None
            backend: Literal["pytorch", "_autodeploy"] = "pytorch"
        class Loose(BaseModel):
            anything: int = 0
    '''))
    (src / "tensorrt_llm" / "commands" / "serve.py").write_text(textwrap.dedent('''
        import click
        @click.command("serve")
        @click.option("--tp_size", "--tensor_parallel_size", type=int, default=1)
        @click.option("--backend", type=click.Choice(["pytorch", "trt"]), default="pytorch")
        @click.option("--trust_remote_code", is_flag=True, default=False)
        def serve(tp_size, backend, trust_remote_code):
            pass
    '''))
    out = tmp_path / "t.json"
    _extractor().main(["--engine", "trtllm", "--version", "9.9", "--source", str(src),
                       "--source-ref", "fake@0000", "--output", str(out), "--date", "2026-01-01"])
    data = json.loads(out.read_text())
    assert data["provenance"]["source"] == "fake@0000" and data["root_model"] == "TorchLlmArgs"
    models = data["llm_args"]
    assert models["TorchLlmArgs"]["forbid_extra"] and not models["Loose"]["forbid_extra"]
    fields = models["TorchLlmArgs"]["fields"]
    assert fields["tensor_parallel_size"]["aliases"] == ["tp_size"]
    assert fields["backend"]["literals"] == ["pytorch", "_autodeploy"]
    assert fields["speculative_config"]["refs"] == ["EagleConfig"]
    assert fields["kv_cache_config"]["refs"] == ["KvCacheConfig"]
    assert data["serve_flags"]["--tp_size"]["aliases"] == ["--tensor_parallel_size"]
    assert data["serve_flags"]["--backend"]["choices"] == ["pytorch", "trt"]
    assert data["serve_flags"]["--trust_remote_code"]["kind"] == "store_true"
    t = load_table("trtllm", out)
    assert t.check_llm_args({"tp_size": 2, "kv_cache_config": {"enable_block_reuse": 0}}) == []
    assert t.check_llm_args({"kv_cache_config": {"dtyp": "fp8"}})[0].suggestion == "dtype"


def test_extracts_argparse_server_args(tmp_path: Path) -> None:
    pkg = tmp_path / "sglang" / "srt"
    pkg.mkdir(parents=True)
    (pkg / "server_args.py").write_text(textwrap.dedent('''
        import argparse, dataclasses
        ALGOS = ["EAGLE", "NEXTN"]
        @dataclasses.dataclass
        class ServerArgs:
            tp_size: int = 1
            speculative_algorithm: str = None
            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--tensor-parallel-size", "--tp-size", type=int,
                                    default=ServerArgs.tp_size)
                parser.add_argument("--speculative-algorithm", type=str, choices=ALGOS + ["EAGLE3"])
                parser.add_argument("--enable-metrics", action="store_true")
    '''))
    out = tmp_path / "s.json"
    _extractor().main(["--engine", "sglang", "--version", "0.0.1", "--source", str(tmp_path),
                       "--output", str(out)])
    flags = json.loads(out.read_text())["serve_flags"]
    assert flags["--tensor-parallel-size"] == {"aliases": ["--tp-size"], "choices": None, "default": 1,
                                               "kind": "int"}
    assert flags["--speculative-algorithm"]["choices"] == ["EAGLE", "NEXTN", "EAGLE3"]
    assert flags["--enable-metrics"]["kind"] == "store_true"
