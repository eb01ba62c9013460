"""SSH connections kept open between runs, as OpenSSH's ControlPersist keeps a master.

A run that connected to a node itself hands the node's route to the keeper when it ends: a
process of sparkctl's own (remote/keeper_process.py), started detached, that opens its own
connection along that route and holds it. A run that starts within `SPARKCTL_SSH_PERSIST`
seconds (default 60; 0 turns keeping off) of the keeper's last use sends its commands through
the keeper over a unix socket in the state directory: no SSH import, no key exchange, no
authentication, one channel round trip. What the run does on the node is the same command with
the same stdin, exit status and output; a node the keeper no longer reaches (rebooted, cable
cut) is connected to directly, as before, when the keeper cannot open a channel in
`OPEN_SECONDS`. Streams and port forwards (`client`) open a direct connection when first used.

What it trusts, like ControlMaster: a connection's host key was verified (pinned file and
known_hosts, reject policy, never --trust-new-hosts) and its login done without a prompt (agent
or unencrypted key files; a key that needs a passphrase is never kept) when the keeper opened
it. A route is kept under a key made of the route itself (host, port, user, jump hosts,
ProxyCommand, key and known_hosts files) and the identity (inode, size, mtime) of every file
it reads: change the inventory, ssh_config, a key or a known_hosts file and the next run
connects afresh. A host key rotated on a node while a connection is kept is seen by the next
fresh connection (`sparkctl disconnect` closes every kept one). The socket's directory is
0700 and the keeper serves only its own user (SO_PEERCRED); it logs node names and events,
never a command's stdin (sudo passwords travel there).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import socket
import struct
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from orchestrator.errors import TransportError
from orchestrator.remote.transport import SSHTransport, SudoPassword, _SudoMixin

if TYPE_CHECKING:
    from orchestrator.remote.sshconfig import Route

PERSIST_ENV = "SPARKCTL_SSH_PERSIST"
DEFAULT_SECONDS = 60.0
OPEN_SECONDS = 3.0
"""A kept connection that cannot open a channel this fast is dropped (the run connects)."""
HAVE_SECONDS = 15.0
"""How long a run waits on the keeper's connections still opening (its own would be no faster)."""


def persist_seconds() -> float:
    """SPARKCTL_SSH_PERSIST: seconds the keeper stays after its last use; 0 (or off) disables."""
    value = os.environ.get(PERSIST_ENV, "").strip().lower()
    if not value:
        return DEFAULT_SECONDS
    if value in ("off", "no", "false"):
        return 0.0
    try:
        return max(0.0, float(value))
    except ValueError:
        return DEFAULT_SECONDS


def directory() -> Path:
    from orchestrator.state import state_dir

    return state_dir() / "ssh-keeper"


def socket_path(folder: Path | None = None) -> Path:
    return (folder or directory()) / "socket"


def _identity(path: Path) -> list[int]:
    try:
        st = path.stat()
    except OSError:
        return [0, 0, 0]
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def route_key(route: Route) -> str:
    """The route and the identity of every file a connection along it reads."""
    files = {route.pinned}
    for hop in route.hops:
        files.update(route.known_hosts_files(hop))
        files.update(key.path for key in hop.key_files)
    if route.config_file is not None:
        files.add(route.config_file)
    state = {"route": {**route.record(), "warnings": []},
             "files": {str(path): _identity(path) for path in sorted(files)}}
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()[:32]


# ---------------------------------------------------------------- the wire


def send(sock: socket.socket, header: dict[str, Any], payload: bytes = b"") -> None:
    """One message: a JSON line, then PAYLOAD's bytes (their count is in the header)."""
    sock.sendall(json.dumps(header).encode() + b"\n" + payload)


def receive(stream: BinaryIO) -> dict[str, Any]:
    line = stream.readline()
    if not line:
        raise EOFError("the connection keeper closed the connection")
    header = json.loads(line)
    if not isinstance(header, dict):
        raise ValueError("not a message")
    return header


def read_exactly(stream: BinaryIO, count: int) -> bytes:
    data = stream.read(count) if count else b""
    if len(data) != count:
        raise EOFError("the connection keeper closed the connection")
    return data


def peer_uid(sock: socket.socket) -> int:
    """The connecting process's user (Linux SO_PEERCRED: pid, uid, gid)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def _ask(header: dict[str, Any], timeout: float, folder: Path | None = None
         ) -> dict[str, Any] | None:
    """One question to the keeper; None when none is running (or it cannot answer)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(str(socket_path(folder)))
        send(sock, header)
        with sock.makefile("rb") as stream:
            return receive(stream)
    except (OSError, EOFError, ValueError):
        return None
    finally:
        sock.close()


# ---------------------------------------------------------------- a run's side


_asked: dict[tuple[str, ...], set[str]] = {}


def held(routes: list[Route]) -> dict[str, str]:
    """{node: key} of the routes the keeper holds open now (waiting on any still opening);
    asked once per run for the same routes (the early connections ask first, the session's
    connect after them)."""
    if not routes or persist_seconds() <= 0:
        return {}
    keys = {route.node: route_key(route) for route in routes}
    asked = tuple(sorted(set(keys.values())))
    if asked not in _asked:
        answer = None
        if socket_path().exists():
            answer = _ask({"op": "have", "keys": list(asked), "wait": HAVE_SECONDS},
                          HAVE_SECONDS + 5)
        _asked[asked] = set(answer.get("have", [])) if answer else set()
    return {node: key for node, key in keys.items() if key in _asked[asked]}


_to_keep: dict[str, dict[str, Any]] = {}
_keep_lock = threading.Lock()


def remember(route: Route) -> None:
    """A route this run connected along itself: the keeper opens its own when the run ends."""
    if persist_seconds() <= 0:
        return
    with _keep_lock:
        if not _to_keep:
            atexit.register(hand_over)
        _to_keep[route.node] = route.record()


def hand_over() -> None:
    """The run's routes to the running keeper, or to a new one started detached."""
    with _keep_lock:
        records = list(_to_keep.values())
        _to_keep.clear()
    if not records:
        return
    seconds = persist_seconds()
    if _ask({"op": "keep", "routes": records, "seconds": seconds}, 5) is not None:
        return
    folder = directory()
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o700)
        import subprocess

        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.remote.keeper_process", str(folder), str(seconds)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True)
        assert process.stdin is not None
        with contextlib.suppress(OSError):
            process.stdin.write(json.dumps(records).encode())
        with contextlib.suppress(OSError):
            process.stdin.close()


def stop(folder: Path | None = None) -> bool:
    """Close every kept connection (`sparkctl disconnect`); True when a keeper was running."""
    return _ask({"op": "stop"}, 10, folder) is not None


def status(folder: Path | None = None) -> dict[str, Any] | None:
    """What the keeper holds ({"nodes": [...], "pid": ..., "seconds": ...}), None: no keeper."""
    return _ask({"op": "status"}, 5, folder)


class KeptTransport(_SudoMixin):
    """A node's commands through the keeper's connection. A direct one (DIRECT) when the keeper
    cannot open a channel for the run's first command (the kept connection died since the last
    run), and for streams and forwards (`client`); once a command ran on it, the kept
    connection is the run's own: lost, the run stops there as with any connection."""

    def __init__(self, route: Route, key: str, command_timeout: float,
                 sudo_password: SudoPassword, direct: Callable[[], SSHTransport]) -> None:
        self.node = route.node
        self.user = route.target.user
        self.user_is_root = self.user == "root"
        self.sudo_password = sudo_password
        self.default_timeout = command_timeout
        self.key = key
        self._open_direct = direct
        self._direct: SSHTransport | None = None
        self._lock = threading.Lock()
        self._used = False  # a command of this run ran on the kept connection
        self.commands_sent = 0

    def direct(self) -> SSHTransport:
        with self._lock:
            if self._direct is None:
                self._direct = self._open_direct()
            return self._direct

    @property
    def client(self) -> Any:
        """The paramiko client of a direct connection (opened on first use)."""
        return self.direct().client

    def _execute(self, command: str, stdin: bytes, timeout: float) -> tuple[int, str, str]:
        if self._direct is not None:
            return self._direct._execute(command, stdin, timeout)
        self.commands_sent += 1
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            try:
                sock.settimeout(OPEN_SECONDS + 10)
                sock.connect(str(socket_path()))
                send(sock, {"op": "run", "key": self.key, "node": self.node, "command": command,
                            "stdin": len(stdin), "timeout": timeout}, stdin)
                stream = sock.makefile("rb")
                opened = receive(stream).get("opened") is True
            except (OSError, EOFError, ValueError):
                opened = False
            if not opened and self._used:  # as this run's own connection, lost mid-run
                raise TransportError(f"{self.node}: the SSH connection was lost")
            if not opened:  # nothing ran yet: the run connects itself, as without a keeper
                return self.direct()._execute(command, stdin, timeout)
            self._used = True
            try:
                sock.settimeout(timeout + 30)
                done = receive(stream)
                if "error" in done:
                    raise TransportError(str(done["error"]))
                out = read_exactly(stream, int(done["out"]))
                err = read_exactly(stream, int(done["err"]))
            except (OSError, EOFError, ValueError, KeyError) as exc:
                raise TransportError(f"{self.node}: the SSH connection broke: {exc}") from None
            return int(done["exit"]), out.decode(errors="replace"), err.decode(errors="replace")
        finally:
            sock.close()

    def close(self) -> None:
        if self._direct is not None:
            self._direct.close()
