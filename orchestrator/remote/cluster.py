"""Many nodes at once: the one place sparkctl runs work in parallel across nodes.

`Cluster` is fabric's Group idea over sparkctl's transports: `map(fn)` runs `fn(node,
transport)` on every node in parallel and returns each node's value or the exception it raised,
so one unreachable node never hides the others' results. `parallel()` is the same for any keyed
work (connecting, copying to peers). Commands and the executor use these instead of their own
thread pools, so the concurrency limit and the error handling are decided here once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from orchestrator.remote.transport import Transport

K = TypeVar("K")
T = TypeVar("T")
MAX_PARALLEL = 32
"""More SSH sessions at once than this only queue in sshd (MaxStartups) and the controller."""


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """One node's answer: its value, or the exception it raised."""

    value: T | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def get(self) -> T:
        """The value, or re-raise the node's exception."""
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


def executor_pool(size: int) -> ThreadPoolExecutor:
    """The pool of the executor's lock-step phases (it submits step by step and shuts the pool
    down itself, cancelling what an interrupt left queued)."""
    return ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL, size)))


def parallel(fn: Callable[[K], T], keys: Iterable[K], limit: int = MAX_PARALLEL) -> dict[K, Outcome[T]]:
    """fn(key) for every key at once; every key's value or exception, in the keys' order.
    KeyboardInterrupt is never swallowed: it propagates at once."""
    keys = list(keys)
    if not keys:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(limit, len(keys)))) as pool:
        futures: dict[K, Future[T]] = {key: pool.submit(fn, key) for key in keys}
        out: dict[K, Outcome[T]] = {}
        for key, future in futures.items():
            try:
                out[key] = Outcome(value=future.result())
            except Exception as exc:
                out[key] = Outcome(error=exc)
        return out


class Cluster:
    """The reachable nodes of one run, by name, each with its one connection."""

    def __init__(self, transports: Mapping[str, Transport]) -> None:
        self.transports = dict(transports)

    @property
    def nodes(self) -> list[str]:
        return list(self.transports)

    def __getitem__(self, node: str) -> Transport:
        return self.transports[node]

    def map(self, fn: Callable[[str, Transport], T], nodes: Iterable[str] | None = None
            ) -> dict[str, Outcome[T]]:
        """fn(node, transport) on every (or the named) node in parallel."""
        names = [n for n in (self.nodes if nodes is None else nodes) if n in self.transports]
        return parallel(lambda name: fn(name, self.transports[name]), names)

    def values(self, fn: Callable[[str, Transport], T], nodes: Iterable[str] | None = None,
               on_error: Callable[[str, BaseException], T] | None = None) -> dict[str, T]:
        """Like map, but each failure becomes on_error(node, exc) (or is re-raised)."""
        out: dict[str, T] = {}
        for name, outcome in self.map(fn, nodes).items():
            if outcome.ok:
                out[name] = outcome.get()
            elif on_error is not None and outcome.error is not None:
                out[name] = on_error(name, outcome.error)
            else:
                outcome.get()
        return out
