"""Local port forwarding over the existing SSH connection to the head (paramiko direct-tcpip).

The server listens on 127.0.0.1 on the head; `chat` and `tunnel` reach it through SSH, so no
port is ever opened on the network. The local end binds 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from typing import Any

from orchestrator.errors import SparkctlError
from orchestrator.remote.stream import open_forward
from orchestrator.remote.transport import Transport


class Forwarder:
    """127.0.0.1:local_port on this machine -> remote_host:remote_port seen from the head."""

    def __init__(self, transport: Transport, remote_port: int, local_port: int = 0,
                 remote_host: str = "127.0.0.1") -> None:
        self.transport = transport
        self.remote = (remote_host, remote_port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.listener.bind(("127.0.0.1", local_port))
        except OSError as exc:
            self.listener.close()
            raise SparkctlError(f"cannot listen on 127.0.0.1:{local_port}: {exc.strerror} "
                                "(pick another with --local-port)", 1) from None
        self.listener.listen(16)
        self.local_port = self.listener.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)

    def start(self) -> Forwarder:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self.listener.close()

    def __enter__(self) -> Forwarder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, peer = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client, peer), daemon=True).start()

    def _open_remote(self, peer: tuple[str, int]) -> Any:
        return open_forward(self.transport, self.remote, peer)

    def _serve(self, client: socket.socket, peer: tuple[str, int]) -> None:
        try:
            remote = self._open_remote(peer)
        except Exception:  # the client sees a closed connection; nothing else to tell
            client.close()
            return
        try:
            while not self._stop.is_set():
                readable, _, _ = select.select([client, remote], [], [], 1.0)
                if client in readable:
                    data = client.recv(65536)
                    if not data:
                        break
                    remote.sendall(data)
                if remote in readable:
                    data = remote.recv(65536)
                    if not data:
                        break
                    client.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(Exception):
                remote.close()
            client.close()
