"""The simulated `vllm serve` asks the real vLLM 0.31.0 (vllm_verdict.py, vllm_argcheck.py).

The tests marked slow run the real vLLM's parser (~7 s of CPU each) from the machine's install
(`make vllm`); without it they skip, and the others still check the glue with a stand-in.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

IMAGE = Path(__file__).resolve().parents[2] / "lab" / "sparklab" / "image"
sys.path.insert(0, str(IMAGE))

from sparklab_engine import vllm_cli, vllm_verdict  # noqa: E402

REAL_VENV = Path("/var/lib/sparklab/cache/vllm/0.31.0/root/usr/lib/sparklab/vllm")
needs_real_vllm = pytest.mark.skipif(not (REAL_VENV / "bin" / "python").exists(),
                                     reason="the real vLLM is not installed (`make vllm`)")


@pytest.fixture
def verdicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPARKLAB_VLLM_VERDICTS", str(tmp_path / "verdicts"))
    return tmp_path / "verdicts"


@pytest.mark.slow
@needs_real_vllm
def test_what_the_real_vllm_refuses_the_simulator_refuses_in_its_words(
        verdicts: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SPARKLAB_VLLM_VENV", str(REAL_VENV))
    # the option table knows --compilation-config takes JSON; only the real CompilationConfig
    # knows which keys it has
    argv = ["serve", "/root/.cache/huggingface/hub/models--org--m/snapshots/abc", "-tp", "2",
            "--compilation-config", '{"mode": 2, "backend": "eager", "cudagraph_modes": 1}']
    assert vllm_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "vllm serve: error: argument --compilation-config/-cc: 1 validation error for " \
           "CompilationConfig" in err
    assert "cudagraph_modes\n  Unexpected keyword argument" in err
    [kept] = list(verdicts.iterdir())
    assert json.loads(kept.read_text())["code"] == 2


@pytest.mark.slow
@needs_real_vllm
def test_a_good_command_line_passes_and_its_verdict_is_kept_for_the_machine(
        verdicts: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SPARKLAB_VLLM_VENV", str(REAL_VENV))
    on_a = ["serve", "/root/.cache/huggingface/hub/models--org--m/snapshots/abc", "-tp", "2",
            "--max-model-len", "1024", "--compilation-config", '{"mode": 2, "backend": "eager"}']
    assert vllm_cli.ask_real_vllm(on_a) is None
    assert "own parser and EngineArgs accept the command line" in capsys.readouterr().err

    def no_vllm(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cached verdict must not import vLLM")

    monkeypatch.setattr(subprocess, "run", no_vllm)
    # the same command line on another node, whose HF cache is elsewhere: the same verdict
    on_b = [on_a[0], "/home/u/.cache/huggingface/hub/models--org--m/snapshots/abc", *on_a[2:]]
    verdict = vllm_verdict.ask(on_b, "0.31.0")
    assert verdict is not None and (verdict.code, verdict.cached) == (0, True)


def test_a_cached_refusal_is_answered_without_importing_vllm(
        verdicts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\nexit 99\n")
    (venv / "bin" / "python").chmod(0o755)
    monkeypatch.setenv("SPARKLAB_VLLM_VENV", str(venv))
    argv = ["serve", "org/m", "--enable-auto-tool-choice"]
    verdicts.mkdir()
    key = vllm_verdict.digest("0.31.0", argv)
    (verdicts / f"{key}.json").write_text(json.dumps(
        {"code": 1, "message": "TypeError: Error: --enable-auto-tool-choice requires "
                               "--tool-call-parser"}))
    assert vllm_cli.main(argv) == 1
    assert "requires --tool-call-parser" in capsys.readouterr().err
    # not cached: the stand-in interpreter says nothing usable, so the option table judges alone
    assert vllm_verdict.ask(["serve", "org/m", "--port", "8001"], "0.31.0") is None
    assert "the real vLLM's argument check failed" in capsys.readouterr().err


def test_without_the_real_vllm_the_option_table_checks_and_says_so(
        verdicts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SPARKLAB_VLLM_VENV", str(tmp_path / "none"))
    assert vllm_cli.main(["serve", "org/m", "--max-modle-len", "4"]) == 2
    err = capsys.readouterr().err
    assert "the real vLLM is not installed here: the option table alone checks" in err
    assert "unrecognized arguments: --max-modle-len" in err
    assert not verdicts.exists()


def test_only_a_path_model_is_made_node_independent() -> None:
    assert vllm_verdict.normalized(["serve", "org/m", "-tp", "2"]) == ["serve", "org/m", "-tp", "2"]
    assert vllm_verdict.normalized(["serve", "--model=/n/a/snap", "--port", "1"]) == [
        "serve", f"--model={vllm_verdict.MODEL_PLACEHOLDER}", "--port", "1"]
