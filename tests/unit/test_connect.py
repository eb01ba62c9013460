"""remote/connect.py and SSHTransport against a real paramiko SSH server on 127.0.0.1.

The server accepts one client key, runs `echo`-like commands (it answers "ran: COMMAND" and the
exit status the command names), and can be told to refuse every key.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest

from orchestrator.errors import HostKeyError, InputError, TransportError
from orchestrator.inventory_checks import inventory_from_data
from orchestrator.remote import connect, sshkeys
from orchestrator.remote.sshconfig import resolve
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
            if text.startswith("refuse"):  # as `sudo -n` does: ends without reading stdin
                time.sleep(0.2)  # after the exec reply, as sshd: the client is sending by then
                channel.sendall_stderr(b"sudo: a password is required\n")
                channel.send_exit_status(1)
                channel.close()
                return
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
            server = self.server()
            with contextlib.suppress(paramiko.SSHException, EOFError, OSError):
                transport.start_server(server=server)
            self.started(transport, server)

    def server(self) -> Server:
        return Server(self.accept)

    def started(self, transport: paramiko.Transport, server: Server) -> None:
        """A hook: what else the server does with a connection once SSH runs on it."""

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
        with pytest.raises(TransportError, match=refused) as raised:
            open_ssh(inv)
        assert s.connections == 1
        # the hint names the key and the user, as the user would have to type it
        key = tmp_path / "id_rsa"
        assert f"(`ssh-copy-id -i {key}.pub -p {s.port} nvidia@127.0.0.1`)" in str(raised.value)
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


def test_a_command_that_ends_without_reading_its_input_reports_its_own_status(
        tmp_path: Path, server: SSHServer) -> None:
    inv, _ = setup(tmp_path, server.port, known=SERVER_KEY)
    transport = open_ssh(inv)
    try:
        # more than the channel's window: sending blocks until the server closes the channel
        result = transport.run("refuse", stdin=b"x" * (8 << 20))
        assert (result.exit_status, result.stderr) == (1, "sudo: a password is required\n")
        assert transport.run("echo still usable").stdout == "ran: echo still usable\n"
    finally:
        transport.close()


def test_feeding_a_remote_process_that_already_ended_keeps_its_own_words(
        tmp_path: Path, server: SSHServer) -> None:
    from orchestrator.remote.pipe import RemoteProcess

    inv, _ = setup(tmp_path, server.port, known=SERVER_KEY)
    transport = open_ssh(inv)
    try:
        process = RemoteProcess(transport, "refuse", "refuse")
        process.feed("x" * (8 << 20))
        assert process.readline() == ""
        assert "a password is required" in process.stderr_tail()
    finally:
        transport.close()


def test_connect_all_reports_each_node(tmp_path: Path, server: SSHServer) -> None:
    inv, _ = setup(tmp_path, server.port, known=SERVER_KEY)
    data = {"cluster": {"name": "c", "ssh_key": str(tmp_path / "id_rsa"),
                        "known_hosts": str(tmp_path / "known_hosts"), "ssh_port": server.port,
                        "connect_timeout": 5},
            "nodes": [{"name": "spark-a", "host": "127.0.0.1"}, {"name": "spark-b", "host": "192.0.2.1"}]}
    inv = inventory_from_data(data, str(tmp_path / "inv.yml"))

    def fake_open(route: Any, *args: Any) -> Any:
        raise TransportError(f"{route.node}: cannot reach {route.target.hostname}")
    import orchestrator.remote.connect as module
    original = module.open_route_ssh
    module.open_route_ssh = fake_open  # type: ignore[assignment]
    try:
        transports, errors = connect.connect_all(inv, inv.nodes, SudoPassword(prompt=False))
    finally:
        module.open_route_ssh = original
    assert isinstance(transports["spark-a"], LocalTransport)  # 127.0.0.1 is this machine
    assert errors == {"spark-b": "spark-b: cannot reach 192.0.2.1"}


def test_connect_all_stops_on_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv, _ = setup(tmp_path, 22, known=SERVER_KEY, host="192.0.2.1")
    (tmp_path / "id_rsa").unlink()
    with pytest.raises(InputError):
        connect.connect_all(inv, inv.nodes, SudoPassword(prompt=False))


# ---------------------------------------------------------------- ssh_config, agent, jumps


class JumpServer(SSHServer):
    """An SSH server that also forwards direct-tcpip channels, as a jump host's sshd does."""

    def server(self) -> Server:
        return ForwardingServer(self.accept)

    def started(self, transport: paramiko.Transport, server: Server) -> None:
        assert isinstance(server, ForwardingServer)
        threading.Thread(target=self._forward, args=(transport, server), daemon=True).start()

    def _forward(self, transport: paramiko.Transport, server: ForwardingServer) -> None:
        while transport.is_active():
            channel = transport.accept(1)
            if channel is None or channel.get_id() not in server.forwards:
                continue
            self.forwarded = [*getattr(self, "forwarded", []), server.forwards[channel.get_id()]]
            try:
                upstream = socket.create_connection(server.forwards[channel.get_id()], timeout=5)
            except OSError:
                channel.close()
                continue
            threading.Thread(target=_pump, args=(channel, upstream), daemon=True).start()


class ForwardingServer(Server):
    def __init__(self, accept: bool) -> None:
        super().__init__(accept)
        self.forwards: dict[int, tuple[str, int]] = {}

    def check_channel_direct_tcpip_request(self, chanid: int, origin: Any, destination: Any) -> int:
        self.forwards[chanid] = (destination[0], destination[1])
        return paramiko.OPEN_SUCCEEDED


def _pump(channel: paramiko.Channel, upstream: socket.socket) -> None:
    import select

    try:
        while True:
            ready, _, _ = select.select([channel, upstream], [], [], 1.0)
            if channel in ready:
                data = channel.recv(65536)
                if not data:
                    break
                upstream.sendall(data)
            if upstream in ready:
                data = upstream.recv(65536)
                if not data:
                    break
                channel.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(EOFError, OSError):  # the client may be gone already
            channel.close()
        upstream.close()


def config_inventory(tmp_path: Path, config: str, known: str, host: str = "spark-a",
                     **cluster: Any) -> Any:
    (tmp_path / "ssh_config").write_text(config)
    (tmp_path / "known_hosts").write_text(known)
    return inventory_from_data({
        "cluster": {"name": "c", "ssh_config": str(tmp_path / "ssh_config"),
                    "known_hosts": str(tmp_path / "known_hosts"), **cluster},
        "nodes": [{"name": "spark-a", "host": host}],
    }, str(tmp_path / "inv.yml"))


def write_key(path: Path, passphrase: str | None = None) -> None:
    """CLIENT_KEY as an OpenSSH private key file, encrypted when a passphrase is given (written
    in-process: a passphrase never appears on a command line)."""
    from cryptography.hazmat.primitives import serialization

    private = serialization.load_ssh_private_key(CLIENT_TEXT.encode(), None)
    encryption = (serialization.BestAvailableEncryption(passphrase.encode()) if passphrase
                  else serialization.NoEncryption())
    path.write_bytes(private.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.OpenSSH, encryption))
    path.chmod(0o600)


def test_an_ssh_config_alias_is_resolved_and_used(tmp_path: Path, server: SSHServer,
                                                  private_home: Path) -> None:
    write_key(private_home / ".ssh" / "id_spark")
    inv = config_inventory(tmp_path, (
        "Host spark-*\n  User nvidia\n  IdentityFile ~/.ssh/id_spark\n  ServerAliveInterval 7\n"
        f"Host spark-a\n  HostName 127.0.0.1\n  Port {server.port}\n  StrictHostKeyChecking no\n"
    ), f"[127.0.0.1]:{server.port} ssh-rsa {SERVER_KEY.get_base64()}\n")
    route = resolve(inv, inv.node("spark-a"))
    target = route.target
    assert (target.hostname, target.port, target.user) == ("127.0.0.1", server.port, "nvidia")
    assert [k.source for k in route.target.key_files] == ["ssh_config"]
    assert route.target.keepalive == 7 and route.jumps == ()
    assert any("StrictHostKeyChecking no" in w and "ignored" in w for w in route.warnings)
    transport = open_ssh(inv)
    try:
        assert transport.run("echo via alias").stdout.startswith("ran: echo via alias")
    finally:
        transport.close()


def test_inventory_values_win_over_ssh_config(tmp_path: Path) -> None:
    inv = config_inventory(tmp_path, "Host spark-a\n  HostName 10.0.0.1\n  Port 2222\n  User bob\n"
                           "  ProxyJump jump\n  ConnectTimeout 3\n", "",
                           ssh_port=22, user="nvidia", proxy_jump="none")
    route = resolve(inv, inv.node("spark-a"))
    assert (route.target.hostname, route.target.port, route.target.user) == ("10.0.0.1", 22, "nvidia")
    assert route.jumps == () and route.target.connect_timeout == 3.0


def test_hashed_user_known_hosts_entries_verify_the_host(tmp_path: Path, server: SSHServer,
                                                         private_home: Path) -> None:
    hashed = paramiko.HostKeys.hash_host(f"[127.0.0.1]:{server.port}")
    (private_home / ".ssh" / "known_hosts").write_text(f"{hashed} ssh-rsa {SERVER_KEY.get_base64()}\n")
    write_key(private_home / ".ssh" / "id_ed25519")  # a default key: nothing names one
    inv = config_inventory(tmp_path, "", "", host="127.0.0.2", ssh_port=server.port)
    inv = inv.model_copy(update={"nodes": [inv.nodes[0].model_copy(update={"host": "127.0.0.1"})]})
    route = resolve(inv, inv.node("spark-a"))
    assert [k.source for k in route.target.key_files] == ["default"]
    open_ssh(inv).close()
    assert (tmp_path / "known_hosts").read_text() == "", "nothing pinned: the user's file knew it"


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A real ssh-agent holding CLIENT_KEY only: the key file is deleted after `ssh-add`."""
    import os
    import signal
    import subprocess
    import time

    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        key = tmp_path / "agent_only"
        write_key(key)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", "-q", str(key)], env=env, check=True, capture_output=True)
        key.unlink()
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        yield sock
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(5)


def test_an_agent_only_key_logs_in_without_any_key_file(tmp_path: Path, server: SSHServer,
                                                       agent: Path) -> None:
    inv = config_inventory(tmp_path, f"Host spark-a\n  HostName 127.0.0.1\n  Port {server.port}\n",
                           f"[127.0.0.1]:{server.port} ssh-rsa {SERVER_KEY.get_base64()}\n")
    assert resolve(inv, inv.node("spark-a")).target.key_files == ()
    transport = open_ssh(inv)
    try:
        assert transport.run("echo agent").ok
    finally:
        transport.close()


def test_identities_only_keeps_other_agent_keys_out(tmp_path: Path, server: SSHServer, agent: Path,
                                                    private_home: Path) -> None:
    other = private_home / ".ssh" / "other"
    other.write_text(paramiko_key_text())
    other.chmod(0o600)
    inv = config_inventory(tmp_path, f"Host spark-a\n  HostName 127.0.0.1\n  Port {server.port}\n"
                           "  IdentityFile ~/.ssh/other\n  IdentitiesOnly yes\n",
                           f"[127.0.0.1]:{server.port} ssh-rsa {SERVER_KEY.get_base64()}\n")
    with pytest.raises(connect.AuthError, match=r"refused key file .*other"):
        open_ssh(inv)


def paramiko_key_text() -> str:
    import io

    out = io.StringIO()
    paramiko.RSAKey.generate(1024).write_private_key(out)
    return out.getvalue()


def test_no_key_at_all_says_what_to_do(tmp_path: Path, server: SSHServer) -> None:
    inv = config_inventory(tmp_path, f"Host spark-a\n  HostName 127.0.0.1\n  Port {server.port}\n",
                           f"[127.0.0.1]:{server.port} ssh-rsa {SERVER_KEY.get_base64()}\n")
    with pytest.raises(connect.AuthError, match=r"no key to offer: .*no ssh-agent.*ssh-add"):
        open_ssh(inv)


def test_a_passphrase_is_asked_once_and_shared_across_nodes(
        tmp_path: Path, server: SSHServer, private_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_key(private_home / ".ssh" / "id_ed25519", passphrase="pass-phrase-42")
    asked: list[str] = []

    def answer(prompt: str) -> str:
        asked.append(prompt)
        return "pass-phrase-42"
    monkeypatch.setattr(sshkeys.getpass, "getpass", answer)
    keys = sshkeys.KeyStore(prompt=True)
    monkeypatch.setattr(sshkeys, "KEYS", keys)
    inv = config_inventory(tmp_path, f"Host spark-*\n  HostName 127.0.0.1\n  Port {server.port}\n",
                           f"[127.0.0.1]:{server.port} ssh-rsa {SERVER_KEY.get_base64()}\n")
    for _ in range(2):
        open_ssh(inv).close()
    assert len(asked) == 1 and "id_ed25519" in asked[0] and "pass-phrase-42" not in asked[0]


def test_a_passphrase_key_without_a_terminal_names_the_file_and_ssh_add(
        tmp_path: Path, server: SSHServer, private_home: Path) -> None:
    write_key(private_home / ".ssh" / "id_ed25519", passphrase="pass-phrase-42")
    inv = config_inventory(tmp_path, f"Host spark-a\n  HostName 127.0.0.1\n  Port {server.port}\n",
                           f"[127.0.0.1]:{server.port} ssh-rsa {SERVER_KEY.get_base64()}\n")
    with pytest.raises(connect.AuthError) as raised:
        open_ssh(inv)
    assert "protected by a passphrase and no terminal" in str(raised.value)
    assert f"ssh-add {private_home / '.ssh' / 'id_ed25519'}" in str(raised.value)
    # the key was never offered: the server refused nothing, and no authorized_keys advice
    assert "no key could be offered" in str(raised.value)
    assert "refused" not in str(raised.value) and "authorized_keys" not in str(raised.value)


@pytest.fixture
def jump() -> Iterator[JumpServer]:
    s = JumpServer(host_key=OTHER_KEY)
    yield s
    s.close()


def jump_inventory(tmp_path: Path, jump: JumpServer, server: SSHServer, jump_key: paramiko.PKey) -> Any:
    key = tmp_path / "id"
    write_key(key)
    return config_inventory(
        tmp_path, f"Host gateway\n  HostName 127.0.0.1\n  Port {jump.port}\n  User alice\n",
        f"[127.0.0.1]:{jump.port} ssh-rsa {jump_key.get_base64()}\n"
        f"spark-target ssh-rsa {SERVER_KEY.get_base64()}\n",
        host="127.0.0.1", ssh_key=str(key), ssh_port=server.port, proxy_jump="gateway")


def test_a_jump_host_carries_the_connection(tmp_path: Path, server: SSHServer, jump: JumpServer) -> None:
    inv = jump_inventory(tmp_path, jump, server, OTHER_KEY)
    known = tmp_path / "known_hosts"
    known.write_text(known.read_text().replace("spark-target", f"[127.0.0.1]:{server.port}"))
    route = resolve(inv, inv.node("spark-a"))
    assert [h.describe() for h in route.hops] == [f"alice@127.0.0.1:{jump.port}",
                                                 f"nvidia@127.0.0.1:{server.port}"]
    transport = open_ssh(inv)
    try:
        assert transport.run("echo through").stdout.startswith("ran: echo through")
        assert jump.forwarded == [("127.0.0.1", server.port)] and server.connections == 1
        assert len(transport.jumps) == 1
    finally:
        transport.close()
    assert not transport.jumps[0].get_transport() or not transport.jumps[0].get_transport().is_active()


def test_a_wrong_host_key_on_the_jump_host_is_refused(tmp_path: Path, server: SSHServer,
                                                      jump: JumpServer) -> None:
    inv = jump_inventory(tmp_path, jump, server, SERVER_KEY)  # pinned: not the jump's real key
    with pytest.raises(HostKeyError,
                       match=rf"HOST KEY CHANGED for the jump host alice@127.0.0.1:{jump.port}"):
        open_ssh(inv, trust=True)
    assert server.connections == 0, "nothing went past the jump host"


def test_a_jump_host_that_does_not_answer_is_named_the_jump_host(
        tmp_path: Path, server: SSHServer) -> None:
    """Behind a jump host, a failure there must say so: its address alone reads as the node's."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    gone = JumpServer.__new__(JumpServer)
    gone.port = closed.getsockname()[1]
    closed.close()  # nothing listens on the jump's port
    inv = jump_inventory(tmp_path, gone, server, OTHER_KEY)
    with pytest.raises(TransportError) as raised:
        open_ssh(inv)
    assert f"spark-a: cannot reach the jump host 127.0.0.1:{gone.port}" in str(raised.value)
    assert server.connections == 0


def test_an_unknown_node_key_behind_a_jump_is_refused(tmp_path: Path, server: SSHServer,
                                                      jump: JumpServer) -> None:
    inv = jump_inventory(tmp_path, jump, server, OTHER_KEY)  # the node's line names another host
    with pytest.raises(HostKeyError, match=r"nvidia@127.0.0.1:\d+'s host key is not in known_hosts"):
        open_ssh(inv)
    assert jump.forwarded == [("127.0.0.1", server.port)]


def test_a_proxy_command_is_the_socket(tmp_path: Path, server: SSHServer, private_home: Path) -> None:
    import sys

    write_key(private_home / ".ssh" / "id_ed25519")
    relay = (f"{sys.executable} -c \"import socket,sys,threading;s=socket.create_connection(('%h',%p));"
             "threading.Thread(target=lambda:[sys.stdout.buffer.write(d) or sys.stdout.flush() "
             "for d in iter(lambda:s.recv(65536),b'')],daemon=True).start();"
             "[s.sendall(d) for d in iter(lambda:sys.stdin.buffer.read1(65536),b'')]\"")
    inv = config_inventory(tmp_path, f"Host spark-a\n  HostName 127.0.0.1\n  Port {server.port}\n"
                           f"  ProxyCommand {relay}\n",
                           f"[127.0.0.1]:{server.port} ssh-rsa {SERVER_KEY.get_base64()}\n")
    transport = open_ssh(inv)
    try:
        assert transport.run("echo proxied").ok
    finally:
        transport.close()


def test_doctor_explains_each_step(tmp_path: Path, server: SSHServer, agent: Path) -> None:
    from orchestrator.netcheck.ssh_doctor import diagnose

    inv = config_inventory(tmp_path, f"Host spark-a\n  HostName 127.0.0.1\n  Port {server.port}\n", "")
    report = diagnose(inv, inv.nodes)["nodes"]["spark-a"]
    res = report["resolution"]
    resolved = (res["host"], res["port"], res["user"], res["agent"])
    assert resolved == ("127.0.0.1", server.port, "nvidia", "1 key(s)")
    assert [(s["step"], s["status"]) for s in report["steps"]] == [("tcp", "ok"), ("host key", "fail")]
    assert "--trust-new-hosts" in report["steps"][1]["fix"] and "ssh-keyscan" in report["steps"][1]["detail"]
    (tmp_path / "known_hosts").write_text(f"[127.0.0.1]:{server.port} ssh-rsa {SERVER_KEY.get_base64()}\n")
    report = diagnose(inv, inv.nodes)["nodes"]["spark-a"]
    assert [(s["step"], s["status"]) for s in report["steps"]] == [
        ("tcp", "ok"), ("host key", "ok"), ("auth", "ok"), ("sudo", "ok")]
    assert "agent key SHA256:" in report["steps"][2]["detail"] and report["ok"]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there
    inv = config_inventory(tmp_path, f"Host spark-a\n  HostName 127.0.0.1\n  Port {port}\n", "")
    report = diagnose(inv, inv.nodes)["nodes"]["spark-a"]
    assert report["steps"][0]["status"] == "fail" and "ssh -v spark-a" in report["steps"][0]["fix"]


KNOWN = "[127.0.0.1]:{port} ssh-rsa " + SERVER_KEY.get_base64() + "\n"


def doctor_steps(inv: Any) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    from orchestrator.netcheck.ssh_doctor import diagnose

    report = diagnose(inv, inv.nodes)["nodes"]["spark-a"]
    return report, [(s["step"], s["status"]) for s in report["steps"]]


def test_doctor_names_the_fix_for_each_refused_login(tmp_path: Path, server: SSHServer,
                                                     private_home: Path) -> None:
    config = f"Host spark-a\n  HostName 127.0.0.1\n  Port {server.port}\n"
    # no key anywhere, no agent
    report, steps = doctor_steps(config_inventory(tmp_path, config, KNOWN.format(port=server.port)))
    assert steps == [("tcp", "ok"), ("host key", "ok"), ("auth", "fail")]
    assert report["resolution"]["agent"] == "no agent ($SSH_AUTH_SOCK unset)"
    assert report["steps"][2]["fix"].startswith("name a key (cluster.ssh_key or IdentityFile)")
    assert report["ok"] is False

    # a key the node does not accept: authorized_keys
    refusing = SSHServer(accept=False)
    try:
        write_key(private_home / ".ssh" / "id_ed25519")
        inv = config_inventory(tmp_path, f"Host spark-a\n  HostName 127.0.0.1\n  Port {refusing.port}\n",
                               KNOWN.format(port=refusing.port))
        report, steps = doctor_steps(inv)
    finally:
        refusing.close()
    assert steps == [("tcp", "ok"), ("host key", "ok"), ("auth", "fail")]
    assert report["steps"][2]["fix"] == (
        "add your public key to ~nvidia/.ssh/authorized_keys (`ssh-copy-id -i "
        f"{private_home / '.ssh' / 'id_ed25519'}.pub -p {refusing.port} nvidia@127.0.0.1`)")


def test_doctor_through_a_proxy_command_skips_tcp_and_judges_sudo(
        tmp_path: Path, server: SSHServer, private_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.remote.transport import Result

    write_key(private_home / ".ssh" / "id_ed25519")
    inv = config_inventory(tmp_path, f"Host spark-a\n  HostName 127.0.0.1\n  Port {server.port}\n",
                           KNOWN.format(port=server.port))
    answers: list[Any] = []

    def sudo_answer(self: Any, command: str, **kwargs: Any) -> Result:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return Result("spark-a", command, answer[0], "", answer[1], 0.0)
    monkeypatch.setattr(SSHTransport, "run", sudo_answer)

    answers.append((1, "sudo: a password is required\n"))
    report, steps = doctor_steps(inv)
    assert steps[-1] == ("sudo", "warn") and report["ok"] is True  # a warning, not a failure
    assert "sudo_password_file" in report["steps"][-1]["fix"] and "for nvidia" in report["steps"][-1]["fix"]
    assert report["steps"][1]["detail"].startswith(f"ssh-rsa known in {tmp_path / 'known_hosts'}")

    answers.append((1, "nvidia is not in the sudoers file.\n"))
    report, steps = doctor_steps(inv)
    assert steps[-1] == ("sudo", "fail") and report["ok"] is False
    assert report["steps"][-1]["detail"] == "nvidia is not in the sudoers file."
    assert report["steps"][-1]["fix"] == "nvidia must be allowed to sudo on the node"

    answers.append(TransportError("spark-a: the connection dropped"))
    report, steps = doctor_steps(inv)
    assert steps[-1] == ("sudo", "fail") and "connection dropped" in report["steps"][-1]["detail"]

    import sys

    relay = (f"{sys.executable} -c \"import socket,sys,threading;s=socket.create_connection(('%h',%p));"
             "threading.Thread(target=lambda:[sys.stdout.buffer.write(d) or sys.stdout.flush() "
             "for d in iter(lambda:s.recv(65536),b'')],daemon=True).start();"
             "[s.sendall(d) for d in iter(lambda:sys.stdin.buffer.read1(65536),b'')]\"")
    root = config_inventory(tmp_path, f"Host spark-a\n  HostName 127.0.0.1\n  Port {server.port}\n"
                            f"  User root\n  ProxyCommand {relay}\n", KNOWN.format(port=server.port))
    report, steps = doctor_steps(root)
    assert steps == [("tcp", "skip"), ("host key", "ok"), ("auth", "ok"), ("sudo", "ok")]
    assert report["steps"][0]["detail"].startswith("through ProxyCommand `")
    assert report["steps"][-1]["detail"] == "logged in as root" and answers == []
    assert report["resolution"]["proxy_command"] is not None


def test_doctor_ssh_command_prints_json_or_the_explanation(tmp_path: Path, server: SSHServer,
                                                           private_home: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    import yaml
    from click.testing import CliRunner

    from orchestrator.cli import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(tmp_path / "state"))
    write_key(private_home / ".ssh" / "id_ed25519")
    (tmp_path / "ssh_config").write_text(f"Host spark-a\n  HostName 127.0.0.1\n  Port {server.port}\n"
                                         "Host spark-b\n  HostName 127.0.0.1\n  Port 1\n")
    (tmp_path / "known_hosts").write_text(KNOWN.format(port=server.port))
    (tmp_path / "inv.yml").write_text(yaml.safe_dump({
        "cluster": {"name": "c", "ssh_config": str(tmp_path / "ssh_config"),
                    "known_hosts": str(tmp_path / "known_hosts")},
        "nodes": [{"name": "spark-a", "host": "spark-a"}, {"name": "spark-b", "host": "spark-b"}]}))

    one = CliRunner().invoke(cli, ["doctor", "ssh", "-i", "inv.yml", "--node", "spark-a", "--json"])
    assert one.exit_code == 0, one.output
    doc = json.loads(one.stdout)
    assert doc["ok"] is True and list(doc["nodes"]) == ["spark-a"]
    assert [s["status"] for s in doc["nodes"]["spark-a"]["steps"]] == ["ok", "ok", "ok", "ok"]

    both = CliRunner().invoke(cli, ["doctor", "ssh", "-i", "inv.yml"])
    assert both.exit_code == 1
    out = both.stdout
    assert (f"connects to nvidia@127.0.0.1:{server.port} (host ssh_config, user default, "
            "port ssh_config)") in out
    assert "ssh-agent: no agent ($SSH_AUTH_SOCK unset)" in out
    assert "fix: check HostName/port of spark-b" in out
    assert "some nodes cannot be reached as sparkctl needs" in out

    fine = CliRunner().invoke(cli, ["doctor", "ssh", "-i", "inv.yml", "-n", "spark-a"])
    assert fine.exit_code == 0 and "every node is reachable" in fine.stdout
