"""Run a node-side script (orchestrator/node/*.py) in-process, as the nodes run it, so coverage
sees it: its real file name, `sys.argv` patched, stdout captured, SystemExit caught."""

from __future__ import annotations

import contextlib
import http.server
import io
import json
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import orchestrator.node

NODE = Path(orchestrator.node.__file__).parent


@dataclass
class Ran:
    code: Any
    stdout: str
    stderr: str
    namespace: dict[str, Any]

    @property
    def json(self) -> Any:
        return json.loads(self.stdout.strip().splitlines()[-1])


def run_node_script(name: str, argv: list[str], monkeypatch: pytest.MonkeyPatch,
                    replace: dict[str, str] | None = None) -> Ran:
    """Execute NAME with `argv` (after the script name); `replace` edits its source first (each
    old text must be there, so a renamed constant fails the test instead of escaping to /)."""
    path = NODE / name
    source = path.read_text()
    for old, new in (replace or {}).items():
        assert old in source, f"{old!r} not in {name}"
        source = source.replace(old, new)
    monkeypatch.setattr(sys, "argv", [str(path), *argv])
    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": str(path)}
    out, err = io.StringIO(), io.StringIO()
    code: Any = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            exec(compile(source, str(path), "exec"), namespace)
        except SystemExit as exc:
            code = exc.code
    return Ran(code, out.getvalue(), err.getvalue(), namespace)


Route = tuple[int, str]
Seen = list[tuple[str, str, bytes]]


@contextlib.contextmanager
def http_server(routes: dict[str, Route | Callable[[bytes], Route]]) -> Iterator[tuple[int, Seen]]:
    """A tiny HTTP server on 127.0.0.1 (port 0): PATH -> (status, body) or fn(request body).
    Yields (port, requests seen as (method, path, body))."""
    seen: Seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            seen.append((method, self.path, body))
            route = routes.get(self.path, (404, "not found"))
            status, text = route(body) if callable(route) else route
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._answer("GET")

        def do_POST(self) -> None:
            self._answer("POST")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
