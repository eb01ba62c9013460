"""The lab's simulated `vllm` and its `ray` wrapper (lab/sparklab/image), without Ray or root."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

IMAGE = Path(__file__).resolve().parents[2] / "lab" / "sparklab" / "image"
sys.path.insert(0, str(IMAGE))

from sparklab_engine import ray_cli, vllm_cli  # noqa: E402


def test_vllm_serve_rejects_what_vllms_parser_rejects(capsys: pytest.CaptureFixture[str]) -> None:
    assert vllm_cli.main(["serve", "org/m", "--max-modle-len", "4"]) == 2
    err = capsys.readouterr().err
    assert "vllm serve: error: unrecognized arguments: --max-modle-len" in err
    assert vllm_cli.main(["serve", "org/m", "--kv-cache-dtype", "fp9"]) == 2
    assert "argument --kv-cache-dtype" in capsys.readouterr().err
    assert vllm_cli.main(["bench"]) == 2


def test_vllm_serve_parses_the_flags_sparkctl_passes() -> None:
    opts = vllm_cli.parse(["org/m", "--tensor-parallel-size", "2", "--distributed-executor-backend",
                           "ray", "--gpu-memory-utilization", "0.85", "--host", "127.0.0.1",
                           "--port", "8001", "--max_model_len", "1024"], vllm_cli.option_table("vllm"))
    assert (opts["model"], opts["tp"], opts["backend"], opts["port"], opts["util"]) == (
        "org/m", 2, "ray", 8001, 0.85)


def test_tp_beyond_one_gpu_without_ray_fails_like_vllm(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = tmp_path / "hub" / "models--org--m" / "snapshots" / "main"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(vllm_cli, "_ray_running", lambda: False)
    assert vllm_cli.main(["serve", "org/m", "-tp", "2", "--distributed-executor-backend", "mp"]) == 1
    assert "World size (2) is larger than the number of available GPUs (1)" in capsys.readouterr().err


def test_ray_start_is_capped_for_the_lab(capsys: pytest.CaptureFixture[str]) -> None:
    args = ray_cli.lab_caps(["start", "--head", "--object-store-memory", "2000000000", "--block"])
    assert args[args.index("--object-store-memory") + 1] == str(ray_cli.DEFAULT_OBJECT_STORE)
    assert args[args.index("--num-cpus") + 1] == "1"
    assert "capped" in capsys.readouterr().err
    assert ray_cli.lab_caps(["status"]) == ["status"]


def test_vllm_serve_takes_abbreviations_as_argparse_does(capsys: pytest.CaptureFixture[str]) -> None:
    opts = vllm_cli.parse(["org/m", "--tensor-parallel", "2", "--distributed-exec", "mp",
                           "--gpu-memory-util=0.5"], vllm_cli.option_table("vllm"))
    assert (opts["tp"], opts["backend"], opts["util"]) == (2, "mp", 0.5)
    assert vllm_cli.main(["serve", "org/m", "--dist", "ray"]) == 2
    assert ("ambiguous option: --dist could match --distributed-executor-backend, "
            "--distributed-timeout-seconds") in capsys.readouterr().err


@pytest.mark.parametrize("handler", ["vllm", "sglang"])
def test_a_model_the_server_does_not_serve_is_a_404(handler: str) -> None:
    import json
    import urllib.error
    import urllib.request

    from sparklab_engine import sglang_http, vllm_http

    if handler == "vllm":
        server = vllm_http.start_vllm_http("org/m", "served-m", None, "127.0.0.1", 0)
    else:
        server = sglang_http.start_sglang_http({"model": "org/m", "served": "served-m", "tp": 1,
                                                "host": "127.0.0.1", "port": 0}, {})
    port = server.server_address[1]
    try:
        def ask(model: str | None) -> int:
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            if model:
                body["model"] = model
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                         json.dumps(body).encode(), {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    return int(r.status)
            except urllib.error.HTTPError as exc:
                assert "does not exist" in exc.read().decode()
                return int(exc.code)

        assert ask("other/model") == 404
        assert ask("served-m") == 200 and ask(None) == 200
    finally:
        server.shutdown_quietly()


def test_native_multinode_rank0_serves_and_headless_ranks_join(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's mp multi-node in the lab: rank 0 listens on --master-addr:--master-port, a headless
    rank joins from its NCCL interface, checks the model on its node, loads, answers steps, and
    ends when rank 0 shuts down."""
    import json
    import threading

    from sparklab_engine import vllm_mp

    snap = tmp_path / "hub" / "models--org--m" / "snapshots" / "main"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (tmp_path / "lab" / "config").mkdir(parents=True)
    (tmp_path / "lab" / "config" / "lab.json").write_text(json.dumps({"engine_load_seconds": 0.1}))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("SPARKLAB_LAB_DIR", str(tmp_path / "lab"))
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "lo")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    executor = vllm_mp.MpExecutor("org/m", 2, "127.0.0.1", port)
    ended: list[int] = []
    worker = threading.Thread(target=lambda: ended.append(vllm_mp.run_headless(1, "127.0.0.1", port)))
    worker.start()
    executor.start()
    executor.load()
    executor.step()
    assert executor.dead is None
    executor.shutdown()
    worker.join(timeout=30)
    assert ended == [0]


def test_native_multinode_refusals(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    snap = tmp_path / "hub" / "models--org--m" / "snapshots" / "main"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "lo")
    base = ["serve", "org/m", "--distributed-executor-backend", "mp", "--nnodes", "2"]
    assert vllm_cli.main([*base, "-tp", "4", "--node-rank", "0"]) == 1
    assert "World size (4) is larger than the number of available GPUs (1)" in capsys.readouterr().err
    assert vllm_cli.main([*base, "-tp", "2", "--node-rank", "1"]) == 1
    assert "start the ranks > 0 with --headless" in capsys.readouterr().err
