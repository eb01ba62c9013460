"""The container image from node to node: the Image step's fallback, ImageShare (faked copy),
the digest check by image ID, and node/imagecopy.py run for real over 127.0.0.1 with a fake
`docker` (save writes a stream, load stores it, image inspect reports an ID)."""

from __future__ import annotations

import json
import os
import select
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.core.step import Change, RunOptions, RunState, Unchanged
from orchestrator.errors import SparkctlError
from orchestrator.node import imagecopy
from orchestrator.phases import container_image as c
from orchestrator.phases import image_share as share
from orchestrator.remote.pipe import RemoteProcess

IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc13"
REPO = IMAGE.rsplit(":", 1)[0]
ID = "sha256:" + "9" * 64
DIGEST = "sha256:" + "1" * 64


def facts(pulled: bool = True, image_id: str = ID, digests: list[str] | None = None
          ) -> dict[str, Any]:
    record = {"Id": image_id, "RepoDigests": [f"{REPO}@{DIGEST}"] if digests is None else digests}
    return {"images": {IMAGE: record if pulled else None}}


def test_a_failed_pull_is_handed_to_image_share_only_when_the_phase_has_it(
        inventory: Any, context: Any, fake_transport: Any) -> None:
    inv = inventory()
    no_route = 'Error response from daemon: Get "https://nvcr.io/v2/": no such host'
    transport = fake_transport("spark-b", [(1, "", no_route)])
    ctx = context(inv, "spark-b", {"spark-b": facts(pulled=False)},
                  transports={"spark-b": transport})
    message = c.Image(share=True).apply(ctx, c.Image(share=True).check(ctx))  # type: ignore[arg-type]
    assert "will come from another node" in str(message) and "no such host" in str(message)
    assert ctx.shared.image_wanted == {"spark-b": "its pull failed"}
    alone = context(inv, "spark-b", {"spark-b": facts(pulled=False)},
                    transports={"spark-b": fake_transport("spark-b", [(1, "", no_route)])})
    with pytest.raises(SparkctlError, match="spark-b: container/image: `docker pull"):
        c.Image().apply(alone, Change("pull"))


def test_distribute_image_pulls_on_the_head_only(inventory: Any, context: Any) -> None:
    inv = inventory()
    options = RunOptions(distribute_image=True)
    cluster = {"spark-a": facts(pulled=False), "spark-b": facts(pulled=False)}
    head = c.Image(share=True).check(context(inv, "spark-a", cluster, options=options))
    peer_ctx = context(inv, "spark-b", cluster, options=options)
    peer = c.Image(share=True).check(peer_ctx)
    assert isinstance(head, Change) and head.summary == f"docker pull {IMAGE}"
    assert isinstance(peer, Change) and "from spark-a over the fabric (--distribute-image)" \
        in peer.summary
    planned = share.ImageShare().check(peer_ctx)  # a dry run: nothing applied yet
    assert isinstance(planned, Change) and planned.payload == {"spark-b": "--distribute-image"}
    c.Image(share=True).apply(peer_ctx, peer)
    assert peer_ctx.shared.image_wanted == {"spark-b": "--distribute-image"}
    present = context(inv, "spark-b", {"spark-b": facts()}, options=options)
    assert isinstance(c.Image(share=True).check(present), Unchanged)


def test_image_share_sends_from_the_head_and_verifies_the_image_id(
        inventory: Any, context: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = inventory()
    cluster = {"spark-a": facts(), "spark-b": facts(pulled=False)}
    transports = {"spark-a": object(), "spark-b": object()}
    ctx = context(inv, "spark-a", cluster, transports=transports,
                  shared=RunState(image_wanted={"spark-b": "its pull failed"}))
    assert isinstance(share.ImageShare().check(
        context(inv, "spark-a", cluster, transports=transports)), Unchanged)
    change = share.ImageShare().check(ctx)
    assert isinstance(change, Change) and change.summary.endswith("to spark-b")
    sent: list[tuple[Any, Any, str]] = []

    def fake_copy(source: Any, target: Any, ip: str, image: str) -> dict[str, Any]:
        sent.append((source, target, ip))
        return {"id": ID, "digests": [f"{REPO}@{DIGEST}"], "bytes": 2_000_000, "done": True}

    monkeypatch.setattr(share, "copy_image", fake_copy)
    message = share.ImageShare().apply(ctx, change)
    assert sent == [(transports["spark-a"], transports["spark-b"], "192.168.200.13")]
    assert f"spark-b <- spark-a (its pull failed, 2.0 MB), {DIGEST} verified" in str(message)
    assert ctx.shared.image_facts["spark-b"]["Id"] == ID
    assert ctx.shared.report_extra["image_distribution"]["spark-b"]["digest"] == DIGEST
    # the digest check then sees the same image on both nodes
    assert isinstance(c.ImageDigest().check(context(inv, "spark-b", cluster, shared=ctx.shared)),
                      Unchanged)

    monkeypatch.setattr(share, "copy_image", lambda *a: {"id": "sha256:other", "digests": []})
    with pytest.raises(SparkctlError, match=r"spark-b: .* arrived as image ID sha256:other"):
        share.ImageShare().apply(ctx, change)


def fake_remote(lines: dict[str, list[dict[str, Any]]], started: list[Any]) -> type:
    class Remote:
        def __init__(self, transport: Any, command: str, display: str) -> None:
            self.mode = shlex.split(command)[3]
            self.started = (transport, command)
            self.lines = [json.dumps(line) for line in lines[self.mode]]

        def feed(self, text: str, close: bool = True) -> None:
            assert text.endswith("\n") and not close  # one line, stdin kept open (watched)
            started.append((*self.started, text.strip()))

        def readline(self) -> str:
            return self.lines.pop(0) if self.lines else ""

        first_json = RemoteProcess.first_json  # the real reading of the fake's lines

        def stderr_tail(self) -> str:
            return ""

        def close(self) -> None:
            pass
    return Remote


def test_the_token_travels_on_stdin_only(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[tuple[str, str, str]] = []
    lines = {"recv": [{"port": 4242}, {"done": True, "id": ID, "digests": [], "bytes": 5}],
             "send": [{"done": True, "id": ID, "digests": [], "bytes": 5, "seconds": 0.1}]}
    monkeypatch.setattr(share, "RemoteProcess", fake_remote(lines, started))
    head, peer = SimpleNamespace(node="spark-a"), SimpleNamespace(node="spark-b")
    got = share.copy_image(head, peer, "192.168.200.13", IMAGE)  # type: ignore[arg-type]
    assert got["id"] == ID and got["source_id"] == ID
    (on_peer, recv_cmd, token), (on_head, send_cmd, token2) = started
    assert (on_peer, on_head) == (peer, head)
    assert token == token2 and len(token) == 32
    assert token not in recv_cmd and token not in send_cmd
    assert '"listen": "192.168.200.13"' in recv_cmd and '"port": 4242' in send_cmd
    assert '"watch": true' in recv_cmd and '"watch": true' in send_cmd


def test_a_sender_that_cannot_connect_is_named_not_the_receivers_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lines = {"recv": [{"port": 4242}, {"error": "io", "message": "the sender never connected"}],
             "send": [{"error": "connect", "message": "ConnectionRefusedError: refused"}]}
    monkeypatch.setattr(share, "RemoteProcess", fake_remote(lines, []))
    head, peer = SimpleNamespace(node="spark-a"), SimpleNamespace(node="spark-b")
    with pytest.raises(SparkctlError, match=r"^spark-a: sending .* to spark-b failed \(connect\): "
                                            r"ConnectionRefusedError: refused$"):
        share.copy_image(head, peer, "192.168.200.13", IMAGE)  # type: ignore[arg-type]


def test_no_node_with_the_image_names_every_reason(inventory: Any, context: Any) -> None:
    inv = inventory()
    cluster = {"spark-a": facts(pulled=False), "spark-b": facts(pulled=False)}
    wanted = {"spark-a": "its pull failed", "spark-b": "its pull failed"}
    ctx = context(inv, "spark-a", cluster, transports={"spark-a": object(), "spark-b": object()},
                  shared=RunState(image_wanted=wanted))
    with pytest.raises(SparkctlError, match=r"no node has .*spark-a: its pull failed; "
                                            r"spark-b: its pull failed"):
        share.ImageShare().apply(ctx, Change("send", payload=wanted))


def test_digests_are_compared_by_image_id_when_a_node_keeps_no_registry_digest(
        inventory: Any, context: Any) -> None:
    inv = inventory()
    loaded = {"spark-a": facts(), "spark-b": facts(digests=[])}
    outcome = c.ImageDigest().check(context(inv, "spark-b", loaded))
    assert isinstance(outcome, Unchanged) and ID in outcome.reason
    other = {"spark-a": facts(), "spark-b": facts(image_id="sha256:" + "8" * 64, digests=[])}
    with pytest.raises(SparkctlError, match="differs between nodes"):
        c.ImageDigest().check(context(inv, "spark-b", other))


# ---------------------------------------------------------------- node/imagecopy.py for real

FAKE_DOCKER = """#!{python}
import json, os, sys
store = os.environ["FAKE_DOCKER_DIR"]
args = sys.argv[1:]
if args[:2] == ["image", "inspect"]:
    path = os.path.join(store, "image")
    if not os.path.exists(path):
        sys.stderr.write("Error: No such image: " + args[2] + "\\n"); sys.exit(1)
    import hashlib
    data = open(path, "rb").read()
    print(json.dumps([{{"Id": "sha256:" + hashlib.sha256(data).hexdigest(),
                       "RepoDigests": ["repo@sha256:" + "1" * 64]}}]))
elif args[0] == "save":
    sys.stdout.buffer.write(open(os.path.join(store, "image"), "rb").read())
elif args[0] == "load":
    data = sys.stdin.buffer.read()
    open(os.path.join(store, "image"), "wb").write(data)
    print("Loaded image: " + args[-1])
"""


def fake_docker(tmp_path: Path, name: str, content: bytes | None) -> dict[str, str]:
    bin_dir, store = tmp_path / name / "bin", tmp_path / name / "store"
    bin_dir.mkdir(parents=True)
    store.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER.format(python=sys.executable))
    (bin_dir / "docker").chmod(0o755)
    if content is not None:
        (store / "image").write_bytes(content)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_DOCKER_DIR": str(store)}


def copy_locally(tmp_path: Path, content: bytes, token: str = "t" * 32,
                 tamper: bool = False) -> tuple[dict[str, Any], dict[str, Any], Path]:
    script = share.IMAGECOPY_SCRIPT  # as the nodes get it (stdin_watch.py in front)
    if tamper:  # the sender alters one byte after hashing: the receiver must notice
        script = script.replace("conn.sendall(FRAME.pack(len(data)) + data)",
                                "conn.sendall(FRAME.pack(len(data)) + data[:-1] + b'X')")
    source_env = fake_docker(tmp_path, "source", content)
    target_env = fake_docker(tmp_path, "target", None)
    receiver = subprocess.Popen(
        [sys.executable, "-c", script, "recv", json.dumps({"listen": "127.0.0.1", "image": "i"})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=target_env)
    assert receiver.stdin is not None and receiver.stdout is not None
    receiver.stdin.write("t" * 32)
    receiver.stdin.close()
    port = json.loads(receiver.stdout.readline())["port"]
    sent = subprocess.run(
        [sys.executable, "-c", script, "send",
         json.dumps({"host": "127.0.0.1", "port": port, "image": "i"})],
        input=token, capture_output=True, text=True, env=source_env, timeout=60)
    final = json.loads(receiver.stdout.read().strip().splitlines()[-1])
    receiver.wait(timeout=30)
    return json.loads(sent.stdout.strip().splitlines()[-1]), final, tmp_path / "target" / "store"


def test_the_image_stream_arrives_whole_and_loads_as_the_same_id(tmp_path: Path) -> None:
    content = os.urandom(9 * 2**20 + 7)  # more than two 4 MiB pieces
    sent, got, store = copy_locally(tmp_path, content)
    assert sent["done"] and got["done"] and got["bytes"] == len(content)
    assert got["id"] == sent["id"] and (store / "image").read_bytes() == content


def test_an_altered_stream_is_refused_and_nothing_is_loaded(tmp_path: Path) -> None:
    sent, got, store = copy_locally(tmp_path, os.urandom(100_000), tamper=True)
    assert got["error"] == "corrupt" and "error" in sent
    assert not (store / "image").exists()


def test_imagecopy_usage(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert imagecopy.main(["x", "nope", "{}"]) == 2
    assert "usage" in capsys.readouterr().err


def test_a_watched_receiver_ends_with_its_docker_load_when_the_controller_goes_away(
        tmp_path: Path) -> None:
    """Ctrl-C on the controller (or a lost SSH connection) closes the receiver's stdin: it
    kills `docker load` and exits at once instead of waiting out the stream."""
    target_env = fake_docker(tmp_path, "target", None)
    receiver = subprocess.Popen(
        [sys.executable, "-c", share.IMAGECOPY_SCRIPT, "recv",
         json.dumps({"listen": "127.0.0.1", "image": "i", "watch": True})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=target_env)
    assert receiver.stdin is not None and receiver.stdout is not None
    receiver.stdin.write("t" * 32 + "\n")
    receiver.stdin.flush()
    # the token is one line: the receiver answers while its stdin stays open
    answered = select.select([receiver.stdout], [], [], 10)[0]
    if not answered:
        receiver.kill()
    assert answered, "the receiver waited for stdin to end before listening"
    port = json.loads(receiver.stdout.readline())["port"]
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"t" * 32 + imagecopy.FRAME.pack(1000) + b"x" * 10)  # mid-frame
        time.sleep(0.5)  # the token is checked and `docker load` runs
        assert receiver.poll() is None
        receiver.stdin.close()  # the controller is gone
        assert receiver.wait(timeout=10) == 9
    time.sleep(0.3)
    # killed, not left to read the end of its input and store what came
    assert not (tmp_path / "target" / "store" / "image").exists()
