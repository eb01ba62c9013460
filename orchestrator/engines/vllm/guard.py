"""The port guard of a vLLM server over Ray: its Ray ports answer on loopback and the fabric only.

Ray has no authentication (a client that reaches the GCS runs code on the cluster), and Ray 2.60
binds its GCS, raylet and agents on every interface whatever `--node-ip-address` says (it has no
bind-address setting). So before a node's Ray container starts, that node gets an iptables
chain `sparkctl-ray-<server>` (IPv4 and IPv6), hooked first in INPUT, that refuses every port of
the server's Ray (engines/vllm/ports.py: they are all fixed) on every interface but `lo` and the
inventory's fabric interfaces (orchestrator/node/portguard.py does it, on the node, as root).

Removed with the server: `down --server` (or a replace) on its nodes, as its record's
`port_guard` names it, and `down` everywhere (phases/port_guards.py, every sparkctl chain). A
chain whose container no longer runs (a server that stopped without `down`) is removed by the
next launch on that node. A node without iptables is refused before anything
changes, naming the package: the guard never silently leaves Ray open.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any

from orchestrator.core.step import Change, NodeContext, Outcome, Step, Unchanged
from orchestrator.engines.vllm.ports import RAY_CLIENT
from orchestrator.errors import SparkctlError
from orchestrator.phases.port_guards import answer_of, fact_of, guard_cmd

if TYPE_CHECKING:
    from orchestrator.engines.vllm.serve import ServeSpec
    from orchestrator.inventory import Inventory, Node

PREFIX = "sparkctl-ray-"
CHAIN_MAX = 28
"""iptables' longest chain name (XT_EXTENSION_MAXNAMELEN less its NUL)."""


def chain_name(server: str) -> str:
    """`sparkctl-ray-<server>`, or (a name too long for iptables) its start and a digest."""
    name = PREFIX + server
    if len(name) <= CHAIN_MAX and re.fullmatch(r"[A-Za-z0-9._-]+", server):
        return name
    digest = hashlib.sha256(server.encode()).hexdigest()[:8]
    start = re.sub(r"[^A-Za-z0-9._-]", "_", server)[:CHAIN_MAX - len(PREFIX) - 9]
    return f"{PREFIX}{start}-{digest}"


def guard_config(spec: ServeSpec) -> dict[str, Any]:
    """What portguard.py installs on each node of the server (the same on every node: a port
    only the head binds is closed on a worker too, where nothing listens on it)."""
    low, high = spec.ports.ray_node.workers
    return {"chain": chain_name(spec.name), "container": spec.container,
            "interfaces": list(spec.inventory.fabric.interfaces),
            "ports": [spec.ports.ray, RAY_CLIENT, *spec.ports.ray_node.singles()],
            "ranges": [[low, high]],
            "prefix": PREFIX}


def describe(config: dict[str, Any]) -> str:
    ports = ",".join(str(p) for p in config["ports"])
    ranges = ",".join(f"{low}-{high}" for low, high in config["ranges"])
    return (f"iptables/ip6tables chain {config['chain']} first in INPUT: Ray's TCP ports "
            f"{ports},{ranges} answer on lo and {', '.join(config['interfaces'])} only, "
            "refused (tcp-reset) on every other interface")


def guard_facts(spec: ServeSpec, inventory: Inventory, node: Node) -> dict[str, Any]:
    """The guard as the node has it now (portguard.py state: read-only). Its worker range
    read back, not compared: the placement step picks it from the facts (engines/vllm/check.py)."""
    if node.name not in spec.nodes:
        return {}
    return {"commands": {"portguard": guard_cmd("state", {**guard_config(spec), "ranges": None})}}


def missing_message(node: str, missing: list[str], server: str) -> str:
    return (f"{node}: {' and '.join(missing)} not found, and vLLM over Ray needs it: Ray has no "
            f"authentication and binds every interface, so without the port guard server "
            f"{server}'s Ray would answer on the management network. Install it on {node} "
            "(`sudo apt-get install iptables`), or use `executor: mp` in the recipe (no Ray)")


class GuardRayPorts(Step):
    """On every node of the server, before its Ray container: the port guard installed (or
    already as wanted), and a chain left by a server that no longer runs removed."""

    name = "ray-port-guard"

    def __init__(self, spec: ServeSpec) -> None:
        self.spec = spec

    def check(self, ctx: NodeContext) -> Outcome:
        node, spec = ctx.node.name, self.spec
        if node not in spec.nodes:
            return Unchanged(f"{spec.name} does not run here")
        found = fact_of(ctx, "portguard")
        if found.get("missing"):
            raise SparkctlError(missing_message(node, list(found["missing"]), spec.name))
        if "error" in found:
            raise SparkctlError(f"{node}: could not read its firewall for the Ray port guard: "
                                f"{found['error']}")
        config = guard_config(spec)
        leftovers = list(found.get("leftovers") or [])
        current = bool(found.get("current")) and found.get("ranges") == config["ranges"]
        if current and not leftovers:
            return Unchanged(f"Ray's ports closed beyond lo and the fabric ({config['chain']})")
        what = [] if current else [describe(config)]
        what += [f"remove {chain} (its server no longer runs)" for chain in leftovers]
        return Change("; ".join(what), commands=(guard_cmd("install", config),))

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        result = ctx.run(change.commands[0], sudo=True, timeout=120,
                         display=f"python3 -c <portguard> install {chain_name(self.spec.name)}")
        found = answer_of(result.stdout, result.stderr)
        if found.get("missing"):
            raise SparkctlError(missing_message(ctx.node.name, list(found["missing"]),
                                                self.spec.name))
        if not result.ok or "error" in found:
            raise SparkctlError(f"{ctx.node.name}: the Ray port guard could not be installed: "
                                f"{found.get('error') or result.stderr.strip()[-300:]}")
        removed = found.get("removed") or []
        return ("Ray's ports answer on lo and the fabric only"
                + (f"; removed {', '.join(removed)} (no longer running)" if removed else ""))
