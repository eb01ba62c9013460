"""A remote command fed on stdin and read line by line while it runs (the fan-out's sender and
receiver): over the node's one SSH connection (an extra session channel) or, when the
controller is the node itself, a local process. The stdin text (which may hold a one-time
token) never appears in argv or in the trace; `display` is what logs show. The process runs at
once and gets its stdin from `feed` (the fan-out starts its sender while the receiver still
checks what it has, so neither waits for the other to start).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from typing import Any

from orchestrator.remote.stream import ssh_connection
from orchestrator.remote.transport import Transport


class RemoteProcess:
    def __init__(self, transport: Transport, command: str, display: str) -> None:
        self.node = transport.node
        self.display = display
        self._channel: Any = None
        self._process: subprocess.Popen[bytes] | None = None
        ssh = ssh_connection(transport)
        if ssh is not None:
            channel = ssh.open_session()
            channel.exec_command(command)
            self._channel = channel
            self._reader = channel.makefile("rb")
            self._errors = channel.makefile_stderr("rb")
        else:
            self._process = subprocess.Popen(
                ["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True)
            self._reader = self._process.stdout
            self._errors = self._process.stderr

    def feed(self, text: str, close: bool = True) -> None:
        """Write to stdin and (by default) close it. Left open, stdin ends when this process
        is closed, or when the controller dies: a node script can watch for that."""
        if self._channel is not None:
            # a process that already ended says why on stdout/stderr, as the local one does
            with contextlib.suppress(OSError):
                self._channel.sendall(text.encode())
                if close:
                    self._channel.shutdown_write()
        else:
            assert self._process is not None and self._process.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                self._process.stdin.write(text.encode())
                self._process.stdin.flush()
            if close:
                self._process.stdin.close()

    def readline(self) -> str:
        """The next line of stdout ("" at the end)."""
        try:
            return str(self._reader.readline().decode(errors="replace"))
        except (OSError, EOFError, ValueError):
            return ""

    def first_json(self) -> dict[str, Any]:
        """The next stdout line that is a JSON object (node scripts print one per event), or {}
        at the end; other lines (warnings, progress) are skipped."""
        while True:
            line = self.readline()
            if not line:
                return {}
            if line.strip().startswith("{"):
                return dict(json.loads(line))

    def stderr_tail(self, limit: int = 800) -> str:
        try:
            return str(self._errors.read().decode(errors="replace"))[-limit:]
        except (OSError, EOFError, ValueError):
            return ""

    def wait(self, timeout: float = 60.0) -> int:
        if self._channel is not None:
            deadline = time.monotonic() + timeout
            while not self._channel.exit_status_ready():
                if time.monotonic() > deadline:
                    return -1
                time.sleep(0.05)
            return int(self._channel.recv_exit_status())
        assert self._process is not None
        try:
            return self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return -1

    def close(self) -> None:
        """End it: the channel closes (the remote side gets EOF/EPIPE), a local one is killed."""
        if self._channel is not None:
            self._channel.close()
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=5)
