"""Run the sparkctl CLI in this process and record every remote command with its stdin.

`python -m benchmarks.capture OUT.json -- up --inventory F --yes` behaves like `sparkctl up ...`
and writes, per node and in order, the exact command strings sent (sudo wrapping included) and
their stdin, base64. The floor benchmark replays them as one script per node.

Lab use only: stdin holds the lab's cluster key, so OUT is written 0600 and should live in the
lab's state dir (removed by `lab down`). The production trace ($SPARKCTL_TRACE) records no stdin.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator.remote import keeper
from orchestrator.remote import stream as stream_module
from orchestrator.remote import transport as transport_module

_records: list[dict[str, Any]] = []
_lock = threading.Lock()
_inside = threading.local()


def _wrap(cls: Any) -> None:
    original = cls._execute

    def execute(self: Any, command: str, stdin: bytes, timeout: float) -> tuple[int, str, str]:
        if getattr(_inside, "recording", False):  # (a kept connection's fallback: once)
            return original(self, command, stdin, timeout)  # type: ignore[no-any-return]
        started = time.time()
        _inside.recording = True
        try:
            status, out, err = original(self, command, stdin, timeout)
        finally:
            _inside.recording = False
        with _lock:
            _records.append({"node": self.node, "start": started, "command": command,
                             "stdin": base64.b64encode(stdin).decode(), "exit": status})
        return status, out, err

    cls._execute = execute


def _wrap_stream() -> None:
    """`docker pull` goes over stream_run (its progress as it comes), not `_execute`: without
    this the floor replayed no pull and the image was missing (`No such image`) in the replay."""
    original = stream_module.stream_run

    def stream_run(transport: Any, command: str, on_line: Any, timeout: float, display: str,
                   stdin: bytes = b"") -> tuple[int, str]:
        started = time.time()
        status, tail = original(transport, command, on_line, timeout, display, stdin)
        with _lock:
            _records.append({"node": transport.node, "start": started, "command": command,
                             "stdin": base64.b64encode(stdin).decode(), "exit": status})
        return status, tail

    stream_module.stream_run = stream_run  # before the phases import it by name


def _dump(path: Path) -> None:
    by_node: dict[str, list[dict[str, Any]]] = {}
    for record in sorted(_records, key=lambda r: r["start"]):
        by_node.setdefault(record["node"], []).append(record)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(by_node, handle)


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        sys.exit("usage: python -m benchmarks.capture OUT.json -- SPARKCTL-ARGS...")
    out = Path(sys.argv[1])
    _wrap(transport_module.SSHTransport)
    _wrap(transport_module.LocalTransport)
    _wrap(keeper.KeptTransport)  # (a run through connections kept from the last one)
    _wrap_stream()
    atexit.register(_dump, out)
    from orchestrator.cli import cli

    cli(args=sys.argv[3:], prog_name="sparkctl")


if __name__ == "__main__":
    main()
