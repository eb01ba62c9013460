"""The node-side fan-out (orchestrator/node/fanout.py) run locally: manifest, sender -> receiver
over 127.0.0.1 between two temporary HF caches, resume, corruption, patterns, a full disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.node import fanout as node
from orchestrator.node import fanout_manifest

SCRIPT = str(Path(node.__file__))
REPO = "org/m"
FOLDER = "models--org--m"
COMMIT = "c0ffee" * 6 + "abcd"
MIB = 2**20
CHUNK = MIB  # small chunks keep the tests fast; the node default is node.CHUNK


def make_hub(hub: Path, big: int = 3 * CHUNK + 12345) -> None:
    full = hub / FOLDER
    for d in ("blobs", "refs", f"snapshots/{COMMIT}/original"):
        (full / d).mkdir(parents=True, exist_ok=True)
    data = {"big": os.urandom(big), "cfg": b'{"a": 1}\n', "tok": b"tokenizer\n", "orig": b"x" * 100,
            "empty": b""}
    names = {"big": "model.safetensors", "cfg": "config.json", "tok": "tokenizer.json",
             "orig": "original/consolidated.pth", "empty": "added_tokens.json"}
    for blob, content in data.items():
        (full / "blobs" / blob).write_bytes(content)
        depth = "../../../" if "/" in names[blob] else "../../"
        (full / "snapshots" / COMMIT / names[blob]).symlink_to(f"{depth}blobs/{blob}")
    (full / "refs" / "main").write_text(COMMIT)


def run(mode: str, args: dict[str, Any], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, SCRIPT, mode, json.dumps(args)], input=stdin,
                          capture_output=True, text=True, timeout=120)


def manifest(hub: Path, chunks: bool = True, **patterns: list[str]) -> dict[str, Any]:
    result = run("manifest", {"hub": str(hub), "chunks": chunks, "chunk": CHUNK,
                              "repos": [{"repo": REPO, "revision": "main", **patterns}]})
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout)[REPO])


def copy(head: Path, peer: Path, streams: int = 3, **patterns: list[str]
         ) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """One fan-out head -> peer: (receiver's first line, receiver's last line, sender lines)."""
    entry = manifest(head, **patterns)
    files = [{"rel": rel, **info} for rel, info in sorted(entry["blobs"].items())]
    plan = {"token": "t" * 32, "root": str(peer), "files": files, "links": entry["links"], "chunk": CHUNK,
            "refs": entry["refs"]}
    receiver = subprocess.Popen(
        [sys.executable, SCRIPT, "recv", json.dumps({"listen": "127.0.0.1", "streams": streams})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert receiver.stdin is not None and receiver.stdout is not None
    receiver.stdin.write(json.dumps(plan))
    receiver.stdin.close()
    ready = json.loads(receiver.stdout.readline())
    sent: list[dict[str, Any]] = []
    if ready.get("need"):
        job = {"token": "t" * 32, "root": str(head), "files": [f["rel"] for f in files],
               "need": ready["need"]}
        result = run("send", {"host": "127.0.0.1", "port": ready["port"], "streams": streams},
                     json.dumps(job))
        sent = [json.loads(line) for line in result.stdout.splitlines()]
    last = receiver.stdout.read().strip().splitlines()
    receiver.wait(timeout=60)
    return ready, json.loads(last[-1]) if last else {}, sent


def tree(hub: Path) -> dict[str, str]:
    """Every path under the repo folder (not the hash cache): file contents' size or link target."""
    out = {}
    for path in sorted((hub / FOLDER).rglob("*")):
        rel = str(path.relative_to(hub))
        if ".sparkctl" in rel:
            continue
        out[rel] = f"-> {os.readlink(path)}" if path.is_symlink() else (
            "dir" if path.is_dir() else path.read_bytes().hex()[:16] + str(path.stat().st_size))
    return out


def test_manifest_hashes_once_and_caches_beside_the_model(tmp_path: Path) -> None:
    make_hub(tmp_path)
    entry = manifest(tmp_path)
    assert entry["present"] and entry["commit"] == COMMIT
    big = entry["blobs"][f"{FOLDER}/blobs/big"]
    assert len(big["chunks"]) == 4 and len(big["sha256"]) == 64
    cache = tmp_path / FOLDER / ".sparkctl" / "hashes.json"
    assert cache.is_file()
    assert not (tmp_path / FOLDER / "snapshots" / COMMIT / ".sparkctl-manifest.json").exists()
    # a changed file is hashed again (stat key), an unchanged one comes from the cache
    (tmp_path / FOLDER / "blobs" / "cfg").write_bytes(b'{"a": 2}\n')
    assert manifest(tmp_path)["blobs"][f"{FOLDER}/blobs/cfg"]["sha256"] != \
        entry["blobs"][f"{FOLDER}/blobs/cfg"]["sha256"]


def test_patterns_pick_files_like_hf(tmp_path: Path) -> None:
    make_hub(tmp_path)
    entry = manifest(tmp_path, allow=["*.safetensors", "*.json", "tokenizer*"], deny=["original/*"])
    assert sorted(entry["files"]) == ["added_tokens.json", "config.json", "model.safetensors",
                                      "tokenizer.json"]
    assert not fanout_manifest.matches("original/x.pth", [], ["original/"])
    assert not fanout_manifest.matches("a.bin", ["*.safetensors"], [])


def test_copy_reproduces_the_hf_layout_exactly(tmp_path: Path) -> None:
    head, peer = tmp_path / "head", tmp_path / "peer"
    make_hub(head)
    peer.mkdir()
    ready, last, sent = copy(head, peer)
    assert last == {"done": True, "received": ready["need_bytes"]}
    assert sent[-1]["done"] and sent[-1]["sent"] == ready["need_bytes"] == ready["total"]
    assert tree(peer) == tree(head)
    assert not list(peer.rglob("*.sparkctl-part"))
    # a second run copies nothing
    ready, last, _ = copy(head, peer)
    assert ready["need"] == [] and last["done"]


def test_only_the_allowed_files_are_copied(tmp_path: Path) -> None:
    head, peer = tmp_path / "head", tmp_path / "peer"
    make_hub(head)
    peer.mkdir()
    copy(head, peer, deny=["original/*", "*.safetensors"])
    names = {p.name for p in (peer / FOLDER / "snapshots" / COMMIT).rglob("*")}
    assert "config.json" in names and "model.safetensors" not in names
    assert "consolidated.pth" not in names


def test_a_corrupted_file_is_found_and_only_its_bad_chunk_resent(tmp_path: Path) -> None:
    head, peer = tmp_path / "head", tmp_path / "peer"
    make_hub(head)
    peer.mkdir()
    copy(head, peer)
    blob = peer / FOLDER / "blobs" / "big"
    with open(blob, "r+b") as f:  # same size, one byte wrong in the second chunk
        f.seek(CHUNK + 7)
        f.write(b"\xff" if f.read(1) != b"\xff" else b"\x00")
    ready, last, _ = copy(head, peer)
    assert [n[1] for n in ready["need"]] == [CHUNK]
    assert last["done"] and tree(peer) == tree(head)


def test_an_interrupted_copy_resumes_from_the_good_chunks(tmp_path: Path) -> None:
    head, peer = tmp_path / "head", tmp_path / "peer"
    make_hub(head)
    peer.mkdir()
    copy(head, peer)
    blob = peer / FOLDER / "blobs" / "big"
    part = blob.with_name("big.sparkctl-part")
    blob.rename(part)  # what a kill leaves: the partial holds two good chunks and a torn third
    with open(part, "r+b") as f:
        f.truncate(2 * CHUNK + 1000)
    ready, last, _ = copy(head, peer)
    assert ready["need_bytes"] == head.joinpath(FOLDER, "blobs", "big").stat().st_size - 2 * CHUNK
    assert ready["have"] > 2 * CHUNK
    assert last["done"] and tree(peer) == tree(head)


def test_a_wrong_token_gets_nothing_written(tmp_path: Path) -> None:
    head, peer = tmp_path / "head", tmp_path / "peer"
    make_hub(head, big=1000)
    peer.mkdir()
    entry = manifest(head)
    files = [{"rel": rel, **info} for rel, info in sorted(entry["blobs"].items())]
    receiver = subprocess.Popen(
        [sys.executable, SCRIPT, "recv", json.dumps({"listen": "127.0.0.1", "streams": 1})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert receiver.stdin is not None and receiver.stdout is not None
    receiver.stdin.write(json.dumps({"token": "a" * 32, "root": str(peer), "files": files,
                                     "links": {}, "refs": {}, "chunk": CHUNK}))
    receiver.stdin.close()
    ready = json.loads(receiver.stdout.readline())
    job = {"token": "b" * 32, "root": str(head), "files": [f["rel"] for f in files],
           "need": ready["need"]}
    result = run("send", {"host": "127.0.0.1", "port": ready["port"], "streams": 1}, json.dumps(job))
    assert json.loads(result.stdout.splitlines()[-1])["error"] == "send"
    receiver.kill()  # our own child: it would wait for a real sender until its idle timeout
    receiver.wait()
    assert [p.name for p in peer.rglob("blobs/*")] == ["empty"]  # nothing to send for it


def test_not_enough_space_is_refused_with_the_numbers(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    head, peer = tmp_path / "head", tmp_path / "peer"
    make_hub(head, big=1000)
    peer.mkdir()
    entry = manifest(head)
    files = [{"rel": rel, **info} for rel, info in sorted(entry["blobs"].items())]
    monkeypatch.setattr(node, "free_bytes", lambda path: 10)
    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO(json.dumps(
        {"token": "a" * 32, "root": str(peer), "files": files, "links": {}, "refs": {}, "chunk": CHUNK})))
    lines: list[dict[str, Any]] = []
    monkeypatch.setattr(node, "out", lines.append)
    assert node.recv({"listen": "127.0.0.1", "streams": 1}) == 3
    assert lines == [{"error": "space", "need": entry["bytes"], "free": 10, "path": str(peer)}]


@pytest.mark.parametrize("splice", [True, False], ids=["splice", "recv+write"])
def test_a_disk_filling_up_mid_copy_fails_at_once(tmp_path: Path, splice: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import threading

    head, peer = tmp_path / "head", tmp_path / "peer"
    make_hub(head, big=2 * CHUNK)
    peer.mkdir()
    entry = manifest(head)
    files = [{"rel": rel, **info} for rel, info in sorted(entry["blobs"].items())]

    def full(fd: int, data: Any, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    lines: list[dict[str, Any]] = []
    exits: list[int] = []
    monkeypatch.setattr(node.os, "pwrite", full)
    real_splice = getattr(node.os, "splice", None)

    def splice(src: int, dst: int, count: int, offset_src: Any = None, offset_dst: Any = None,
               flags: int = 0) -> int:
        if offset_dst is not None:  # into the file
            raise OSError(errno.ENOSPC, "No space left on device")
        assert real_splice is not None
        return int(real_splice(src, dst, count))

    if splice and real_splice is not None:
        monkeypatch.setattr(node.os, "splice", splice)
    elif real_splice is not None:
        monkeypatch.delattr(node.os, "splice")
    monkeypatch.setattr(node.os, "_exit", lambda code: exits.append(code))
    monkeypatch.setattr(node, "out", lines.append)
    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO(json.dumps(
        {"token": "a" * 32, "root": str(peer), "files": files, "links": {}, "refs": {}, "chunk": CHUNK})))
    port: list[int] = []
    original = lines.append

    def capture(obj: dict[str, Any]) -> None:
        original(obj)
        if "port" in obj:
            port.append(obj["port"])

    monkeypatch.setattr(node, "out", capture)
    thread = threading.Thread(target=node.recv, args=({"listen": "127.0.0.1", "streams": 1},),
                              daemon=True)
    thread.start()
    for _ in range(200):
        if port:
            break
        threading.Event().wait(0.05)
    job = {"token": "a" * 32, "root": str(head), "files": [f["rel"] for f in files],
           "need": lines[0]["need"]}
    result = run("send", {"host": "127.0.0.1", "port": port[0], "streams": 1}, json.dumps(job))
    thread.join(timeout=30)
    assert exits == [4]
    assert any(line.get("error") == "space" and line["path"] == str(peer) for line in lines)
    assert json.loads(result.stdout.splitlines()[-1])["error"] == "send"


def test_a_connection_that_comes_after_every_chunk_still_gets_its_answer(tmp_path: Path) -> None:
    """The CI failure of stop 21: the first connection carried every chunk, the receiver closed
    its listener, and the sender's late second connection was reset, failing a good copy."""
    import socket
    import struct
    import time

    head, peer = tmp_path / "head", tmp_path / "peer"
    make_hub(head, big=2 * CHUNK)
    peer.mkdir()
    entry = manifest(head)
    files = [{"rel": rel, **info} for rel, info in sorted(entry["blobs"].items())]
    receiver = subprocess.Popen(
        [sys.executable, SCRIPT, "recv", json.dumps({"listen": "127.0.0.1", "streams": 2})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert receiver.stdin is not None and receiver.stdout is not None
    receiver.stdin.write(json.dumps({"token": "a" * 32, "root": str(peer), "files": files,
                                     "links": entry["links"], "refs": entry["refs"], "chunk": CHUNK}))
    receiver.stdin.close()
    ready = json.loads(receiver.stdout.readline())
    assert len(ready["need"]) >= 2  # so the sender opens two connections
    header = struct.Struct("!IQQ")

    def connect() -> socket.socket:
        conn = socket.create_connection(("127.0.0.1", ready["port"]), timeout=10)
        conn.sendall(b"a" * 32)
        return conn

    stranger = socket.create_connection(("127.0.0.1", ready["port"]), timeout=10)
    stranger.sendall(b"b" * 32)  # a wrong token neither writes nor takes a sender's place
    first = connect()
    for i, off, length in ready["need"]:  # the first connection carries every chunk
        with open(head / files[i]["rel"], "rb") as f:
            f.seek(off)
            first.sendall(header.pack(i, off, length) + f.read(length))
    first.sendall(header.pack(0xFFFFFFFF, 0, 0))
    assert first.recv(1) == b"K"
    time.sleep(1.5)  # every chunk is in; the receiver must still be listening
    second = connect()
    second.sendall(header.pack(0xFFFFFFFF, 0, 0))
    assert second.recv(1) == b"K"
    last = receiver.stdout.read().strip().splitlines()
    assert receiver.wait(timeout=30) == 0
    assert json.loads(last[-1])["done"] and tree(peer) == tree(head)
    stranger.close()
