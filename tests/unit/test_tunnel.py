"""remote/tunnel.py: a real forward on 127.0.0.1, to a fake SSH channel or over plain TCP."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.errors import SparkctlError
from orchestrator.remote.tunnel import Forwarder


@pytest.fixture
def upper_server() -> Iterator[int]:
    """A TCP server on 127.0.0.1 that answers every chunk upper-cased."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                while data := conn.recv(1024):
                    conn.sendall(data.upper())
    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()


class FakeSSH:
    """paramiko.Transport's open_channel: the 'channel' is a socket to the upper server."""

    def __init__(self, port: int, fail: bool = False) -> None:
        self.port, self.fail = port, fail
        self.opened: list[tuple[Any, ...]] = []

    def open_channel(self, kind: str, dest: tuple[str, int], src: tuple[str, int], timeout: float) -> Any:
        self.opened.append((kind, dest, src[0], timeout))
        if self.fail:
            raise OSError("administratively prohibited")
        return socket.create_connection(("127.0.0.1", self.port))


class FakeClient:
    """paramiko.SSHClient: the connection behind it is the FakeSSH."""

    def __init__(self, ssh: FakeSSH) -> None:
        self.ssh = ssh

    def get_transport(self) -> FakeSSH:
        return self.ssh


class HeadTransport:
    node = "spark-a"

    def __init__(self, ssh: FakeSSH | None) -> None:
        if ssh is not None:  # a local transport (the controller is the head) has no client
            self.client = FakeClient(ssh)


def roundtrip(port: int, payload: bytes) -> bytes:
    """Send, then read until as many bytes came back or the forwarder closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(payload)
        data = b""
        try:
            while len(data) < len(payload) and (chunk := conn.recv(1024)):
                data += chunk
        except ConnectionResetError:
            pass
        return data


def test_forwards_through_the_ssh_channel(upper_server: int) -> None:
    ssh = FakeSSH(upper_server)
    with Forwarder(HeadTransport(ssh), remote_port=8355) as forwarder:  # type: ignore[arg-type]
        assert forwarder.listener.getsockname()[0] == "127.0.0.1"
        assert roundtrip(forwarder.local_port, b"hello spark") == b"HELLO SPARK"
    assert ssh.opened == [("direct-tcpip", ("127.0.0.1", 8355), "127.0.0.1", 10)]


def test_on_the_head_itself_it_is_plain_tcp(upper_server: int) -> None:
    with Forwarder(HeadTransport(None), remote_port=upper_server) as forwarder:  # type: ignore[arg-type]
        assert roundtrip(forwarder.local_port, b"abc") == b"ABC"


def test_a_refused_channel_closes_the_client(upper_server: int) -> None:
    with Forwarder(HeadTransport(FakeSSH(upper_server, fail=True)), remote_port=1) as forwarder:  # type: ignore[arg-type]
        assert roundtrip(forwarder.local_port, b"x") == b""


def test_a_busy_local_port_is_a_clear_error() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        with pytest.raises(SparkctlError, match=r"cannot listen on 127.0.0.1:\d+: .*--local-port"):
            Forwarder(HeadTransport(None), remote_port=1, local_port=taken.getsockname()[1])  # type: ignore[arg-type]
    finally:
        taken.close()
