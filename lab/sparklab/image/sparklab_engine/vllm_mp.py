"""vLLM's native multi-node (`--distributed-executor-backend mp --nnodes N --node-rank R
--master-addr HEAD --master-port P`, `--headless` on the other ranks), without Ray.

Rank 0 (the node that serves the API) listens on --master-port (every address, as torch's TCP
store does); each headless rank connects to its --master-addr:--master-port (the kernel picks the
route, the fabric link to rank 0) and checks the model on its node, loads its share, then answers
one step per request until rank 0 goes away. The wire is the lab's
rendezvous (rendezvous.py), the stand-in for torch's TCP store and NCCL.
"""
from __future__ import annotations

from .rendezvous import Leader, WorkerLost, run_worker


class MpExecutor:
    """What the API server of rank 0 drives: every rank joined, one step through all of them."""

    def __init__(self, model: str, nnodes: int, master: str, port: int) -> None:
        self.model, self.nnodes = model, nnodes
        try:
            # torch's TCP store listens on every address of rank 0's node; the others connect to
            # the --master-addr they were given (the head's address on the link they share)
            self.leader = Leader(nnodes, bind=("", port))
        except OSError as exc:
            raise RuntimeError(f"The server socket has failed to listen on any local network "
                               f"address. port: {port}, useIpv6: 0, code: -98, name: EADDRINUSE, "
                               f"message: {exc.strerror}") from None

    @property
    def dead(self) -> str | None:
        return self.leader.dead

    def start(self) -> None:
        self.leader.gather()
        self.leader.check_models([("model", self.model)])

    def load(self) -> None:
        self.leader.load()
        self.leader.watch()

    def step(self) -> None:
        try:
            self.leader.forward()
        except WorkerLost as exc:
            raise RuntimeError(str(exc)) from exc

    def shutdown(self) -> None:
        self.leader.shutdown()


def run_headless(rank: int, master: str, port: int) -> int:
    """A headless rank: no API server, its share of the model, until rank 0 shuts down."""
    return run_worker(rank, (master, port))
