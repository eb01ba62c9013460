"""`launch --persist`: a server that comes back after a node reboot, for every engine.

Two halves, as on any Docker host: the containers run with a restart policy (`--restart
unless-stopped` in their `docker run` argv, phases/container.py RESTART_POLICY), so docker starts
them again when the node boots; and a small boot unit on each serving node,
`sparkctl-serve-<server>.service`, re-runs what `launch` ran there after the containers, with
the same checks, in the same order. Its ExecStart is the node script orchestrator/node/boot.py
(installed as BOOT_SCRIPT) with this node's boot plan (`<BOOT_DIR>/<server>.json`):

  fabric     every fabric interface up with the inventory's address (networkd re-applies
             sparkctl's netplan file at boot), within the deadline
  containers each one running (`docker start` when docker has not restarted it)
  models     the model's (and draft's) directory present in the node's HF cache
  memory     MemAvailable >= what the recipe loads here + the memory guard's margin
  wait       the head waits for its peers (their sshd, Ray workers, ranks): head last
  start      what launch ran on this node, the same commands (memory guard, mpirun, vllm serve)
  ready      the node's part answers (the head: /health 200 on 127.0.0.1:<port>)

Each engine says what its nodes run (`Part`), the rest is this module. Every file goes through
the ledger (phases/files.py): a user's file at one of these paths is never overwritten. `down`
disables and removes the units (phases/teardown.py, engines/servers.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.commands import join, quote
from orchestrator.core.step import Change, NodeContext, Outcome, Phase, Step, Unchanged
from orchestrator.inventory import Inventory, Node
from orchestrator.node import script
from orchestrator.paths import RUN_DIR
from orchestrator.phases.boot_units import (
    BOOT_LOG_DIR,
    BOOT_SCRIPT,
    launch_marker,
    plan_path,
    unit_name,
    unit_path,
)
from orchestrator.phases.files import FileSpec, ManagedFiles, files_request
from orchestrator.remote.container import ContainerCommands


@dataclass(frozen=True)
class Part:
    """What one node runs for the server at boot, after the shared checks, in order."""

    containers: list[str]
    first: list[tuple[str, str]] = field(default_factory=list)
    """(what, shell command) run before anything else at every boot, idempotent; a failure ends
    the boot there (the command itself must leave nothing unsafe running)."""
    wait: list[tuple[str, str]] = field(default_factory=list)
    """(what, shell condition) that must hold before `start` (the head: its peers are up)."""
    start: list[tuple[str, str]] = field(default_factory=list)
    """(what, shell command) run in order: what `launch` ran here after the containers."""
    ready: list[tuple[str, str]] = field(default_factory=list)
    """(what, shell condition): this node's part is up (checked last, and first: already up?)."""
    health_port: int | None = None
    """The node answers here (127.0.0.1): /health 200 means served (the server's first node)."""
    ranks: str | None = None
    """The first node of a server whose /health outlives a lost rank (vLLM's mp multi-node): a
    command printing the connections its processes hold to each peer (node/rank_links.py); the
    watcher restarts the server when a rank that died comes back."""
    restart: list[tuple[str, str]] | None = None
    """(what, shell command) that stops a stalled server here before `start` runs again (the
    first node's watcher, node/boot.py); None: `docker restart` of the containers."""


@dataclass(frozen=True)
class PersistSpec:
    server: str
    engine: str
    recipe: Any
    inventory: Inventory
    nodes: list[str]
    """The serving nodes, the one that answers first."""
    part: Callable[[Node], Part]
    guard_gb: float
    loaded_gb: float
    """What the recipe holds on each node before its KV cache (weights share, draft, runtime)."""
    deadline: float = 1800.0


def hub_dir(hf_cache: str, repo: str) -> str:
    return f"{hf_cache.rstrip('/')}/hub/models--{repo.replace('/', '--')}"


def model_dirs(recipe: Any, hf_cache: str) -> list[str]:
    """Where the node keeps the recipe's models (HF cache layout, or a local dir under it)."""
    from orchestrator.recipe import CONTAINER_HF_HOME

    out = []
    for repo, _, local in recipe.repos:
        if local is None:
            out.append(hub_dir(hf_cache, repo))
        elif local.startswith(CONTAINER_HF_HOME + "/"):
            out.append(hf_cache.rstrip("/") + local[len(CONTAINER_HF_HOME):])
    return out


def boot_plan(spec: PersistSpec, node: Node, hf_cache: str) -> dict[str, Any]:
    """The node's boot plan (pure): what BOOT_SCRIPT checks and runs, in order."""
    inv = spec.inventory
    part = spec.part(node)
    fabric = [{"interface": name, "address": inv.fabric_address(node, name)}
              for name in inv.fabric.interfaces]
    return {
        "server": spec.server, "engine": spec.engine, "node": node.name,
        "role": "head" if node.name == spec.nodes[0] else "peer", "nodes": spec.nodes,
        "fabric": fabric, "containers": part.containers,
        "models": model_dirs(spec.recipe, hf_cache),
        # only where this unit starts what loads: where docker's restart policy brought the
        # server back (SGLang) it is loading already, and the check would race it
        "memory": ({"loaded_gb": round(spec.loaded_gb, 2), "guard_gb": spec.guard_gb}
                   if part.start else None),
        "first": [{"what": w, "cmd": c} for w, c in part.first],
        "wait": [{"what": w, "cmd": c} for w, c in part.wait],
        "start": [{"what": w, "cmd": c} for w, c in part.start],
        "ready": [{"what": w, "cmd": c} for w, c in part.ready],
        "health_port": part.health_port, "deadline_seconds": int(spec.deadline),
        "ranks": {"cmd": part.ranks} if part.ranks else None,
        "log": f"{BOOT_LOG_DIR}/boot-{spec.server}.log",
        # the unit stays to watch: one node rebooting alone must not leave the server stalled
        "watch": True, "guard_record": f"{RUN_DIR}/memguard-stopped.json",
        "launch_marker": launch_marker(spec.server),
        "restart": [{"what": w, "cmd": c} for w, c in (
            part.restart if part.restart is not None else
            [(f"docker restart {', '.join(part.containers)}",
              join(["docker", "restart", *part.containers]))])],
    }


def unit_text(server: str, engine: str, nodes: list[str]) -> str:
    return (
        "# Written by sparkctl (`launch --persist`); `sparkctl down` removes it.\n"
        "[Unit]\n"
        f"Description=sparkctl: bring server {server} ({engine} on {', '.join(nodes)}) back "
        "after a reboot\n"
        "Wants=network-online.target\n"
        "After=network-online.target docker.service\n"
        "Requires=docker.service\n\n"
        "[Service]\n"
        # exec, not oneshot: the head waits up to its deadline for peers and /health, and a
        # oneshot unit would hold multi-user.target (and the whole boot) until then
        "Type=exec\n"
        f"ExecStart=/usr/bin/python3 {BOOT_SCRIPT} {plan_path(server)}\n\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def render(spec: PersistSpec) -> Callable[[NodeContext], list[FileSpec]]:
    def files(ctx: NodeContext) -> list[FileSpec]:
        from orchestrator.node import script
        from orchestrator.phases.container import node_hf_cache

        if ctx.node.name not in spec.nodes:
            return []
        plan = boot_plan(spec, ctx.node, node_hf_cache(ctx))
        return [FileSpec(BOOT_SCRIPT, 0o755, script("boot.py")),
                FileSpec(plan_path(spec.server), 0o644, json.dumps(plan, indent=1) + "\n"),
                FileSpec(unit_path(spec.server), 0o644,
                         unit_text(spec.server, spec.engine, spec.nodes))]
    return files


def enabled_cmd(server: str) -> str:
    """`enabled active` once launch --persist ran (its watcher runs), else what systemd says."""
    unit = quote(unit_name(server))
    return (f"echo $(systemctl is-enabled {unit} 2>/dev/null || true) "
            f"$(systemctl is-active {unit} 2>/dev/null || true)")


class EnableUnit(Step):
    """The boot unit enabled (started by systemd at boot, after docker and the network)."""

    name = "boot-unit"

    def __init__(self, spec: PersistSpec) -> None:
        self.spec = spec

    def check(self, ctx: NodeContext) -> Outcome:
        if ctx.node.name not in self.spec.nodes:
            return Unchanged("not a serving node")
        unit = unit_name(self.spec.server)
        state = ctx.facts.output("unit_enabled")
        rewritten = f"{ctx.node.name}: persist/boot-files" in ctx.shared.changed_steps
        if state.split() == ["enabled", "active"] and not rewritten:
            return Unchanged(f"{unit} enabled and watching")
        return Change(f"enable {unit}: at boot it checks the fabric, containers, models and "
                      f"memory, then starts {self.spec.server} here "
                      + ("(after its peers)" if ctx.node.name == self.spec.nodes[0] and
                         len(self.spec.nodes) > 1 else ""), commands=(enable_cmd(self.spec.server),))

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        unit = unit_name(self.spec.server)
        super().apply(ctx, change)
        return (f"{unit} enabled and started (it watches the server; log: "
                f"{BOOT_LOG_DIR}/boot-{self.spec.server}.log)")


def enable_cmd(server: str) -> str:
    """The unit enabled, and started now too: its watcher must run before any reboot (a peer
    may reboot first); restarted, so a rewritten plan is the one it watches with."""
    unit, marker = unit_name(server), launch_marker(server)
    return (f"systemctl daemon-reload && {join(['systemctl', 'enable', unit])} && "
            f"mkdir -p {quote(marker.rsplit('/', 1)[0])} && touch {quote(marker)} && "
            f"{join(['systemctl', 'restart', unit])}")


def stale(server: str) -> Callable[[dict[str, str]], list[str]]:
    """The boot unit a launch without --persist makes stale ({server: engine} -> servers):
    this server's own (every engine runs named servers side by side, so no other's)."""
    def pick(units: dict[str, str]) -> list[str]:
        return sorted(s for s in units if s == server)
    return pick


def phase(spec: PersistSpec) -> Phase:
    from orchestrator.phases import persist_down

    def facts(inv: Inventory, node: Node) -> dict[str, Any]:
        from orchestrator.paths import LEDGER
        from orchestrator.phases.container import spec_facts
        from orchestrator.remote.facts import merge_requests

        own = spec_facts([], [], inv.cluster.user)
        own.pop("ibdev2netdev", None)
        own["files"] = {**files_request([BOOT_SCRIPT, plan_path(spec.server),
                                         unit_path(spec.server)]), LEDGER: True}
        own["commands"]["unit_enabled"] = enabled_cmd(spec.server)
        return merge_requests([own, persist_down.facts(inv)])

    return Phase("persist", [ManagedFiles("boot-files", render(spec)), EnableUnit(spec)], facts)


def persistence_phase(server: str, persist: bool, persistent: Callable[[], Phase]) -> Phase:
    """The last phase of every engine's launch: with --persist the engine's own (PERSISTENT
    makes it), else the one that takes a stale boot unit of SERVER away."""
    return persistent() if persist else not_persistent_phase(server)


def not_persistent_phase(server: str) -> Phase:
    """A launch without --persist: the server's own boot unit, left by an earlier launch with
    --persist, goes (see `stale`)."""
    from orchestrator.phases import persist_down

    step = persist_down.RemoveBootUnits(select=stale(server), name="stale-boot-units")
    # its step reads only the boot units, and no earlier phase of a launch writes one (stopping
    # a server removes its containers and record, not its unit): the facts gathered up front
    # stay valid through the serve phase's changes, so this costs no second round trip
    # the boot units alone: each node's `docker ps` and `docker inspect` of restart policies
    # (what `down` reads) would cost a launch two docker calls per node for nothing
    return Phase("persist", [step], lambda inv, node: persist_down.units_facts(), stale_after=())


# ---------------------------------------------------------------- the parts engines share
def tcp_cmd(host: str, port: int) -> str:
    """A shell condition: something accepts TCP connections at host:port."""
    return join(["python3", "-c", script("tcp_open.py"), host, str(port)])


def running_cmd(container: str) -> str:
    return ContainerCommands(container).is_running_cmd()
