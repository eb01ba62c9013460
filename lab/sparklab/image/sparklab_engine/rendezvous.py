"""Leader/worker rendezvous over TCP on the NCCL interface (the lab's stand-in for NCCL + MPI).

Messages are JSON lines. The leader (rank 0, inside trtllm-serve) listens on its NCCL interface
address; workers (other ranks, inside trtllm-llmapi-launch) connect from their own NCCL interface
address to the host named on the first line of the MPI hostfile.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time

from .common import (
    ModelMissing,
    NcclError,
    fault,
    hostname,
    lab_config,
    leader_address,
    nccl_interface,
    nccl_log,
    rendezvous_port,
    rendezvous_timeout,
    resolve_model,
    trt_log,
)


class WorkerLost(RuntimeError):
    pass


class Peer:
    def __init__(self, sock: socket.socket, hello: dict) -> None:
        self.sock = sock
        self.file = sock.makefile("rw")
        self.rank = int(hello["rank"])
        self.host = str(hello.get("host", "?"))
        self.ifname = str(hello.get("ifname", "?"))
        self.addr = sock.getpeername()[0]
        self.lock = threading.Lock()

    def request(self, message: dict, timeout: float | None) -> dict:
        with self.lock:
            self.sock.settimeout(timeout)
            try:
                self.file.write(json.dumps(message) + "\n")
                self.file.flush()
                line = self.file.readline()
            except OSError as exc:
                raise WorkerLost(f"rank {self.rank} ({self.host}): {exc}") from exc
            if not line:
                raise WorkerLost(f"rank {self.rank} ({self.host}): connection closed")
            return json.loads(line)


class Leader:
    """Rank 0. `bind` is where it listens: by default its NCCL interface's address and the lab's
    rendezvous port (TensorRT-LLM under MPI); vLLM's native multi-node gives --master-addr and
    --master-port, and binding them fails as torch's TCP store does when the address is not
    this node's."""

    def __init__(self, world_size: int, bind: tuple[str, int] | None = None) -> None:
        self.world_size = world_size
        self.peers: list[Peer] = []
        self.dead: str | None = None
        self.ifname, self.addr = nccl_interface()
        nccl_log("INFO", f"Bootstrap : Using {self.ifname}:{self.addr}<0>")
        nccl_log("INFO", f"NET/Socket : Using [0]{self.ifname}:{self.addr}<0>")
        self.bind = bind or (self.addr, rendezvous_port())
        self.server = socket.create_server(self.bind, reuse_port=False)

    def gather(self) -> None:
        deadline = time.monotonic() + rendezvous_timeout()
        trt_log("I", f"Waiting for {self.world_size - 1} worker rank(s) on "
                     f"{self.bind[0]}:{self.bind[1]}")
        while len(self.peers) < self.world_size - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                raise NcclError("NCCL error: remote process exited or there was a network "
                                f"error (sparklab: only {len(self.peers) + 1} of "
                                f"{self.world_size} ranks joined within "
                                f"{rendezvous_timeout():.0f} s)")
            self.server.settimeout(min(left, 5))
            try:
                sock, _ = self.server.accept()
            except TimeoutError:
                continue
            sock.settimeout(10)
            try:
                hello = json.loads(sock.makefile().readline() or "{}")
            except (OSError, ValueError):
                sock.close()
                continue
            if hello.get("type") != "hello":
                sock.close()
                continue
            peer = Peer(sock, hello)
            if hello.get("listen"):
                connect_back(peer, tuple(hello["listen"]))
            self.peers.append(peer)
            nccl_log("INFO", f"Connected rank {peer.rank} ({peer.host}) via "
                             f"{hello.get('ifname')}:{peer.addr}<0>")

    def check_models(self, refs: list[tuple[str, str]]) -> None:
        errors = []
        for peer in self.peers:
            reply = peer.request({"op": "check", "refs": refs}, timeout=60)
            errors += [f"rank {peer.rank} ({peer.host}): {e}" for e in reply.get("errors", [])]
        if errors:
            raise RuntimeError("model files missing on some ranks:\n  " + "\n  ".join(errors))

    def load(self) -> None:
        threads, failures = [], []

        def one(peer: Peer) -> None:
            try:
                peer.request({"op": "load"}, timeout=None)
            except WorkerLost as exc:
                failures.append(str(exc))

        for peer in self.peers:
            threads.append(threading.Thread(target=one, args=(peer,), daemon=True))
            threads[-1].start()
        for t in threads:
            t.join()
        if failures:
            raise WorkerLost("; ".join(failures))

    def forward(self, timeout: float = 30) -> None:
        """One step through every rank (what /health_generate and each request need)."""
        if self.dead:
            raise WorkerLost(self.dead)
        for peer in self.peers:
            try:
                peer.request({"op": "step"}, timeout=timeout)
            except (WorkerLost, ValueError) as exc:
                self.mark_dead(str(exc))
                raise WorkerLost(str(exc)) from exc

    def mark_dead(self, why: str) -> None:
        if not self.dead:
            self.dead = why
            trt_log("E", f"Executor worker failed: {why}; the engine can no longer serve")

    def watch(self) -> None:
        def loop() -> None:
            while not self.dead:
                time.sleep(1.0)
                try:
                    self.forward(timeout=30)
                except WorkerLost:
                    return
        threading.Thread(target=loop, daemon=True).start()

    def shutdown(self) -> None:
        for peer in self.peers:
            try:
                peer.sock.sendall(b'{"op": "shutdown"}\n')
                peer.sock.close()
            except OSError:
                pass


def check_refs(refs: list[list[str]]) -> list[str]:
    errors = []
    for what, ref in refs:
        try:
            resolve_model(ref, what)
        except ModelMissing as exc:
            errors.append(f"{what} {ref}: {exc}")
    return errors


CONNECT_BACK_SECONDS = 20.0


def connect_back(peer: Peer, listen: tuple) -> None:
    """NCCL's root connects to each rank's own bootstrap listener (the rank's NCCL_SOCKET_IFNAME
    address) to hand it its ring neighbour: a rank listening on a link rank 0 has no route to
    fails the bootstrap, as in a ring whose ranks bootstrap on a link to another neighbour."""
    host, port = str(listen[0]), int(listen[1])
    deadline = time.monotonic() + CONNECT_BACK_SECONDS
    while True:
        try:
            socket.create_connection((host, port), timeout=5).close()
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                nccl_log("WARN", f"Connect to {host}<{port}> failed : {exc.strerror or exc}")
                raise NcclError(f"NCCL error: remote process exited or there was a network "
                                f"error (sparklab: rank 0 could not reach rank {peer.rank} "
                                f"({peer.host}) at its bootstrap address {host}:{port} on "
                                f"{peer.ifname}: {exc.strerror or exc})") from exc
            time.sleep(0.5)


def listen_for_root(addr: str) -> socket.socket:
    """This rank's bootstrap listener on its NCCL interface; rank 0 connects to it once."""
    server = socket.create_server((addr, 0))

    def accept() -> None:
        server.settimeout(rendezvous_timeout())
        with contextlib.suppress(OSError):  # rank 0 never came: the rank fails on its own
            server.accept()[0].close()
        server.close()
    threading.Thread(target=accept, daemon=True).start()
    return server


def connect_to_leader(rank: int, at: tuple[str, int] | None = None) -> socket.socket:
    """To rank 0: the MPI hostfile's first host (TensorRT-LLM; the lab's stand-in for NCCL's
    unique id, broadcast over MPI) or `at`, vLLM's --master-addr/--master-port. The kernel picks
    the route and source address (NCCL's and torch's clients bind none): in a ring, the link to
    rank 0. Under TensorRT-LLM the rank also listens on its NCCL interface, which rank 0 must
    reach back (connect_back)."""
    ifname, addr = nccl_interface()
    leader, port = at or (leader_address(), rendezvous_port())
    listener = listen_for_root(addr) if at is None else None
    deadline = time.monotonic() + rendezvous_timeout()
    last_warn = 0.0
    while True:
        try:
            sock = socket.create_connection((leader, port), timeout=5)
            sock.settimeout(None)
            hello = {"type": "hello", "rank": rank, "host": hostname(), "ifname": ifname}
            if listener is not None:
                hello["listen"] = [addr, listener.getsockname()[1]]
            sock.sendall((json.dumps(hello) + "\n").encode())
            return sock
        except OSError as exc:
            if time.monotonic() > deadline:
                raise NcclError(f"NCCL error: remote process exited or there was a network "
                                f"error (sparklab: rank {rank} could not reach rank 0 at "
                                f"{leader}:{port}: {exc.strerror or exc})") from exc
            if time.monotonic() - last_warn > 30:
                nccl_log("WARN", f"Connect to {leader}<{port}> failed : "
                                 f"{exc.strerror or exc} (retrying)")
                last_warn = time.monotonic()
            time.sleep(0.5)


def watch_rank_die(rank: int) -> None:
    def loop() -> None:
        while True:
            if fault("rank-die"):
                trt_log("E", f"sparklab fault rank-die: worker rank {rank} on {hostname()} "
                             "exits now")
                # Exit 0 keeps mpirun and rank 0 alive: the lab models the degraded-but-running
                # case (rank 0 then fails /health and /health_generate).
                os._exit(0)
            time.sleep(0.5)
    threading.Thread(target=loop, daemon=True).start()


def run_worker(rank: int, at: tuple[str, int] | None = None) -> int:
    watch_rank_die(rank)
    sock = connect_to_leader(rank, at)
    trt_log("I", f"Worker rank {rank} on {hostname()} joined the leader")
    stream = sock.makefile("rw")
    for line in stream:
        msg = json.loads(line)
        op = msg.get("op")
        if op == "shutdown":
            return 0
        if op == "check":
            reply: dict = {"errors": check_refs(msg["refs"])}
        elif op == "load":
            load_weights(rank)
            reply = {"loaded": True}
        else:
            reply = {"ok": True}
        stream.write(json.dumps(reply) + "\n")
        stream.flush()
    return 0


def load_weights(rank: int) -> None:
    seconds = float(lab_config()["engine_load_seconds"])
    trt_log("I", f"Rank {rank}: loading weights (sparklab: {seconds:g} s)")
    from .memory import Loader

    memory = Loader()
    start = time.monotonic()
    end = start + seconds
    while time.monotonic() < end or fault("engine-hang"):
        memory.step((time.monotonic() - start) / max(seconds, 0.1))
        time.sleep(0.1)
    memory.finish()
    trt_log("I", f"Rank {rank}: weights loaded")
