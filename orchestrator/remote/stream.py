"""Long-running remote commands read as they go: log streams and progress-printing commands.

Both work over the node's one SSH connection (an extra session channel) or, when the controller
is the node itself, over a local process, so callers never touch paramiko.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from orchestrator.errors import SparkctlError
from orchestrator.remote.transport import Transport, trace_event


def ssh_connection(transport: Transport) -> Any:
    """The paramiko connection behind an SSH transport, or None for a local one."""
    client = getattr(transport, "client", None)
    return client.get_transport() if client is not None else None


def open_forward(transport: Transport, remote: tuple[str, int], peer: tuple[str, int]) -> Any:
    """A socket-like channel to `remote` as the node sees it (direct-tcpip over SSH)."""
    ssh = ssh_connection(transport)
    if ssh is None:  # the controller is the node itself: plain TCP
        return socket.create_connection(remote, timeout=10)
    return ssh.open_channel("direct-tcpip", remote, peer, timeout=10)


class Stream:
    """One remote command whose output is read line by line; close() ends it on the node."""

    def __init__(self, transport: Transport, command: str, terminal: bool) -> None:
        self.closed = threading.Event()
        self._channel: Any = None
        self._process: subprocess.Popen[bytes] | None = None
        ssh = ssh_connection(transport)
        if ssh is not None:
            channel = ssh.open_session()
            channel.set_combine_stderr(True)
            if terminal:  # its hang-up ends the command when the channel goes (see above)
                channel.get_pty(term="dumb", width=500)
            channel.exec_command(command)
            self._channel = channel
            self._reader = channel.makefile("rb")
        else:
            # its own process group, so close() ends the command and everything it started
            self._process = subprocess.Popen(
                ["sh", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
            self._reader = self._process.stdout

    def lines(self) -> Iterator[str]:
        try:
            for raw in iter(self._reader.readline, b""):
                yield raw.decode(errors="replace")
        except (OSError, EOFError, ValueError):
            if not self.closed.is_set():
                raise

    def close(self) -> None:
        self.closed.set()
        if self._channel is not None:
            self._channel.close()
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGTERM)
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)



def stream_run(transport: Transport, command: str, on_line: Callable[[str], None],
               timeout: float, display: str, stdin: bytes = b"") -> tuple[int, str]:
    """Run a long command and hand its output lines (progress bars too) over as they come;
    `stdin` (e.g. sudo's password) is written first, never put on the command line."""
    ssh = ssh_connection(transport)
    if ssh is None:  # local transport: no streaming, same result
        result = transport.run(command, timeout=timeout, display=display)
        for line in (result.stdout + result.stderr).splitlines()[-5:]:
            on_line(line)
        return result.exit_status, result.stderr
    started, status = time.time(), None
    try:
        status, tail = _stream_ssh(ssh, transport.node, command, on_line, timeout, display, stdin)
        return status, tail
    finally:  # a round trip like any other ($SPARKCTL_TRACE counts every command)
        trace_event("command", transport.node, started, time.time(), command=display[:200],
                    sudo=command.startswith("sudo "), exit=status, stdin_bytes=len(stdin),
                    local=False, streamed=True)


def _stream_ssh(ssh: Any, node: str, command: str, on_line: Callable[[str], None],
                timeout: float, display: str, stdin: bytes) -> tuple[int, str]:
    channel = ssh.open_session()
    channel.set_combine_stderr(True)
    channel.exec_command(command)
    if stdin:
        channel.sendall(stdin)
    channel.shutdown_write()
    deadline, buffer, tail = time.monotonic() + timeout, "", ""
    while not channel.exit_status_ready() or channel.recv_ready():
        if time.monotonic() > deadline:
            channel.close()
            raise SparkctlError(f"{node}: `{display}` did not finish in {timeout:.0f}s")
        select.select([channel], [], [], 1.0)
        while channel.recv_ready():
            buffer += channel.recv(65536).decode(errors="replace")
        *lines, buffer = buffer.replace("\r", "\n").split("\n")
        for line in lines:
            if line.strip():
                on_line(line.strip())
                tail = (tail + "\n" + line)[-2000:]
    status = channel.recv_exit_status()
    channel.close()
    return status, (tail + "\n" + buffer)[-2000:]
