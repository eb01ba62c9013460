"""The ports of one vLLM server, picked deterministically from its API port.

Each server runs its own Ray cluster (or its own mp rendezvous) in its own containers, and Ray
binds fixed ports on every node: the GCS (`--port`, 6379 by default), the raylet's node and
object managers, the runtime-env agent, the dashboard agent (HTTP and gRPC), the metrics
exporter, and one port per worker process. Left to Ray, most of these are random (or 52365,
10002-19999 for every cluster alike), so two servers' Ray nodes on one node would collide and no
firewall could name them. Every one is fixed here and passed to `ray start` (the option names
are Ray 2.60's `ray start --help`), so the port guard (engines/vllm/guard.py) can close exactly
these on every interface but loopback and the fabric: Ray 2.60 binds every interface whatever
`--node-ip-address` says, and has no authentication.

Every port a server binds besides its API port is a base plus an offset taken from the API port
(`port % 1000`): the default server on 8000 keeps Ray's 6379 and vLLM's 29501; `--port 8001`
gets 6380, 29502, ... Servers sharing a node already need different API ports, so their Ray
ports differ too (two API ports 1000 apart are the one collision: the launch's port checks name
it, phases/ports.py and engines/servers.py). The blocks, all below Linux's ephemeral range
(32768) and clear of SGLang's dist port (20000 + offset) and the key relay (API port + 10000):

    GCS 6379+o | node manager 21000+o | object manager 22000+o | runtime-env agent 23000+o
    dashboard agent gRPC 24000+o | dashboard agent HTTP 25000+o | metrics export 26000+o
    workers: 50 ports in one of 199 slots of Ray's own default range 10002-19999: slot o % 199,
             unless a server on one of its nodes holds it (API ports 199 apart), then the next
             free one (engines/vllm/check.py picks it from the other servers' records)

The Ray client server (`ray://`, the head's) is left at Ray's 10001: Ray starts it only where
its `ray[client]` dependencies are installed, and refuses `--ray-client-server-port` where they
are not (the lab's Ray), so no option can move it on every image; the port guard closes 10001
on every node all the same (it is how a Ray client on another network would connect). The
dashboard is off (`--include-dashboard=false`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.engines.vllm.recipe import Recipe

SLOTS = 1000
LOWEST, HIGHEST = 1024, 65535
NODE_MANAGER_BASE = 21000
OBJECT_MANAGER_BASE = 22000
RUNTIME_ENV_AGENT_BASE = 23000
RAY_AGENT_GRPC_BASE = 24000
RAY_AGENT_BASE = 25000
METRICS_EXPORT_BASE = 26000
RAY_CLIENT = 10001
"""Ray's client server on the head, where the image's Ray has `ray[client]` (Ray's own default:
ray/scripts/scripts.py picks it when no port is given)."""
WORKER_BASE = 10002
WORKER_PORTS = 50
"""Worker processes per Ray node of one server: vLLM's driver and its one GPU worker per node,
plus the idle workers Ray prestarts (one per CPU it counts, `ray.num_cpus` in the recipe)."""
WORKER_SLOTS = (20000 - WORKER_BASE) // WORKER_PORTS


def worker_range(slot: int) -> tuple[int, int]:
    """The lowest and highest worker port of SLOT (0 .. WORKER_SLOTS - 1)."""
    low = WORKER_BASE + WORKER_PORTS * slot
    return low, low + WORKER_PORTS - 1


def free_worker_slot(offset: int, taken: set[int]) -> int | None:
    """The offset's own slot when none of its ports is TAKEN (ports other servers on the same
    nodes bind), else the next free slot after it, or None when every slot holds one."""
    for step in range(WORKER_SLOTS):
        slot = (offset + step) % WORKER_SLOTS
        low, high = worker_range(slot)
        if not any(low <= port <= high for port in taken):
            return slot
    return None


def _shift(base: int, offset: int) -> int:
    """base + offset, wrapped into the unprivileged ports."""
    return (base + offset - LOWEST) % (HIGHEST - LOWEST + 1) + LOWEST


@dataclass(frozen=True)
class RayPorts:
    """Every port a server's Ray node binds besides the GCS (which only the head runs)."""

    node_manager: int
    """The raylet (`--node-manager-port`)."""
    object_manager: int
    """The raylet's object manager (`--object-manager-port`)."""
    runtime_env_agent: int
    """`--runtime-env-agent-port`."""
    agent_grpc: int
    """The dashboard agent's gRPC (`--dashboard-agent-grpc-port`)."""
    agent_http: int
    """The dashboard agent's HTTP (`--dashboard-agent-listen-port`)."""
    metrics: int
    """`--metrics-export-port`."""
    workers: tuple[int, int]
    """Worker processes' ports, lowest and highest (`--min-worker-port`, `--max-worker-port`)."""

    @classmethod
    def at(cls, offset: int, slot: int | None = None) -> RayPorts:
        """The ports of OFFSET, the workers in SLOT (default: the offset's own, offset % 199)."""
        low = worker_range(offset % WORKER_SLOTS if slot is None else slot)[0]
        return cls(node_manager=_shift(NODE_MANAGER_BASE, offset),
                   object_manager=_shift(OBJECT_MANAGER_BASE, offset),
                   runtime_env_agent=_shift(RUNTIME_ENV_AGENT_BASE, offset),
                   agent_grpc=_shift(RAY_AGENT_GRPC_BASE, offset),
                   agent_http=_shift(RAY_AGENT_BASE, offset), metrics=_shift(METRICS_EXPORT_BASE, offset),
                   workers=(low, low + WORKER_PORTS - 1))

    def slot(self) -> int:
        return (self.workers[0] - WORKER_BASE) // WORKER_PORTS

    def args(self) -> list[str]:
        """`ray start`'s options for them, on every node."""
        low, high = self.workers
        return ["--node-manager-port", str(self.node_manager),
                "--object-manager-port", str(self.object_manager),
                "--runtime-env-agent-port", str(self.runtime_env_agent),
                "--dashboard-agent-grpc-port", str(self.agent_grpc),
                "--dashboard-agent-listen-port", str(self.agent_http),
                "--metrics-export-port", str(self.metrics),
                "--min-worker-port", str(low), "--max-worker-port", str(high)]

    def singles(self) -> list[int]:
        return [self.node_manager, self.object_manager, self.runtime_env_agent, self.agent_grpc,
                self.agent_http, self.metrics]

    def worker_range(self) -> list[int]:
        return list(range(self.workers[0], self.workers[1] + 1))


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
    ray_node: RayPorts
    """The rest of a Ray node's ports, on every node of the server."""

    @classmethod
    def of(cls, recipe: Recipe, worker_slot: int | None = None) -> ServerPorts:
        """RECIPE's ports; its Ray workers in WORKER_SLOT (default: its offset's own)."""
        offset = recipe.port % SLOTS
        node = RayPorts.at(offset, worker_slot)
        return cls(api=recipe.port, ray=_shift(recipe.ray.port, offset), ray_agent=node.agent_http,
                   master=_shift(recipe.master_port, offset), ray_node=node)

    def ray_ports(self) -> list[int]:
        """Every port of the server's Ray, on any of its nodes (what the port guard closes)."""
        return [self.ray, *self.ray_node.singles(), *self.ray_node.worker_range()]

    def bound(self, backend: str, nodes: int) -> list[int]:
        """Every port this server binds (what its record lists, so another server that would
        bind one of them is refused)."""
        if backend == "ray":
            return [self.api, *self.ray_ports()]
        return [self.api, *([self.master] if nodes > 1 else [])]
