"""remote/connect.py and SSHTransport against a real paramiko SSH server on 127.0.0.1.

The server accepts one client key, runs `echo`-like commands (it answers "ran: COMMAND" and the
exit status the command names), and can be told to refuse every key.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest

from orchestrator.errors import HostKeyError, InputError, TransportError
from orchestrator.inventory_checks import inventory_from_data
from orchestrator.remote import connect, sshkeys
from orchestrator.remote.transport import LocalTransport, SSHTransport, SudoPassword


def _client_key() -> tuple[str, paramiko.PKey]:
    """An ed25519 key in OpenSSH format, the kind `cluster.ssh_key` names in practice."""
    import subprocess
    import tempfile

    path = Path(tempfile.mkdtemp()) / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.read_text(), paramiko.Ed25519Key.from_private_key_file(str(path))


CLIENT_TEXT, CLIENT_KEY = _client_key()
SERVER_KEY = paramiko.RSAKey.generate(1024)
OTHER_KEY = paramiko.RSAKey.generate(1024)


class Server(paramiko.ServerInterface):
    def __init__(self, accept: bool) -> None:
        self.accept = accept

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        if self.accept and key.get_base64() == CLIENT_KEY.get_base64():
            return paramiko.AUTH_SUCCESSFUL
        return paramiko.AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        def answer() -> None:
            text = command.decode()
            data = b""
            while True:
                chunk = channel.recv(1024)
                if not chunk:
                    break
                data += chunk
            channel.sendall(f"ran: {text}\n".encode() + data)
            channel.sendall_stderr(b"on stderr\n")
            status = int(text.split("exit ")[-1]) if "exit " in text else 0
            channel.send_exit_status(status)
            channel.close()
        threading.Thread(target=answer, daemon=True).start()
        return True


class SSHServer:
    def __init__(self, host_key: paramiko.PKey = SERVER_KEY, accept: bool = True) -> None:
        self.host_key = host_key
        self.accept = accept
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.transports: list[paramiko.Transport] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            transport = paramiko.Transport(client)
            transport.add_server_key(self.host_key)
            self.transports.append(transport)
            with contextlib.suppress(paramiko.SSHException, EOFError, OSError):
                transport.start_server(server=Server(self.accept))

    def close(self) -> None:
        self.sock.close()
        for transport in self.transports:
            transport.close()


@pytest.fixture(autouse=True)
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test reads the real ~/.ssh or talks to a real ssh-agent; passphrases never prompt."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setattr(sshkeys, "KEYS", sshkeys.KeyStore(prompt=False))
    return home


@pytest.fixture
def server() -> Iterator[SSHServer]:
    s = SSHServer()
    yield s
    s.close()


def setup(tmp_path: Path, port: int, known: paramiko.PKey | None = None, host: str = "127.0.0.1") -> Any:
    key = tmp_path / "id_rsa"
    key.write_text(CLIENT_TEXT)
    key.chmod(0o600)
    known_hosts = tmp_path / "known_hosts"
    if known is not None:
        known_hosts.write_text(f"[127.0.0.1]:{port} {known.get_name()} {known.get_base64()}\n")
    inv = inventory_from_data({
        "cluster": {"name": "c", "ssh_key": str(key), "known_hosts": str(known_hosts), "ssh_port": port,
                    "user": "nvidia", "connect_timeout": 5},
        "nodes": [{"name": "spark-a", "host": host}],
    }, str(tmp_path / "inv.yml"))
    return inv, known_hosts


def open_ssh(inv: Any, trust: bool = False) -> SSHTransport:
    return connect.open_ssh(inv, inv.node("spark-a"), SudoPassword(prompt=False), trust, threading.Lock())


def test_an_unknown_host_key_is_refused(tmp_path: Path, server: SSHServer) -> None:
    inv, known_hosts = setup(tmp_path, server.port, known=None)
    known_hosts.write_text("")
    with pytest.raises(HostKeyError, match=r"host key is not in known_hosts \(.*known_hosts\); refusing"):
        open_ssh(inv)
    assert server.connections == 1  # not retried


def test_a_missing_known_hosts_file_is_refused_before_connecting(tmp_path: Path, server: SSHServer) -> None:
    inv, _ = setup(tmp_path, server.port, known=None)
    with pytest.raises(HostKeyError, match="no known_hosts file exists"):
        open_ssh(inv)
    assert server.connections == 0


def test_trust_new_hosts_pins_the_key_and_connects(tmp_path: Path, server: SSHServer) -> None:
    inv, known_hosts = setup(tmp_path, server.port, known=None)
    transport = open_ssh(inv, trust=True)
    try:
        assert isinstance(transport, SSHTransport)
        pinned = known_hosts.read_text()
        assert pinned == f"[127.0.0.1]:{server.port} ssh-rsa {SERVER_KEY.get_base64()}\n"
        assert known_hosts.stat().st_mode & 0o777 in (0o600, 0o644)
        result = transport.run("echo hi", stdin="in\n")
        assert result.ok and result.stdout == "ran: echo hi\nin\n" and result.stderr == "on stderr\n"
        assert transport.run("exit 3").exit_status == 3
        assert transport.commands_sent == 2
    finally:
        transport.close()
    # the pinned key is now verified without --trust-new-hosts
    open_ssh(inv).close()


def test_a_changed_host_key_is_refused_with_both_fingerprints(tmp_path: Path, server: SSHServer) -> None:
    inv, _ = setup(tmp_path, server.port, known=OTHER_KEY)
    with pytest.raises(HostKeyError) as raised:
        open_ssh(inv, trust=True)
    message = str(raised.value)
    assert "HOST KEY CHANGED" in message and "--trust-new-hosts never overrides" in message
    assert f"expected {connect._fingerprint(OTHER_KEY)}" in message
    assert f"got {connect._fingerprint(SERVER_KEY)}" in message
    assert server.connections == 1


def test_a_refused_client_key_is_not_retried(tmp_path: Path) -> None:
    s = SSHServer(accept=False)
    try:
        inv, _ = setup(tmp_path, s.port, known=SERVER_KEY)
        refused = r"authentication failed: the server refused key file .*id_rsa"
        with pytest.raises(TransportError, match=refused):
            open_ssh(inv)
        assert s.connections == 1
    finally:
        s.close()


def test_connection_errors_are_retried_then_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there
    inv, _ = setup(tmp_path, port, known=SERVER_KEY)
    attempts: list[str] = []
    real = paramiko.SSHClient.connect

    def counting(self: paramiko.SSHClient, *args: Any, **kwargs: Any) -> None:
        attempts.append(args[0])
        real(self, *args, **kwargs)
    monkeypatch.setattr(paramiko.SSHClient, "connect", counting)
    with pytest.raises(TransportError, match=f"cannot reach 127.0.0.1:{port}"):
        open_ssh(inv)
    assert len(attempts) == 3


def test_ssh_protocol_errors_are_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv, _ = setup(tmp_path, 22, known=SERVER_KEY)
    attempts: list[int] = []

    def broken(self: paramiko.SSHClient, *args: Any, **kwargs: Any) -> None:
        attempts.append(1)
        raise paramiko.SSHException("Error reading SSH protocol banner")
    monkeypatch.setattr(paramiko.SSHClient, "connect", broken)
    with pytest.raises(TransportError, match=r"SSH to 127.0.0.1:22 failed: Error reading SSH protocol"):
        open_ssh(inv)
    assert len(attempts) == 3


def test_a_missing_private_key_is_bad_input(tmp_path: Path) -> None:
    inv, _ = setup(tmp_path, 22, known=SERVER_KEY)
    (tmp_path / "id_rsa").unlink()
    with pytest.raises(InputError, match=r"cluster.ssh_key: .*id_rsa does not exist"):
        open_ssh(inv)


def test_a_lost_connection_is_a_transport_error(tmp_path: Path, server: SSHServer) -> None:
    inv, _ = setup(tmp_path, server.port, known=SERVER_KEY)
    transport = open_ssh(inv)
    transport.close()
    with pytest.raises(TransportError, match="the SSH connection was lost"):
        transport.run("echo hi")


def test_connect_all_reports_each_node(tmp_path: Path, server: SSHServer) -> None:
    inv, _ = setup(tmp_path, server.port, known=SERVER_KEY)
    data = {"cluster": {"name": "c", "ssh_key": str(tmp_path / "id_rsa"),
                        "known_hosts": str(tmp_path / "known_hosts"), "ssh_port": server.port,
                        "connect_timeout": 5},
            "nodes": [{"name": "spark-a", "host": "127.0.0.1"}, {"name": "spark-b", "host": "192.0.2.1"}]}
    inv = inventory_from_data(data, str(tmp_path / "inv.yml"))

    def fake_open(inventory: Any, node: Any, *args: Any) -> Any:
        raise TransportError(f"{node.name}: cannot reach {node.host}")
    import orchestrator.remote.connect as module
    original = module.open_ssh
    module.open_ssh = fake_open  # type: ignore[assignment]
    try:
        transports, errors = connect.connect_all(inv, inv.nodes, SudoPassword(prompt=False))
    finally:
        module.open_ssh = original
    assert isinstance(transports["spark-a"], LocalTransport)  # 127.0.0.1 is this machine
    assert errors == {"spark-b": "spark-b: cannot reach 192.0.2.1"}


def test_connect_all_stops_on_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv, _ = setup(tmp_path, 22, known=SERVER_KEY, host="192.0.2.1")
    (tmp_path / "id_rsa").unlink()
    with pytest.raises(InputError):
        connect.connect_all(inv, inv.nodes, SudoPassword(prompt=False))
