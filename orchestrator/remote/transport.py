"""One narrow way to run commands on a node: `run()` and `close()`.

`SSHTransport` keeps one SSH connection per node for the whole run (a paramiko client; fabric
was dropped because importing it and invoke cost more start-up time than anything it gave us);
host keys are verified against known_hosts with a reject policy. `LocalTransport` runs commands
directly when sparkctl runs on the node itself. Retries cover connecting only: a mutating
command is never retried blindly.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import select
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from orchestrator.commands import join, sh_cmd
from orchestrator.errors import CommandError, TransportError

SUDO_PASSWORD_NEEDED = ("a password is required", "a terminal is required")
TRACE_ENV = "SPARKCTL_TRACE"
_trace_lock = threading.Lock()


def trace_event(event: str, node: str, started: float, ended: float, **fields: object) -> None:
    """Opt-in timing record for benchmarks: with $SPARKCTL_TRACE=path, append one JSON line.

    Times are wall-clock (time.time()) so records of several processes line up. Never pass
    stdin or other secrets here: only sizes, exit codes and the displayed command.
    """
    path = os.environ.get(TRACE_ENV)
    if not path:
        return
    record = {"event": event, "node": node, "start": round(started, 6), "end": round(ended, 6),
              "seconds": round(ended - started, 6), "pid": os.getpid(), **fields}
    with _trace_lock, open(path, "a") as handle:
        handle.write(json.dumps(record) + "\n")


@dataclass(frozen=True)
class Result:
    """What a remote command did."""

    node: str
    command: str
    exit_status: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    def check(self) -> Result:
        """Raise CommandError unless the command succeeded."""
        if not self.ok:
            raise CommandError(self.node, self.command, self.exit_status, self.stderr)
        return self


class Transport(Protocol):
    node: str

    def run(
        self, command: str, *, stdin: bytes | str | None = None, sudo: bool = False,
        timeout: float | None = None, display: str | None = None,
    ) -> Result: ...

    def close(self) -> None: ...


SUDO_TRIES = 3


class SudoPassword:
    """The nodes' sudo passwords for one run, shared by every node's transport.

    Asked once on a terminal and tried on every node; a node that refuses it gets its own
    question ("on spark-b"), so nodes with different passwords work. Per-node password files
    (inventory `sudo_password_file`, mode 0600 or stricter) answer without asking. Passwords
    only ever travel on sudo's stdin and are redacted from logs.
    """

    def __init__(self, prompt: bool = True, files: dict[str, Path] | None = None) -> None:
        self._lock = threading.Lock()
        self._password: str | None = None
        self._per_node: dict[str, str] = {}
        self._rejected: dict[str, int] = {}
        self._files = dict(files or {})
        self._prompt = prompt
        for path in set(self._files.values()):
            check_secret_file(path)

    def get(self, user: str, node: str | None = None) -> str:
        with self._lock:
            if node is not None and node in self._per_node:
                return self._per_node[node]
            if node is not None and node in self._files:
                self._per_node[node] = read_secret_file(self._files[node])
                return self._per_node[node]
            retry = node is not None and node in self._rejected
            if self._password is not None and not retry:
                return self._password
            if not self._prompt:
                raise TransportError(
                    f"sudo on the nodes asks {user}'s password and no terminal is attached; "
                    "allow passwordless sudo for sparkctl, name a password file "
                    "(sudo_password_file in the inventory) or run it from a terminal"
                )
            if not retry:
                self._password = self._ask(f"[sparkctl] sudo password for {user} on the nodes: ")
                return self._password
            assert node is not None
            self._per_node[node] = self._ask(f"[sparkctl] sudo password for {user} on {node}: ")
            return self._per_node[node]

    @staticmethod
    def _ask(prompt: str) -> str:
        secret = getpass.getpass(prompt)
        with contextlib.suppress(Exception):
            from orchestrator.state import register_secret

            register_secret(secret)
        return secret

    def reject(self, node: str, password: str) -> bool:
        """sudo on `node` refused `password`; True when asking again may help."""
        with self._lock:
            self._rejected[node] = self._rejected.get(node, 0) + 1
            if self._per_node.get(node) == password:
                del self._per_node[node]
            if node in self._files:
                return False
            return self._prompt and self._rejected[node] < SUDO_TRIES


def check_secret_file(path: Path) -> None:
    """Refuse a secret file others could read (as ssh refuses a private key)."""
    from orchestrator.errors import InputError

    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise InputError(f"sudo password file {path}: {exc.strerror}") from None
    if mode & 0o077:
        raise InputError(
            f"sudo password file {path} is readable by group or others (mode "
            f"{mode & 0o777:04o}); refusing to use it: chmod 600 {path}"
        )


def read_secret_file(path: Path) -> str:
    check_secret_file(path)
    text = path.read_text().rstrip("\n")
    with contextlib.suppress(Exception):
        from orchestrator.state import register_secret

        register_secret(text)
    return text


class _SudoMixin:
    """Wraps commands in sudo; passwordless first, then the node's password on stdin."""

    node: str
    user_is_root: bool
    sudo_password: SudoPassword
    user: str
    _needs_password = False

    def _execute(self, command: str, stdin: bytes, timeout: float) -> tuple[int, str, str]:
        raise NotImplementedError

    def _command(self, command: str, sudo: bool, stdin: bytes) -> tuple[str, bytes, str]:
        if not sudo or self.user_is_root:
            return command, stdin, ""
        if self._needs_password:
            password = self.sudo_password.get(self.user, self.node)
            return f"sudo -S -p '' -- {sh_cmd(command)}", password.encode() + b"\n" + stdin, password
        return f"sudo -n -- {sh_cmd(command)}", stdin, ""

    def run(
        self, command: str, *, stdin: bytes | str | None = None, sudo: bool = False,
        timeout: float | None = None, display: str | None = None,
    ) -> Result:
        data = stdin.encode() if isinstance(stdin, str) else (stdin or b"")
        limit = timeout if timeout is not None else self.default_timeout  # type: ignore[attr-defined]
        started = time.monotonic()
        label = display or command
        wrapped, payload, _ = self._command(command, sudo, data)
        status, out, err = self._traced(wrapped, payload, limit, label, sudo)
        if sudo and status != 0 and not self._needs_password and any(
            marker in err for marker in SUDO_PASSWORD_NEEDED
        ):
            self._needs_password = True
            while True:
                wrapped, payload, password = self._command(command, sudo, data)
                status, out, err = self._traced(wrapped, payload, limit, label, sudo)
                if status != 0 and ("incorrect password" in err or "Sorry, try again" in err):
                    if self.sudo_password.reject(self.node, password):
                        continue
                    raise TransportError(f"{self.node}: sudo refused the password for {self.user}")
                break
        return Result(self.node, label, status, out, err, time.monotonic() - started)

    def _traced(self, command: str, stdin: bytes, timeout: float, label: str,
                sudo: bool) -> tuple[int, str, str]:
        """`_execute`, timed into $SPARKCTL_TRACE when set (one line per round trip)."""
        if not os.environ.get(TRACE_ENV):
            return self._execute(command, stdin, timeout)
        started, status = time.time(), None
        try:
            status, out, err = self._execute(command, stdin, timeout)
            return status, out, err
        finally:
            trace_event("command", self.node, started, time.time(), command=label[:200],
                        sudo=sudo, exit=status, stdin_bytes=len(stdin),
                        local=isinstance(self, LocalTransport))


class LocalTransport(_SudoMixin):
    """Runs on this machine: used when the controller is one of the nodes."""

    def __init__(self, node: str, user: str, sudo_password: SudoPassword,
                 default_timeout: float = 300.0) -> None:
        import os

        self.node = node
        self.user = user
        self.user_is_root = os.geteuid() == 0
        self.sudo_password = sudo_password
        self.default_timeout = default_timeout

    def _execute(self, command: str, stdin: bytes, timeout: float) -> tuple[int, str, str]:
        try:
            proc = subprocess.run(
                ["sh", "-c", command], input=stdin, capture_output=True, timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise TransportError(f"{self.node}: command timed out after {timeout:.0f}s") from None
        return proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")

    def close(self) -> None:
        return None


class SSHTransport(_SudoMixin):
    """One SSH connection to one node, opened by `connect()` and reused for every command."""

    def __init__(self, node: str, client: Any, user: str, sudo_password: SudoPassword,
                 default_timeout: float = 300.0, jumps: list[Any] | None = None) -> None:
        self.node = node
        self.client = client  # paramiko.SSHClient, already connected
        self.jumps = list(jumps or [])  # the jump hosts' clients, closed after the node's
        self.user = user
        self.user_is_root = user == "root"
        self.sudo_password = sudo_password
        self.default_timeout = default_timeout
        self.commands_sent = 0

    def _execute(self, command: str, stdin: bytes, timeout: float) -> tuple[int, str, str]:
        import paramiko

        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise TransportError(f"{self.node}: the SSH connection was lost")
        self.commands_sent += 1
        try:
            channel = transport.open_session(timeout=timeout)
            channel.exec_command(command)
            try:
                if stdin:
                    channel.sendall(stdin)
                channel.shutdown_write()
            except OSError:
                # The command ended without reading all its input (`sudo -n` refusing at once
                # does): its exit status and stderr say why, so read them rather than fail.
                if not channel.closed:
                    raise
            return _collect(channel, timeout, self.node)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise TransportError(f"{self.node}: the SSH connection broke: {exc}") from None

    def close(self) -> None:
        # closing must never hide the real outcome of a run
        with contextlib.suppress(Exception):
            self.client.close()
        for jump in reversed(self.jumps):
            with contextlib.suppress(Exception):
                jump.close()


def _collect(channel: Any, timeout: float, node: str,
             cancel: socket.socket | None = None) -> tuple[int, str, str]:
    """Read a channel's stdout and stderr until the command exits or the deadline passes;
    CANCEL (the keeper's client, remote/keeper_process.py): its end closes the channel, as a
    run's end closes its own connection."""
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout
    chan = channel  # paramiko.Channel
    watched = [chan] if cancel is None else [chan, cancel]
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            chan.close()
            raise TransportError(f"{node}: command did not finish within {timeout:.0f}s")
        readable, _, _ = select.select(watched, [], [], min(remaining, 1.0))
        if cancel is not None and cancel in readable:
            chan.close()
            raise TransportError(f"{node}: the run that sent the command ended before it did")
        while chan.recv_ready():
            out += chan.recv(65536)
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
            status = chan.recv_exit_status()
            chan.close()
            return status, out.decode(errors="replace"), err.decode(errors="replace")
        if chan.closed and not chan.exit_status_ready():
            raise TransportError(f"{node}: the SSH channel closed before the command finished")


def is_local_host(host: str) -> bool:
    """True when `host` names this machine (then no SSH is needed)."""
    if host in ("localhost", "127.0.0.1", "::1"):
        return True
    try:
        import ifaddr  # pure Python, maintained (netifaces was a C extension last released in 2021)

        addresses = {
            ip.ip if isinstance(ip.ip, str) else ip.ip[0]
            for adapter in ifaddr.get_adapters()
            for ip in adapter.ips
        }
        resolved = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (OSError, ValueError):
        return False
    return bool(resolved & addresses) or host == socket.gethostname()


def describe(argv: list[str]) -> str:
    return join(argv)
