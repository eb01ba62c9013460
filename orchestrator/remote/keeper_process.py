"""The connection keeper (remote/keeper.py says what it is for and what it trusts).

`python -m orchestrator.remote.keeper_process FOLDER SECONDS`, started detached by a run that
ends, the routes to keep as JSON on stdin. One keeper per state directory: it holds
FOLDER/keeper.pid locked while it runs (a second one exits at once) and listens on
FOLDER/socket before it imports anything SSH, so the next run can already wait on it. It exits
SECONDS after its last request (none running), on `stop`, or when its socket is taken from it.

Requests (a JSON line, then the stdin bytes it counts; remote/keeper.py's `send`):
- `have` KEYS: which of them are held and alive (waiting up to `wait` s on any still opening);
- `keep` ROUTES: open a connection along each route not held yet;
- `run` KEY COMMAND: open a session channel (a connection that cannot, in OPEN_SECONDS, is
  dropped and the answer is `opened: false`: nothing ran), run COMMAND with the stdin, answer
  the exit status, stdout and stderr; the client's end closes the channel;
- `status`, `stop`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.remote import keeper

LOG_BYTES = 256 * 1024


@dataclass
class Kept:
    node: str
    client: Any  # paramiko.SSHClient
    jumps: list[Any] = field(default_factory=list)

    def alive(self) -> bool:
        transport = self.client.get_transport()
        return transport is not None and transport.is_active()

    def close(self) -> None:
        for client in (self.client, *reversed(self.jumps)):
            with contextlib.suppress(Exception):
                client.close()


class Keeper:
    def __init__(self, folder: Path, seconds: float) -> None:
        self.folder = folder
        self.seconds = seconds
        self.kept: dict[str, Kept] = {}
        self.opening: dict[str, threading.Event] = {}
        self.lock = threading.Lock()
        self.running = 0
        self.last_used = time.monotonic()
        self.stopping = threading.Event()
        self.pin_lock = threading.Lock()
        self._keys: Any = None

    def log(self, message: str) -> None:
        path = self.folder / "keeper.log"
        with contextlib.suppress(OSError):
            if path.exists() and path.stat().st_size > LOG_BYTES:
                path.replace(path.with_suffix(".log.1"))
            with path.open("a") as handle:
                handle.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} [{os.getpid()}] {message}\n")

    # ------------------------------------------------------------ connections

    def keep(self, records: list[dict[str, Any]]) -> None:
        from orchestrator.remote.sshconfig import Route

        for record in records:
            try:
                route = Route.of_record(record)
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
            key = keeper.route_key(route)
            with self.lock:
                if key in self.opening or (key in self.kept and self.kept[key].alive()):
                    continue
                self.opening[key] = threading.Event()
            threading.Thread(target=self._open, args=(key, route), daemon=True).start()

    def _open(self, key: str, route: Any) -> None:
        try:
            from orchestrator.remote import sshkeys
            from orchestrator.remote.connect import open_route

            with self.lock:
                if self._keys is None:
                    self._keys = sshkeys.KeyStore(prompt=False)
            client, jumps = open_route(route, False, self.pin_lock, self._keys)
            transport = client.get_transport()
            if transport is not None:
                transport.set_keepalive(route.target.keepalive)
            with self.lock:
                old = self.kept.pop(key, None)
                self.kept[key] = Kept(route.node, client, jumps)
            if old is not None:
                old.close()
            self.log(f"{route.node}: connected ({route.target.describe()})")
        except Exception as exc:  # the next run connects itself and says why
            self.log(f"{route.node}: not kept: {exc}")
        finally:
            with self.lock:
                self.opening.pop(key).set()

    def have(self, keys: list[str], wait: float) -> list[str]:
        deadline = time.monotonic() + min(max(wait, 0.0), keeper.HAVE_SECONDS)
        for key in keys:
            with self.lock:
                event = self.opening.get(key)
            if event is not None:
                event.wait(max(0.0, deadline - time.monotonic()))
        with self.lock:
            return [key for key in keys if key in self.kept and self.kept[key].alive()]

    def drop(self, key: str) -> None:
        with self.lock:
            gone = self.kept.pop(key, None)
        if gone is not None:
            gone.close()
            self.log(f"{gone.node}: dropped (no channel within {keeper.OPEN_SECONDS:g} s)")

    # ------------------------------------------------------------ requests

    def serve(self, conn: socket.socket) -> None:
        with self.lock:
            self.running += 1
        try:
            if keeper.peer_uid(conn) != os.getuid():
                return
            with conn.makefile("rb") as stream:
                header = keeper.receive(stream)
                op = header.get("op")
                if op == "run":
                    self.run(conn, stream, header)
                elif op == "have":
                    keeper.send(conn, {"have": self.have([str(k) for k in header.get("keys", [])],
                                                         float(header.get("wait", 0)))})
                elif op == "keep":
                    self.keep(list(header.get("routes", [])))
                    self.seconds = float(header.get("seconds", self.seconds))
                    keeper.send(conn, {"ok": True})
                elif op == "status":
                    with self.lock:
                        nodes = sorted(k.node for k in self.kept.values() if k.alive())
                    keeper.send(conn, {"pid": os.getpid(), "nodes": nodes, "seconds": self.seconds})
                elif op == "stop":
                    with contextlib.suppress(OSError):  # no new run reaches this keeper
                        keeper.socket_path(self.folder).unlink()
                    self.stopping.set()
                    keeper.send(conn, {"ok": True})
        except (OSError, EOFError, ValueError) as exc:
            self.log(f"a request failed: {exc}")
        finally:
            with self.lock:
                self.running -= 1
                self.last_used = time.monotonic()
            conn.close()

    def run(self, conn: socket.socket, stream: Any, header: dict[str, Any]) -> None:
        import paramiko

        from orchestrator.errors import TransportError
        from orchestrator.remote.transport import _collect

        stdin = keeper.read_exactly(stream, int(header.get("stdin", 0)))
        key, node = str(header.get("key")), str(header.get("node"))
        with self.lock:
            kept = self.kept.get(key)
        channel = None
        if kept is not None and kept.alive():
            try:
                channel = kept.client.get_transport().open_session(timeout=keeper.OPEN_SECONDS)
                channel.exec_command(str(header["command"]))
            except (paramiko.SSHException, OSError, EOFError):
                channel = None
        if channel is None:
            if kept is not None:
                self.drop(key)
            keeper.send(conn, {"opened": False})
            return
        keeper.send(conn, {"opened": True})
        try:
            try:
                if stdin:
                    channel.sendall(stdin)
                channel.shutdown_write()
            except OSError:
                if not channel.closed:  # (as SSHTransport: a command that read no input)
                    raise
            status, out, err = _collect(channel, float(header["timeout"]), node, cancel=conn)
        except TransportError as exc:
            with contextlib.suppress(OSError):
                keeper.send(conn, {"error": str(exc)})
            return
        except (paramiko.SSHException, OSError, EOFError) as exc:
            with contextlib.suppress(OSError):
                keeper.send(conn, {"error": f"{node}: the SSH connection broke: {exc}"})
            return
        data_out, data_err = out.encode(), err.encode()
        keeper.send(conn, {"exit": status, "out": len(data_out), "err": len(data_err)},
                    data_out + data_err)

    def idle(self) -> bool:
        with self.lock:
            return self.running == 0 and time.monotonic() - self.last_used > self.seconds

    def loop(self, listener: socket.socket) -> None:
        """Serve until stopped, idle, or the socket is no longer ours; then close everything."""
        path = keeper.socket_path(self.folder)
        identity = os.stat(path).st_ino
        while not self.stopping.is_set() and not self.idle():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                try:
                    if os.stat(path).st_ino != identity:
                        break  # (the folder was removed or the socket replaced)
                except OSError:
                    break
                continue
            except OSError:
                break
            conn.settimeout(None)
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()
        listener.close()
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == identity:
                path.unlink()
        with self.lock:
            kept, self.kept = list(self.kept.values()), {}
        for one in kept:
            one.close()
        self.log("stopped")


def listen(folder: Path) -> tuple[socket.socket, int] | None:
    """The keeper's socket and its locked pid file, or None when another keeper holds the
    folder."""
    lock = os.open(folder / "keeper.pid", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock)
        return None
    os.ftruncate(lock, 0)
    os.write(lock, f"{os.getpid()}\n".encode())  # (the fd stays open: the lock lives with it)
    path = keeper.socket_path(folder)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    try:
        listener.bind(str(path))
    finally:
        os.umask(old)
    listener.listen(64)
    listener.settimeout(1.0)
    return listener, lock


def main(argv: list[str]) -> int:
    folder, seconds = Path(argv[0]), float(argv[1])
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    listening = listen(folder)
    records = json.loads(sys.stdin.read() or "[]")
    if listening is None:  # another keeper: it takes the routes instead
        keeper._ask({"op": "keep", "routes": records, "seconds": seconds}, 5, folder)
        return 0
    me = Keeper(folder, seconds)
    me.keep(records)
    me.loop(listening[0])
    os.close(listening[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
