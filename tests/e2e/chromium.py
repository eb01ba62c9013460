"""Debian's chromium, headless, driven over the DevTools protocol (a websocket on loopback):
open a page, read its DOM with JavaScript, take a screenshot. No browser download (Playwright
would fetch its own build): `make install` puts chromium on the machine (Makefile APT_PACKAGES)."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import websocket

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-default-apps", "--mute-audio",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0")


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One headless chromium with one page; `close()` ends the process it started (by PID)."""

    def __init__(self, url: str, width: int = 1400, height: int = 1100) -> None:
        path = chromium_path()
        assert path, "chromium is not installed (make install adds it)"
        self.profile = Path(tempfile.mkdtemp(prefix="sparkctl-chromium-"))
        self.process = subprocess.Popen(
            [path, *FLAGS, f"--user-data-dir={self.profile}", f"--window-size={width},{height}", url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.ids = itertools.count(1)
        self.socket = websocket.create_connection(self._page_socket(url), timeout=30,
                                                  suppress_origin=True)

    def _page_socket(self, url: str) -> str:
        active = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if active.exists() and active.read_text().strip():
                port = int(active.read_text().split()[0])
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as answer:
                    pages = [t for t in json.load(answer) if t.get("type") == "page"]
                if pages:
                    return str(pages[0]["webSocketDebuggerUrl"])
            time.sleep(0.2)
        raise AssertionError(f"chromium did not open {url} within 60 s")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self.ids)
        self.socket.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == ident:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return dict(message.get("result") or {})

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float) -> tuple[Any, float]:
        """(the first truthy value of `expression`, seconds it took), polled every 0.2 s."""
        started = time.monotonic()
        value = None
        while time.monotonic() - started < timeout:
            value = self.evaluate(expression)
            if value:
                return value, time.monotonic() - started
            time.sleep(0.2)
        raise AssertionError(f"not within {timeout} s: {expression} (last: {value!r})")

    def screenshot(self, path: Path) -> None:
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        try:
            self.socket.close()
        finally:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
            shutil.rmtree(self.profile, ignore_errors=True)
