"""The node-side model manifest (node/fanout.py `manifest`, its code in fanout_manifest.py), the
health probe and server control, run in-process (see nodescript.py) against a fake HF cache, a
tiny HTTP server and real child processes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from nodescript import closed_port, http_server, run_node_script

from orchestrator.engines.trtllm.serve import OURS
from orchestrator.node import fanout_manifest

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
    """node/fanout.py's `manifest` mode (its manifest code is node/fanout_manifest.py)."""
    ran = run_node_script("fanout.py", ["manifest", json.dumps(request)], monkeypatch)
    assert ran.code == 0, ran.stderr
    return ran.json  # type: ignore[no-any-return]


def chunked(data: bytes, size: int) -> list[str]:
    return [sha(data[i:i + size]) for i in range(0, len(data), size)] or [sha(b"")]


def test_manifest_of_a_hub_repository_by_ref(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = tmp_path / "hub"
    weights = os.urandom(2500)
    full = hf_repo(hub, "org/model", {"config.json": CONFIG, "sub/model.safetensors": weights})
    folder = "models--org--model"
    request = {"hub": str(hub), "chunks": True, "chunk": 1024,
               "repos": [{"repo": "org/model", "revision": "main"}]}

    entry = manifest(request, monkeypatch)["org/model"]

    assert entry["present"] is True and entry["commit"] == COMMIT and "error" not in entry
    assert entry["root"] == str(hub) and entry["folder"] == folder and entry["partial"] == []
    blob_c, blob_w = f"{folder}/blobs/{sha(CONFIG)}", f"{folder}/blobs/{sha(weights)}"
    assert entry["files"] == {"config.json": blob_c, "sub/model.safetensors": blob_w}
    assert entry["blobs"] == {
        blob_c: {"size": len(CONFIG), "sha256": sha(CONFIG), "chunks": [sha(CONFIG)]},
        blob_w: {"size": 2500, "sha256": sha(weights), "chunks": chunked(weights, 1024)}}
    assert len(entry["blobs"][blob_w]["chunks"]) == 3 and entry["chunk"] == 1024
    # what the peer must recreate besides the blobs: the snapshot links as they are, the ref
    assert entry["links"] == {f"{folder}/snapshots/{COMMIT}/config.json": f"../../blobs/{sha(CONFIG)}",
                              f"{folder}/snapshots/{COMMIT}/sub/model.safetensors":
                                  f"../../../blobs/{sha(weights)}"}
    assert entry["refs"] == {f"{folder}/refs/main": COMMIT}
    assert entry["bytes"] == len(CONFIG) + 2500 and entry["free"] > 0

    # hashed once, cached beside the model (outside HF's layout); a cached hash is used while
    # the file's size, mtime and inode hold, and without chunks when none are asked for
    cache = full / ".sparkctl" / "hashes.json"
    saved = json.loads(cache.read_text())
    assert saved[blob_w]["sha256"] == sha(weights) and saved[blob_w]["chunk"] == 1024
    saved[blob_w]["sha256"] = "from-the-cache"
    cache.write_text(json.dumps(saved))
    again = manifest(dict(request, chunks=False), monkeypatch)["org/model"]
    assert again["blobs"][blob_w] == {"size": 2500, "sha256": "from-the-cache"}
    os.utime(full / "blobs" / sha(weights), ns=(1, 1))  # touched: hashed again
    assert manifest(request, monkeypatch)["org/model"]["blobs"][blob_w]["sha256"] == sha(weights)


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

    assert out["org/pinned"]["present"] is True and out["org/pinned"]["commit"] == COMMIT
    assert out["org/pinned"]["refs"] == {}  # no ref to copy
    assert list(out["org/pinned"]["links"]) == [f"models--org--pinned/snapshots/{COMMIT}/config.json"]
    absent = dict(out["org/absent"])
    assert absent.pop("free") > 0  # (of the disk the hub would be on, for the space check)
    assert absent == {"present": False, "commit": None, "root": str(hub),
                      "folder": "models--org--absent", "files": {}, "blobs": {}, "links": {},
                      "refs": {}, "partial": [], "bytes": 0}
    assert not (hub / "models--org--absent").exists()  # no cache written for nothing
    assert out["org/noconfig"]["present"] is False  # files, but no config.json
    assert list(out["org/noconfig"]["files"]) == ["tokenizer.json"]


def test_an_incomplete_download_is_not_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = tmp_path / "hub"
    full = hf_repo(hub, "org/model", {"config.json": CONFIG})
    hf_repo(hub, "org/resumed", {"config.json": CONFIG})
    (full / "blobs" / "abc.incomplete").write_bytes(b"half")  # hf download, interrupted
    (hub / "models--org--resumed" / "blobs" / "def.sparkctl-part").write_bytes(b"half")  # a fan-out

    out = manifest({"hub": str(hub), "repos": [{"repo": "org/model", "revision": "main"},
                                               {"repo": "org/resumed", "revision": "main"}]},
                   monkeypatch)

    entry = out["org/model"]
    assert entry["present"] is False and entry["partial"] == ["abc.incomplete"]
    assert entry["commit"] == COMMIT and "config.json" in entry["files"]
    assert out["org/resumed"]["present"] is False
    assert out["org/resumed"]["partial"] == ["def.sparkctl-part"]


def test_a_broken_snapshot_link_is_reported_as_an_error(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    hub = tmp_path / "hub"
    full = hf_repo(hub, "org/model", {"config.json": CONFIG})
    (full / "snapshots" / COMMIT / "gone.bin").symlink_to("../../blobs/nothing-here")

    entry = manifest({"hub": str(hub), "repos": [{"repo": "org/model", "revision": "main"}]},
                     monkeypatch)["org/model"]

    # not present, so launch downloads it again (hf replaces the dangling link)
    assert "gone.bin" in entry["error"] and entry["present"] is False
    assert list(entry["files"]) == ["config.json"] and entry["bytes"] == len(CONFIG)


def test_a_file_that_cannot_be_read_is_an_error_not_a_crash(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    hub = tmp_path / "hub"
    hf_repo(hub, "org/model", {"config.json": CONFIG, "w.bin": b"12345"})

    def unreadable(path: str, chunk: int = 0) -> tuple[str, list[str]]:
        if path.endswith(sha(b"12345")):
            raise OSError(5, "Input/output error", path)
        return sha(Path(path).read_bytes()), []

    monkeypatch.setattr(fanout_manifest, "hash_file", unreadable)
    entry = fanout_manifest.manifest({"hub": str(hub), "repos": [{"repo": "org/model",
                                                                  "revision": "main"}]})["org/model"]

    assert "Input/output error" in entry["error"] and entry["present"] is False
    json.dumps(entry)  # still a manifest the controller can read


def test_manifest_reads_a_hub_under_a_users_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launch's models fact runs the manifest with the node's python3 on the host, where the
    cache is `~USER/.cache/huggingface/hub` (expanded there, never by the controller)."""
    hub = tmp_path / ".cache" / "huggingface" / "hub"
    hf_repo(hub, "org/model", {"config.json": CONFIG, "w.bin": b"12345"})
    monkeypatch.setenv("HOME", str(tmp_path))
    entry = fanout_manifest.manifest({"hub": "~/.cache/huggingface/hub", "repos": [
        {"repo": "org/model", "revision": "main"}]})["org/model"]
    assert entry["present"] is True and entry["root"] == str(hub)
    assert entry["bytes"] == len(CONFIG) + 5


def test_manifest_of_a_local_dir_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local = tmp_path / "models" / "my-model"
    (local / "sub").mkdir(parents=True)
    (local / "config.json").write_bytes(CONFIG)
    (local / "sub" / "w.bin").write_bytes(b"12345")
    (local / "original").mkdir()
    (local / "original" / "x.pth").write_bytes(b"no")
    meta = local / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True)
    (meta / "config.json.metadata").write_text(f"{COMMIT}\netag\n")
    (meta / "config.json.lock").write_text("")
    empty = tmp_path / "models" / "empty"
    empty.mkdir()
    resumed = tmp_path / "models" / "resumed"
    resumed.mkdir()
    (resumed / "config.json").write_bytes(CONFIG)
    (resumed / "w.bin.sparkctl-part").write_bytes(b"12")
    request = {"hub": str(tmp_path / "hub"), "repos": [
        {"repo": "org/my-model", "revision": "main", "dir": str(local), "deny": ["original/"]},
        {"repo": "org/empty", "revision": "main", "dir": str(empty)},
        {"repo": "org/nowhere", "revision": "main", "dir": str(tmp_path / "models" / "nowhere")},
        {"repo": "org/resumed", "revision": "main", "dir": str(resumed)},
    ]}

    out = manifest(request, monkeypatch)

    entry = out["org/my-model"]
    assert entry["present"] is True and entry["commit"] == COMMIT
    assert entry["root"] == str(tmp_path / "models") and entry["folder"] == "my-model"
    assert entry["files"] == {"config.json": "my-model/config.json", "sub/w.bin": "my-model/sub/w.bin"}
    # hf's bookkeeping of the dir travels too (not its locks); the denied folder does not
    assert entry["blobs"] == {
        "my-model/config.json": {"size": len(CONFIG), "sha256": sha(CONFIG)},
        "my-model/sub/w.bin": {"size": 5, "sha256": sha(b"12345")},
        "my-model/.cache/huggingface/download/config.json.metadata":
            {"size": len(f"{COMMIT}\netag\n"), "sha256": sha(f"{COMMIT}\netag\n".encode())}}
    assert entry["links"] == {} and entry["refs"] == {}
    assert entry["bytes"] == len(CONFIG) + 5 + len(f"{COMMIT}\netag\n")
    assert (local / ".cache" / "sparkctl-hashes.json").is_file()
    assert manifest(request, monkeypatch)["org/my-model"]["blobs"] == entry["blobs"]  # cache not copied
    assert out["org/empty"]["present"] is False and out["org/empty"]["commit"] is None
    assert out["org/nowhere"]["present"] is False and out["org/nowhere"]["files"] == {}
    assert out["org/nowhere"]["folder"] == "nowhere"
    assert out["org/resumed"]["present"] is False
    assert out["org/resumed"]["partial"] == ["w.bin.sparkctl-part"]


# --- probe.py -------------------------------------------------------------------------------

def probe(server: dict[str, Any] | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    record = tmp_path / f"server-{len(list(tmp_path.iterdir()))}.json"
    if server is not None:
        record.write_text(json.dumps(server))
    from orchestrator.status.server import health_paths

    ran = run_node_script("probe.py", [str(record), json.dumps(health_paths())], monkeypatch)
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


def test_probe_at_a_port_asks_health_then_the_models_with_the_servers_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launching half of the one probe program (engines/readiness.py: readiness and the
    smoke test of SGLang's and llama.cpp's servers): the key read from its file, never argv."""
    key = tmp_path / "api_key"
    key.write_text("sk-probe\n")
    models = json.dumps({"data": [{"id": "org/m"}]})
    with http_server({"/health": (200, "ok"), "/v1/models": (200, models)}) as (port, seen):
        ran = run_node_script("probe.py", ["--at", str(port), "0.0.0.0", str(key)], monkeypatch)
    assert ran.json == {"health": 200, "models": ["org/m"]}
    assert [path for _, path, _ in seen] == ["/health", "/v1/models"]
    with http_server({"/health": (503, "loading")}) as (port, seen):
        ran = run_node_script("probe.py", ["--at", str(port), "127.0.0.1", ""], monkeypatch)
    assert ran.json == {"health": 503} and len(seen) == 1
    body = {"model": "org/m", "messages": []}
    answer = json.dumps({"usage": {"completion_tokens": 3}})
    with http_server({"/v1/chat/completions": (200, answer)}) as (port, seen):
        ran = run_node_script("probe.py", ["--at", str(port), "127.0.0.1", "", json.dumps(body)],
                              monkeypatch)
    assert ran.json["code"] == 200 and json.loads(ran.json["body"]) == json.loads(answer)
    assert json.loads(seen[0][2]) == body


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


WORDS = list(OURS)  # the words an engine gives (TensorRT-LLM's: mpirun, trtllm, ...)


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

    out = serverctl({"action": "status", "run": str(run), "ours": WORDS}, monkeypatch)

    assert out["action"] == "status"
    assert out["pids"]["mpirun.pid"].pop("rss_kb") > 0  # what status shows it uses
    assert out["pids"] == {"mpirun.pid": {"pid": ours.pid, "alive": True},
                           "rank-1.pid": {"pid": stranger.pid, "alive": False}}
    assert out["server"] is None and "health" not in out
    # without the engine's words (node_cmd always gives some) nothing is ours
    out = serverctl({"action": "status", "run": str(run)}, monkeypatch)
    assert not any(info["alive"] for info in out["pids"].values())

    ours.kill()
    ours.wait(5)
    out = serverctl({"action": "status", "run": str(run / "missing"), "ours": WORDS}, monkeypatch)
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

    out = serverctl({"action": "stop", "run": str(run), "grace": 5, "rotate": True,
                     "ours": WORDS}, monkeypatch)

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

    out = serverctl({"action": "stop", "run": str(run), "grace": 0.5, "ours": WORDS}, monkeypatch)

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


def test_ray_every_says_whether_every_node_is_alive_in_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """node/ray_every.py (a vLLM-over-Ray boot unit's ready condition), fed ray_nodes.py's line."""
    import io

    answer = json.dumps({"nodes": [{"ip": "10.0.0.1", "alive": True},
                                   {"ip": "10.0.0.2", "alive": False}]})
    for wanted, code in ((["10.0.0.1"], 0), (["10.0.0.1", "10.0.0.2"], 1), ([], 0)):
        monkeypatch.setattr("sys.stdin", io.StringIO(f"noise\n{answer}\n"))
        assert run_node_script("ray_every.py", wanted, monkeypatch).code == code
    monkeypatch.setattr("sys.stdin", io.StringIO('{"error": "no cluster"}\n'))
    assert run_node_script("ray_every.py", ["10.0.0.1"], monkeypatch).code == 1


def fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, running: str) -> Path:
    """A `docker` first on PATH whose `inspect` prints the content of a file (true/false)."""
    state = tmp_path / "running"
    state.write_text(running)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    docker = bin_dir / "docker"
    docker.write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path / 'docker-calls'}\ncat {state}\n")
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return state


def test_probe_waits_on_the_node_until_the_answer_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """readiness's node-side wait (engines/readiness.py): what the controller saw comes back at
    once when the node sees something else; the same answer is looked at again, on the node,
    until it changes (here: 503 three times, then 200 with the model listed)."""
    fake_docker(tmp_path, monkeypatch, "true")
    answers = iter([(503, "loading")] * 3)
    models = json.dumps({"data": [{"id": "org/m"}]})
    routes = {"/health": lambda body: next(answers, (200, "ok")), "/v1/models": (200, models)}
    with http_server(routes) as (port, seen):  # type: ignore[arg-type]
        first = run_node_script("probe.py", ["--wait", "30", "c", "", str(port), "127.0.0.1", ""],
                                monkeypatch)
        assert first.json == {"health": 503, "running": True} and len(seen) == 1
        ready = run_node_script("probe.py", ["--wait", "30", "c", "503", str(port), "127.0.0.1", ""],
                                monkeypatch)
    assert ready.json == {"health": 200, "models": ["org/m"], "running": True}
    assert [path for _, path, _ in seen] == ["/health"] * 4 + ["/v1/models"]


def test_the_first_wait_answers_a_loading_server_only_when_it_is_ready(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller's first look (SEEN "-"): no answer and 503 do not end it, so a server
    ready within its seconds costs one round trip; one still loading is answered when they end."""
    fake_docker(tmp_path, monkeypatch, "true")
    answers = iter([(503, "loading")] * 3)
    models = json.dumps({"data": [{"id": "org/m"}]})
    routes = {"/health": lambda body: next(answers, (200, "ok")), "/v1/models": (200, models)}
    with http_server(routes) as (port, seen):  # type: ignore[arg-type]
        ready = run_node_script("probe.py", ["--wait", "30", "c", "-", str(port), "127.0.0.1", ""],
                                monkeypatch)
    assert ready.json == {"health": 200, "models": ["org/m"], "running": True}
    assert [path for _, path, _ in seen] == ["/health"] * 4 + ["/v1/models"]
    # no inspect: the serve step saw the container run just before, and the server answering
    # with its model says it runs (a docker call, ~30 ms of CPU, would only slow its load)
    calls = tmp_path / "docker-calls"
    assert not calls.exists() or calls.read_text() == ""
    with http_server({"/health": (503, "loading")}) as (port, seen):
        late = run_node_script("probe.py", ["--wait", "0.5", "c", "-", str(port), "127.0.0.1", ""],
                               monkeypatch)
    assert late.json == {"health": 503, "running": True} and len(seen) > 2
    # a container that stopped is still seen by the first wait, after INSPECT_EVERY
    fake_docker(tmp_path, monkeypatch, "false")
    with http_server({"/health": (503, "loading")}) as (port, seen):
        started = time.monotonic()
        dead = run_node_script("probe.py", ["--wait", "30", "c", "-", str(port), "127.0.0.1", ""],
                               monkeypatch)
    assert dead.json == {"health": 503, "running": False} and time.monotonic() - started < 5


def test_probe_wait_marks_the_record_and_sends_the_first_request_once_ready(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With RECORD WHEN BODY the wait that sees the model listed sets the record's ready_at and
    sends BODY as the launch's one chat completion, in the same command; a look that is not
    ready yet does neither. ready_at is WHEN (the controller's time as it sent the command) plus
    the seconds the node waited: when the server was seen ready, not when the wait began."""
    fake_docker(tmp_path, monkeypatch, "true")
    record = tmp_path / "server.json"
    record.write_text(json.dumps({"name": "s"}))
    body = {"model": "org/m", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}
    when = "2026-11-28T15:00:00+00:00"
    words = ["c", "-", "PORT", "127.0.0.1", "", str(record), when, json.dumps(body)]
    with http_server({"/health": (503, "loading")}) as (port, seen):
        args = ["--wait", "0.3", *[str(port) if w == "PORT" else w for w in words]]
        loading = run_node_script("probe.py", args, monkeypatch)
    assert loading.json == {"health": 503, "running": True}
    assert "ready_at" not in json.loads(record.read_text())
    reply = json.dumps({"choices": [{"message": {"content": "Hello"}}], "usage": {"completion_tokens": 1}})
    loads = iter([(503, "loading")] * 12)  # ~1.2 s of looks before it answers 200
    routes = {"/health": lambda sent: next(loads, (200, "ok")),
              "/v1/models": (200, json.dumps({"data": [{"id": "org/m"}]})),
              "/v1/chat/completions": (200, reply)}
    with http_server(routes) as (port, seen):  # type: ignore[arg-type]
        args = ["--wait", "30", *[str(port) if w == "PORT" else w for w in words]]
        ready = run_node_script("probe.py", args, monkeypatch).json
    waited = datetime.fromisoformat(ready["ready_at"]) - datetime.fromisoformat(when)
    assert 1 <= waited.total_seconds() <= 10, ready  # (a loaded machine looks more slowly)
    assert json.loads(record.read_text())["ready_at"] == ready["ready_at"]
    assert ready["first"]["code"] == 200 and json.loads(ready["first"]["body"]) == json.loads(reply)
    assert [(path, json.loads(sent) if sent else None) for _, path, sent in seen][-3:] == [
        ("/health", None), ("/v1/models", None), ("/v1/chat/completions", body)]


def test_probe_wait_ends_when_the_container_stops_or_the_time_is_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = fake_docker(tmp_path, monkeypatch, "false")
    with http_server({"/health": (503, "loading")}) as (port, seen):
        gone = run_node_script("probe.py", ["--wait", "30", "c", "503", str(port), "127.0.0.1", ""],
                               monkeypatch)
        assert gone.json == {"health": 503, "running": False} and len(seen) == 1
        state.write_text("true")
        started = time.monotonic()
        late = run_node_script("probe.py", ["--wait", "0.5", "c", "503", str(port), "127.0.0.1", ""],
                               monkeypatch)
    assert late.json == {"health": 503, "running": True}
    assert 0.5 <= time.monotonic() - started < 5 and len(seen) > 2
