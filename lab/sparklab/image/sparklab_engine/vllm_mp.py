"""vLLM's native multi-node (`--distributed-executor-backend mp --nnodes N --node-rank R
--master-addr HEAD --master-port P`, `--headless` on the other ranks), without Ray.

Rank 0 (the node that serves the API) listens on --master-addr:--master-port; each headless rank
connects there from its own NCCL interface (the fabric) and checks the model on its node, loads
its share, then answers one step per request until rank 0 goes away. The wire is the lab's
rendezvous (rendezvous.py), the stand-in for torch's TCP store and NCCL.
"""
from __future__ import annotations

from .rendezvous import Leader, WorkerLost, run_worker


class MpExecutor:
    """What the API server of rank 0 drives: every rank joined, one step through all of them."""

    def __init__(self, model: str, nnodes: int, master: str, port: int) -> None:
        self.model, self.nnodes = model, nnodes
        try:
            self.leader = Leader(nnodes, bind=(master, port))
        except OSError as exc:  # torch's TCPStore: the master address must be this node's
            raise RuntimeError(f"The server socket has failed to bind to {master}:{port} "
                               f"(errno: {exc.errno} - {exc.strerror}). Is --master-addr this "
                               "node's address?") from None

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
