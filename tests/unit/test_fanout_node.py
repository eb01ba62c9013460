"""The node-side fan-out (orchestrator/node/fanout.py) run locally: manifest, sender -> receiver
over 127.0.0.1 between two temporary HF caches, resume, corruption, patterns, a full disk."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.node import fanout as node
from orchestrator.node import fanout_manifest
from orchestrator.node import fanout_receiver as receiver_state

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


def files_of(entry: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"rel": rel, **info} for rel, info in sorted(entry["blobs"].items())]


def plan_of(token: str, *repos: tuple[Path, dict[str, Any]]) -> dict[str, Any]:
    """The receiver's plan (phases/fanout.py copy_plan's shape): (peer root, head entry) each."""
    return {"token": token, "chunk": CHUNK, "repos": [
        {"root": str(root), "files": files_of(entry), "links": entry["links"],
         "refs": entry["refs"]} for root, entry in repos]}


def job_of(token: str, need: list[list[int]], *repos: tuple[Path, dict[str, Any]]) -> dict[str, Any]:
    """The sender's job: (head root, entry) each; files as [root, rel] in the plan's order."""
    return {"token": token, "need": need,
            "files": [[str(root), f["rel"]] for root, entry in repos for f in files_of(entry)]}


def copy(head: Path, peer: Path, streams: int = 3, **patterns: list[str]
         ) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """One fan-out head -> peer: (receiver's first line, receiver's last line, sender lines)."""
    entry = manifest(head, **patterns)
    plan = plan_of("t" * 32, (peer, entry))
    receiver = subprocess.Popen(
        [sys.executable, SCRIPT, "recv", json.dumps({"listen": "127.0.0.1", "streams": streams})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert receiver.stdin is not None and receiver.stdout is not None
    receiver.stdin.write(json.dumps(plan))
    receiver.stdin.close()
    ready = json.loads(receiver.stdout.readline())
    sent: list[dict[str, Any]] = []
    if ready.get("need"):
        job = job_of("t" * 32, ready["need"], (head, entry))
        result = run("send", {"host": "127.0.0.1", "port": ready["port"],
                              "streams": ready["streams"]}, json.dumps(job))
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
    assert last["done"] and last["received"] == ready["need_bytes"]
    # the node's CPU busy share while it received (None: shorter than a clock tick)
    assert last["cpu_busy"] is None or 0 <= last["cpu_busy"] <= 1
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
    before = blob.stat()
    with open(blob, "r+b") as f:  # same size, one byte wrong in the second chunk
        f.seek(CHUNK + 7)
        f.write(b"\xff" if f.read(1) != b"\xff" else b"\x00")
    # a write moves the mtime, but only by the kernel's clock tick: right after the copy it may
    # not have moved yet (a blob changed with its mtime kept is --verify-models' case)
    os.utime(blob, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
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
    receiver = subprocess.Popen(
        [sys.executable, SCRIPT, "recv", json.dumps({"listen": "127.0.0.1", "streams": 1})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert receiver.stdin is not None and receiver.stdout is not None
    receiver.stdin.write(json.dumps(plan_of("a" * 32, (peer, entry))))
    receiver.stdin.close()
    ready = json.loads(receiver.stdout.readline())
    job = job_of("b" * 32, ready["need"], (head, entry))
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
    monkeypatch.setattr(receiver_state, "free_bytes", lambda path: 10)
    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO(json.dumps(
        plan_of("a" * 32, (peer, entry)))))
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
        plan_of("a" * 32, (peer, entry)))))
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
    job = job_of("a" * 32, lines[0]["need"], (head, entry))
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
    files = files_of(entry)
    receiver = subprocess.Popen(
        [sys.executable, SCRIPT, "recv", json.dumps({"listen": "127.0.0.1", "streams": 2})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert receiver.stdin is not None and receiver.stdout is not None
    receiver.stdin.write(json.dumps(plan_of("a" * 32, (peer, entry))))
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


def make_local(root: Path, name: str = "draft") -> Path:
    """A local model folder (a draft model saved with save_pretrained: no HF cache layout)."""
    folder = root / name
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_bytes(b'{"draft": true}\n')
    (folder / "model.safetensors").write_bytes(os.urandom(2 * CHUNK + 77))
    (folder / "sub" / "extra.bin").write_bytes(os.urandom(100))
    return folder


def test_every_repository_goes_in_one_copy_each_into_its_own_root(tmp_path: Path) -> None:
    """One receiver and one sender for the HF cache model and a local draft folder: the frames
    index one list of both repositories' files, and each lands under its own root."""
    head_hub, head_drafts = tmp_path / "head" / "hub", tmp_path / "head" / "drafts"
    peer_hub, peer_drafts = tmp_path / "peer" / "hub", tmp_path / "peer" / "drafts"
    make_hub(head_hub)
    make_local(head_drafts)
    peer_hub.mkdir(parents=True)  # (the peer's drafts folder does not exist yet)
    result = run("manifest", {"hub": str(head_hub), "chunks": True, "chunk": CHUNK, "repos": [
        {"repo": REPO, "revision": "main"},
        {"repo": "org/draft", "revision": "main", "dir": str(head_drafts / "draft")}]})
    entries = json.loads(result.stdout)
    model, draft = entries[REPO], entries["org/draft"]
    assert draft["root"] == str(head_drafts) and model["root"] == str(head_hub)
    receiver = subprocess.Popen(
        [sys.executable, SCRIPT, "recv", json.dumps({"listen": "127.0.0.1", "streams": 4})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert receiver.stdin is not None and receiver.stdout is not None
    receiver.stdin.write(json.dumps(plan_of("t" * 32, (peer_hub, model), (peer_drafts, draft))))
    receiver.stdin.close()
    ready = json.loads(receiver.stdout.readline())
    model_files = len(model["blobs"])
    assert {i for i, _, _ in ready["need"]} >= {model_files, model_files + 1}  # the draft's too
    assert ready["need_bytes"] == ready["total"] == model["bytes"] + draft["bytes"]
    job = job_of("t" * 32, ready["need"], (head_hub, model), (head_drafts, draft))
    sent = run("send", {"host": "127.0.0.1", "port": ready["port"], "streams": ready["streams"]},
               json.dumps(job))
    assert json.loads(sent.stdout.splitlines()[-1])["done"], sent.stdout + sent.stderr
    last = json.loads(receiver.stdout.read().strip().splitlines()[-1])
    assert receiver.wait(timeout=30) == 0 and last["done"]
    assert tree(peer_hub) == tree(head_hub)
    for rel in ("config.json", "model.safetensors", "sub/extra.bin"):
        assert (peer_drafts / "draft" / rel).read_bytes() == (head_drafts / "draft" / rel).read_bytes()
    # each repository's hash cache beside it: a second copy finds everything right
    assert (peer_drafts / "draft" / ".cache" / "sparkctl-hashes.json").is_file()
    again = subprocess.run([sys.executable, SCRIPT, "recv", json.dumps({"listen": "127.0.0.1"})],
                           input=json.dumps(plan_of("t" * 32, (peer_hub, model), (peer_drafts, draft))),
                           capture_output=True, text=True, timeout=60)
    first = json.loads(again.stdout.splitlines()[0])
    assert first["need"] == [] and first["have"] == first["total"]


def test_the_ready_line_says_how_many_connections_the_receiver_waits_for(tmp_path: Path) -> None:
    """The sender opens what the receiver waits for: the streams asked for, but no more than
    there are chunks to send (a connection with nothing to carry would never come)."""
    head, peer = tmp_path / "head", tmp_path / "peer"
    make_hub(head)
    peer.mkdir()
    plan = json.dumps(plan_of("t" * 32, (peer, manifest(head))))

    def ready(streams: int) -> dict[str, Any]:
        proc = subprocess.Popen(
            [sys.executable, SCRIPT, "recv", json.dumps({"listen": "127.0.0.1", "streams": streams})],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(plan)
        proc.stdin.close()
        line = json.loads(proc.stdout.readline())
        proc.kill()  # our own child, waiting for a sender that never comes
        proc.wait()
        return dict(line)

    assert ready(3)["streams"] == 3
    many = ready(50)
    assert many["streams"] == len(many["need"]) < 50


def test_a_sender_given_no_job_ends_quietly() -> None:
    """The controller starts the sender beside the receiver; when nothing is needed it closes
    the sender's stdin without a job, and the sender must end at once, without a traceback."""
    result = run("send", {"host": "127.0.0.1"}, "")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_the_busy_share_is_the_non_idle_part_of_the_ticks_between() -> None:
    assert node.busy_share((100, 400), (250, 600)) == 0.75
    assert node.busy_share((100, 400), (100, 400)) is None  # no tick passed
    assert node.busy_share(None, (1, 2)) is None
    busy, total = node.cpu_ticks() or (0, 0)
    assert 0 <= busy <= total and total > 0  # read from this machine's /proc/stat


def test_a_watched_receiver_stops_when_its_controller_goes_away(tmp_path: Path) -> None:
    """With "watch", stdin stays open for the whole copy; its end (Ctrl-C on the controller, a
    dropped SSH connection, a `docker exec` client gone) stops the receiver at once: it would
    otherwise wait for a sender until its idle timeout, listening on the fabric."""
    head, peer = tmp_path / "head", tmp_path / "peer"
    make_hub(head)
    peer.mkdir()
    receiver = subprocess.Popen(
        [sys.executable, SCRIPT, "recv", json.dumps({"listen": "127.0.0.1", "streams": 2,
                                                     "watch": True})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert receiver.stdin is not None and receiver.stdout is not None
    receiver.stdin.write(json.dumps(plan_of("t" * 32, (peer, manifest(head)))) + "\n")
    receiver.stdin.flush()
    ready = json.loads(receiver.stdout.readline())
    assert ready["need"] and receiver.poll() is None  # listening, stdin still open
    receiver.stdin.close()  # the controller is gone
    assert receiver.wait(timeout=10) == 9
    assert not list((peer / FOLDER / "blobs").glob("big"))  # nothing half-written in place


def test_a_receiver_whose_fabric_address_is_gone_says_so_in_one_line(tmp_path: Path) -> None:
    # a pulled cable takes the fabric address off the node (networkd): binding it fails with
    # EADDRNOTAVAIL, which used to end the receiver in a traceback
    head, peer = tmp_path / "head", tmp_path / "peer"
    make_hub(head, big=1000)
    peer.mkdir()
    result = run("recv", {"listen": "192.0.2.77", "streams": 1},  # TEST-NET-1: on no machine
                 json.dumps(plan_of("a" * 32, (peer, manifest(head)))))
    assert result.returncode == 6 and "Traceback" not in result.stderr, result.stderr
    assert json.loads(result.stdout) == {"error": "listen", "link": True,
                                         "message": "Cannot assign requested address"}


def test_a_sender_that_cannot_reach_the_receiver_says_so_without_an_errno(tmp_path: Path) -> None:
    head = tmp_path / "head"
    make_hub(head, big=1000)
    entry = manifest(head)
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    job = job_of("a" * 32, [[0, 0, 1000]], (head, entry))
    result = run("send", {"host": "127.0.0.1", "port": port, "streams": 1}, json.dumps(job))
    last = json.loads(result.stdout.splitlines()[-1])
    assert last == {"error": "send", "link": True, "sent": 0, "message":
                    f"cannot connect to the receiver at 127.0.0.1:{port}: Connection refused"}
    assert node.on_the_wire(TimeoutError()) and not node.on_the_wire(FileNotFoundError(2, "x"))
