"""The node-side model manifest, health probe and server control, run in-process (see
nodescript.py) against a fake HF cache, a tiny HTTP server and real child processes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nodescript import closed_port, http_server, run_node_script

COMMIT = "0123456789abcdef0123456789abcdef01234567"
CONFIG = b'{"architectures": ["LlamaForCausalLM"]}\n'


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def hf_repo(hub: Path, repo: str, files: dict[str, bytes], *, ref: str | None = "main",
            commit: str = COMMIT) -> Path:
    """The HF hub layout: blobs/<sha>, snapshots/<commit>/<name> -> ../../blobs/<sha>, refs/<ref>."""
    full = hub / ("models--" + repo.replace("/", "--"))
    blobs, snap = full / "blobs", full / "snapshots" / commit
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for name, data in files.items():
        (blobs / sha(data)).write_bytes(data)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blobs / sha(data), link.parent))
    if ref:
        (full / "refs").mkdir()
        (full / "refs" / ref).write_text(commit + "\n")
    return full


def manifest(request: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    ran = run_node_script("manifest.py", [json.dumps(request)], monkeypatch)
    assert ran.code is None, ran.stderr
    return ran.json  # type: ignore[no-any-return]


def test_manifest_of_a_hub_repository_by_ref(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = tmp_path / "hub"
    weights = b"w" * 4096
    full = hf_repo(hub, "org/model", {"config.json": CONFIG, "sub/model.safetensors": weights})
    big = full / "blobs" / "big"
    with open(big, "wb") as handle:  # over 1 MiB: listed with its size, not checksummed
        handle.truncate(1048577)
    (full / "snapshots" / COMMIT / "big.bin").symlink_to("../../blobs/big")

    out = manifest({"hub": str(hub), "repos": [{"repo": "org/model", "revision": "main"}]}, monkeypatch)

    entry = out["org/model"]
    assert entry["present"] is True and entry["commit"] == COMMIT and entry["root"] == str(hub)
    assert entry["files"] == {"config.json": [len(CONFIG), sha(CONFIG)],
                              "sub/model.safetensors": [4096, sha(weights)],
                              "big.bin": [1048577, None]}
    assert entry["paths"] == [f"models--org--model/snapshots/{COMMIT}", "models--org--model/refs/main"]
    assert entry["blobs"] == {f"models--org--model/blobs/{sha(CONFIG)}": len(CONFIG),
                              f"models--org--model/blobs/{sha(weights)}": 4096,
                              "models--org--model/blobs/big": 1048577}
    assert entry["bytes"] == len(CONFIG) + 4096 + 1048577
    assert "error" not in entry


def test_manifest_by_commit_without_refs_and_missing_repos(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    hub = tmp_path / "hub"
    hf_repo(hub, "org/pinned", {"config.json": CONFIG}, ref=None)
    hf_repo(hub, "org/noconfig", {"tokenizer.json": b"{}"})

    out = manifest({"hub": str(hub), "repos": [
        {"repo": "org/pinned", "revision": COMMIT},
        {"repo": "org/absent", "revision": "main"},
        {"repo": "org/noconfig", "revision": "main"},
    ]}, monkeypatch)

    assert out["org/pinned"]["present"] is True
    assert out["org/pinned"]["paths"] == [f"models--org--pinned/snapshots/{COMMIT}"]  # no ref to copy
    assert out["org/absent"] == {"present": False, "commit": None, "files": {}, "root": str(hub),
                                 "paths": [], "blobs": {}, "bytes": 0}
    assert out["org/noconfig"]["present"] is False  # files, but no config.json
    assert list(out["org/noconfig"]["files"]) == ["tokenizer.json"]


def test_an_incomplete_download_is_not_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = tmp_path / "hub"
    full = hf_repo(hub, "org/model", {"config.json": CONFIG})
    (full / "blobs" / "abc.incomplete").write_bytes(b"half")

    entry = manifest({"hub": str(hub), "repos": [{"repo": "org/model", "revision": "main"}]},
                     monkeypatch)["org/model"]

    assert entry["present"] is False
    assert entry["commit"] == COMMIT and "config.json" in entry["files"]


def test_a_broken_snapshot_link_is_reported_as_an_error(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    hub = tmp_path / "hub"
    full = hf_repo(hub, "org/model", {"config.json": CONFIG})
    (full / "snapshots" / COMMIT / "gone.bin").symlink_to("../../blobs/nothing-here")

    entry = manifest({"hub": str(hub), "repos": [{"repo": "org/model", "revision": "main"}]},
                     monkeypatch)["org/model"]

    assert "gone.bin" in entry["error"]
    assert entry["present"] is False


def test_manifest_of_a_local_dir_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local = tmp_path / "models" / "my-model"
    (local / "sub").mkdir(parents=True)
    (local / "config.json").write_bytes(CONFIG)
    (local / "sub" / "w.bin").write_bytes(b"12345")
    meta = local / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True)
    (meta / "config.json.metadata").write_text(f"{COMMIT}\netag\n")
    (meta / "config.json.lock").write_text("")
    empty = tmp_path / "models" / "empty"
    empty.mkdir()

    out = manifest({"hub": str(tmp_path / "hub"), "repos": [
        {"repo": "org/my-model", "revision": "main", "dir": str(local)},
        {"repo": "org/empty", "revision": "main", "dir": str(empty)},
        {"repo": "org/nowhere", "revision": "main", "dir": str(tmp_path / "models" / "nowhere")},
    ]}, monkeypatch)

    entry = out["org/my-model"]
    assert entry["present"] is True and entry["commit"] == COMMIT
    assert entry["files"] == {"config.json": [len(CONFIG), sha(CONFIG)], "sub/w.bin": [5, sha(b"12345")]}
    assert entry["root"] == str(tmp_path / "models") and entry["paths"] == ["my-model"]
    assert entry["bytes"] == len(CONFIG) + 5
    assert out["org/empty"]["present"] is False and out["org/empty"]["commit"] is None
    assert out["org/nowhere"]["present"] is False and out["org/nowhere"]["files"] == {}
    assert out["org/nowhere"]["paths"] == ["nowhere"]


# --- probe.py -------------------------------------------------------------------------------

def probe(server: dict[str, Any] | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    record = tmp_path / f"server-{len(list(tmp_path.iterdir()))}.json"
    if server is not None:
        record.write_text(json.dumps(server))
    ran = run_node_script("probe.py", [str(record)], monkeypatch)
    assert ran.code in (None, 0)
    return ran.json  # type: ignore[no-any-return]


def test_probe_reports_both_health_endpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with http_server({"/health": (200, "ok"), "/health_generate": (200, "ok")}) as (port, seen):
        out = probe({"host": "0.0.0.0", "port": port}, tmp_path, monkeypatch)
    assert out == {"/health": 200, "/health_generate": 200}
    assert [path for _, path, _ in seen] == ["/health", "/health_generate"]


def test_probe_stops_at_the_first_unhealthy_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with http_server({"/health": (503, "loading")}) as (port, seen):
        out = probe({"host": "localhost", "port": port}, tmp_path, monkeypatch)
    assert out == {"/health": 503}
    assert len(seen) == 1

    with http_server({"/health": (200, "ok"), "/health_generate": (500, "boom")}) as (port, _):
        out = probe({"host": "127.0.0.1", "port": port}, tmp_path, monkeypatch)
    assert out == {"/health": 200, "/health_generate": 500}


def test_probe_without_a_server_or_a_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = probe({"port": closed_port()}, tmp_path, monkeypatch)
    assert list(out) == ["/health"] and "refused" in out["/health"].lower()

    out = probe(None, tmp_path, monkeypatch)
    assert out["error"].startswith("no server record:")


# --- serverctl.py ---------------------------------------------------------------------------

def serverctl(args: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    ran = run_node_script("serverctl.py", [json.dumps(args)], monkeypatch)
    assert ran.code is None, ran.stderr
    return ran.json  # type: ignore[no-any-return]


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)


def spawn(processes: list[subprocess.Popen[bytes]], script: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    processes.append(proc)
    for _ in range(100):  # until the exec happened (the command line names the marker)
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        if b"sleep" in cmdline and b"bash" not in cmdline:
            break
        time.sleep(0.02)
    return proc


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def test_status_reads_pid_files_and_checks_whose_they_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          processes: list[subprocess.Popen[bytes]]) -> None:
    ours = spawn(processes, "exec -a mpirun sleep 30")
    stranger = spawn(processes, "exec sleep 30")  # alive, but not a server process (a reused PID)
    run = tmp_path / "run"
    run.mkdir()
    (run / "mpirun.pid").write_text(f"{ours.pid}\n")
    (run / "rank-1.pid").write_text(f"{stranger.pid}\n")
    (run / "broken.pid").write_text("not a pid\n")
    (run / "server.log").write_text("log\n")

    out = serverctl({"action": "status", "run": str(run)}, monkeypatch)

    assert out["action"] == "status"
    assert out["pids"] == {"mpirun.pid": {"pid": ours.pid, "alive": True},
                           "rank-1.pid": {"pid": stranger.pid, "alive": False}}
    assert out["server"] is None and "health" not in out

    ours.kill()
    ours.wait(5)
    out = serverctl({"action": "status", "run": str(run / "missing")}, monkeypatch)
    assert out["pids"] == {}


def test_deep_status_and_chat_over_http(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "server.json").write_text(json.dumps({"model": "m", "port": 1}))
    reply = json.dumps({"choices": [{"message": {"content": "hi"}}]})
    routes: dict[str, Any] = {
        "/health": (200, ""), "/health_generate": (200, ""),
        "/v1/models": (200, json.dumps({"data": [{"id": "org/model"}]})),
        "/v1/chat/completions":
            lambda body: (200, reply) if json.loads(body)["model"] == "m" else (400, "no"),
    }
    with http_server(routes) as (port, seen):
        out = serverctl({"action": "chat", "run": str(run), "port": port, "deep": True,
                         "request": {"model": "m", "messages": []}}, monkeypatch)

    assert out["server"] == {"model": "m", "port": 1}
    assert out["health"] == 200 and out["health_generate"] == 200 and out["models"] == ["org/model"]
    assert out["code"] == 200 and json.loads(out["body"]) == json.loads(reply)
    assert out["seconds"] >= 0
    assert ("POST", "/v1/chat/completions", b'{"model": "m", "messages": []}') in seen


def test_status_of_an_unhealthy_or_absent_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "server.json").write_text("{not json")
    with http_server({"/health": (503, "loading")}) as (port, seen):
        out = serverctl({"action": "status", "run": str(run), "port": port, "deep": True}, monkeypatch)
    assert out["server"] is None
    assert out["health"] == 503 and "health_generate" not in out and len(seen) == 1

    routes = {"/health": (200, ""), "/health_generate": (200, ""), "/v1/models": (500, "x")}
    with http_server(routes) as (port, _):
        out = serverctl({"action": "status", "run": str(run), "port": port, "deep": True}, monkeypatch)
    assert out["models"] == []

    out = serverctl({"action": "chat", "run": str(run), "port": closed_port(), "request": {}}, monkeypatch)
    assert out["health"] == 0 and out["code"] == 0 and "refused" in out["body"].lower()


def test_stop_kills_the_server_and_its_children_and_rotates_logs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, processes: list[subprocess.Popen[bytes]]) -> None:
    server = spawn(processes, "sleep 30 & exec -a mpirun sleep 30")  # the sleep & is its child
    kids = [int(p) for p in Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()]
    assert len(kids) == 1
    run = tmp_path / "run"
    run.mkdir()
    (run / "mpirun.pid").write_text(f"{server.pid}\n")
    (run / "server.log").write_text("old\n")
    (run / "server.json").write_text("{}")

    out = serverctl({"action": "stop", "run": str(run), "grace": 5, "rotate": True}, monkeypatch)

    assert out["stopped"] == ["mpirun.pid"] and out["killed"] == 0 and out["left"] == []
    assert server.wait(5) == -15
    assert gone(kids[0])
    assert sorted(p.name for p in run.iterdir()) == ["server.json", "server.log.1"]
    assert (run / "server.log.1").read_text() == "old\n"


def test_stop_kills_what_ignores_sigterm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         processes: list[subprocess.Popen[bytes]]) -> None:
    stubborn = spawn(processes, "trap '' TERM; exec -a trtllm-serve sleep 30")
    stranger = spawn(processes, "exec sleep 30")
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank-0.pid").write_text(f"{stubborn.pid}\n")
    (run / "other.pid").write_text(f"{stranger.pid}\n")
    (run / "server.log").write_text("kept\n")

    out = serverctl({"action": "stop", "run": str(run), "grace": 0.5}, monkeypatch)

    assert out["stopped"] == ["rank-0.pid"] and out["killed"] == 1 and out["left"] == []
    assert stubborn.wait(5) == -9
    assert stranger.poll() is None  # not ours: left alone, but its stale pid file goes
    assert sorted(p.name for p in run.iterdir()) == ["server.log"]  # no rotation asked


def test_started_records_the_server_with_the_launcher_pid(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, processes: list[subprocess.Popen[bytes]]) -> None:
    launcher = spawn(processes, "exec -a mpirun sleep 30")
    run = tmp_path / "run"
    run.mkdir()
    (run / "mpirun.pid").write_text(f"{launcher.pid}\n")
    (run / "server.log").write_text("x" * 5000)

    out = serverctl({"action": "started", "run": str(run), "settle": 0,
                     "server": {"model": "m", "port": 8355}}, monkeypatch)

    assert out["pid"] == launcher.pid and out["alive"] is True
    assert out["log"] == "x" * 3000
    assert json.loads((run / "server.json").read_text()) == {"model": "m", "port": 8355,
                                                             "mpirun_pid": launcher.pid}
    assert not (run / "server.json.tmp").exists()

    launcher.kill()
    launcher.wait(5)
    (run / "server.log").unlink()
    out = serverctl({"action": "started", "run": str(run), "settle": 0, "server": {}}, monkeypatch)
    assert out["alive"] is False and out["log"] == ""
