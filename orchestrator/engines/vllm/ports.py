"""The ports of one vLLM server, picked deterministically from its API port.

Each server runs its own Ray cluster (or its own mp rendezvous) in its own containers, and Ray
binds fixed ports on every node: the GCS (`--port`, 6379 by default), the Ray client server
(10001 on the head) and the dashboard agent (52365 on every node). Two servers' Ray heads on one
node would take the same ports and the second would not start. (The client server is left
alone: sparkctl never uses it, and `--ray-client-server-port` is refused by a Ray without its
client extras: "Ray Client requires pip package `ray[client]`".) So every port a server binds
besides its API port is its base plus an offset taken from the API port (`port % 1000`): the
default server on 8000 keeps Ray's 6379 and vLLM's 29501; `--port 8001` gets 6380, 29502, ...
Servers sharing a node already need different API ports, so their Ray ports differ too (two API
ports 1000 apart are the one collision: the launch's port checks name it, phases/ports.py and
engines/servers.py).

The agent's port lives in its own block (25000 + offset): below Linux's ephemeral range and
outside Ray's worker ports (10002-19999).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.engines.vllm.recipe import Recipe

SLOTS = 1000
RAY_AGENT_BASE = 25000
LOWEST, HIGHEST = 1024, 65535


def _shift(base: int, offset: int) -> int:
    """base + offset, wrapped into the unprivileged ports."""
    return (base + offset - LOWEST) % (HIGHEST - LOWEST + 1) + LOWEST


@dataclass(frozen=True)
class ServerPorts:
    api: int
    """The OpenAI API (`--port`), on the server's first node."""
    ray: int
    """The Ray head's GCS (`ray start --port`), on the first node."""
    ray_agent: int
    """Ray's dashboard agent (`--dashboard-agent-listen-port`), on every node of the server."""
    master: int
    """vLLM's --master-port (mp executor on several nodes), on the first node."""

    @classmethod
    def of(cls, recipe: Recipe) -> ServerPorts:
        offset = recipe.port % SLOTS
        return cls(api=recipe.port, ray=_shift(recipe.ray.port, offset),
                   ray_agent=_shift(RAY_AGENT_BASE, offset),
                   master=_shift(recipe.master_port, offset))

    def bound(self, backend: str, nodes: int) -> list[int]:
        """Every port this server binds besides nothing else (what its record lists)."""
        if backend == "ray":
            return [self.api, self.ray, self.ray_agent]
        return [self.api, *([self.master] if nodes > 1 else [])]
