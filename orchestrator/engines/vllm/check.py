"""A vLLM launch's first phase: this server judged against every node's servers (from facts,
no remote call while planning), and the migration from the single-server layout.

The shared judgement (engines/servers.py, engines/lifecycle.py): a server of another name on a
shared node must leave this one's ports and memory free; one of this name runs the same
configuration (no-op, or restart when stalled or dead), another configuration (refused, or
replaced with --replace).

Migration: sparkctl before named vLLM servers ran one per cluster, recorded in RUN_DIR/server.json
on the head, in containers named `sparkctl-vllm` (pid file vllm.pid). node/servers.py converts
that record once into the server's own (RUN_DIR/servers/<name>/server.json, "migrated_from"),
so status sees it, `down` and `down --server NAME` stop it. Relaunching its recipe under its
name replaces it: its containers and record go, the named server starts in their place, and the
plan says so. Such a server of another recipe is any other server (its port and memory are
judged; --replace does not reach it).

Ray's worker ports: a server over Ray takes its offset's own slot of 50 worker ports unless a
server of another name on one of its nodes holds a port of it (API ports 199 apart share the
slot), then the next free slot; a server running again keeps the slot its record lists
(engines/vllm/ports.py). No free slot: refused before anything changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.commands import quote
from orchestrator.core.step import Change, NodeContext, Outcome, Phase, Step, Unchanged
from orchestrator.engines import lifecycle, servers
from orchestrator.engines.vllm.ports import SLOTS, WORKER_BASE, WORKER_PORTS, WORKER_SLOTS, free_worker_slot
from orchestrator.errors import InputError
from orchestrator.records import Server

if TYPE_CHECKING:
    from orchestrator.engines.vllm.serve import ServeSpec
    from orchestrator.inventory import Inventory, Node


def earlier_of(spec: ServeSpec, found: list[Server]) -> Server | None:
    """The previous version's single vLLM server this launch takes over: same name and recipe
    (its record converted by node/servers.py's one-time migration)."""
    return next((s for s in found if s.migrated and s.engine == "vllm" and s.name == spec.name
                 and s.record.recipe == spec.recipe.name), None)


def recorded_slot(server: Server) -> int | None:
    """The worker slot a running server's record lists (its lowest port in Ray's range)."""
    workers = [p for p in server.record.listen_ports or []
               if WORKER_BASE <= p < WORKER_BASE + WORKER_PORTS * WORKER_SLOTS]
    return (min(workers) - WORKER_BASE) // WORKER_PORTS if workers else None


def place_workers(spec: ServeSpec, running: list[Server]) -> None:
    """Give SPEC's Ray workers a slot no other server on its nodes holds (its own when free)."""
    if spec.backend != "ray":
        return
    others = [s for s in running if s.name != spec.name and set(s.record.nodes) & set(spec.nodes)]
    taken = set().union(*(servers.ports_of(s) for s in others))
    mine = next((s for s in running if s.name == spec.name), None)
    kept = recorded_slot(mine) if mine is not None else None
    if kept is not None and free_worker_slot(kept, taken) == kept:
        spec.use_worker_slot(kept)
        return
    slot = free_worker_slot(spec.recipe.port % SLOTS, taken)
    if slot is None:
        raise InputError(
            f"{', '.join(spec.nodes)}: every one of Ray's {WORKER_SLOTS} worker port slots "
            f"({WORKER_PORTS} ports each, {WORKER_BASE}-{WORKER_BASE + WORKER_PORTS * WORKER_SLOTS - 1}) "
            f"is held by another server ({', '.join(sorted(s.name for s in others))}): stop one "
            "(`sparkctl down --server NAME`) or use `executor: mp` in the recipe (no Ray)")
    spec.use_worker_slot(slot)


class Placement(Step):
    """Every node's servers against this one: its name, ports and memory (from facts)."""

    name = "placement"
    scope = "head"

    def __init__(self, spec: ServeSpec) -> None:
        self.spec = spec

    def check(self, ctx: NodeContext) -> Outcome:
        spec = self.spec
        everything = servers.from_facts(ctx.cluster_facts, alive_only=False)
        earlier = earlier_of(spec, everything)
        running = [s for s in everything if s.alive and s is not earlier]
        place_workers(spec, running)
        decision, other = servers.judge(spec.wanted(), running, spec.options.replace,
                                        spec.options.ignore_memory)
        where = ", ".join(spec.nodes)
        if earlier is not None:
            return Change(
                f"replace {spec.name}, launched by an earlier sparkctl as the cluster's one vLLM "
                f"server (container {earlier.record.container} on "
                f"{', '.join(earlier.record.nodes)}, record {earlier.record.migrated_from}): stop "
                f"it and start it as a named server ({spec.container} on {where}, record "
                f"{servers.record_dir(spec.name)}/server.json)", payload=earlier)
        dead = next((s for s in everything if s.name == spec.name and not s.alive
                     and s.record.config_hash == spec.digest), None)
        if decision == "start" and dead is not None:
            # a rank's container or vllm serve ended: the rest of it (a Ray head whose worker
            # died, a vllm serve left holding the port) goes first, so it starts whole
            why = (f"its container ended on {', '.join(dead.dead_nodes)}" if dead.dead_nodes
                   else "vllm serve or its container ended")
            return Change(f"restart {spec.name}: dead ({why})", payload=dead)
        if decision == "replace" and other is not None:
            return Change(f"stop server {spec.name} (another configuration): --replace",
                          payload=other)
        if decision == "same" and other is not None:
            current = lifecycle.running_of(other)
            if lifecycle.decide(current, spec.digest, False) == "restart":
                return Change(f"restart {spec.name}: {lifecycle.restart_reason(current)}",
                              payload=other)
            return Unchanged(f"{spec.name} already runs on {where} (config {spec.digest})")
        others = [s for s in running if s.name != spec.name]
        return Unchanged(f"{spec.name} fits on {where} ({spec.estimate.total_gb:.1f} GB per node; "
                         f"{len(others)} other server(s) running)")

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        server: Server = change.payload
        servers.stop_server(ctx.transports, ctx.inventory, server)
        if not server.migrated:
            return f"stopped {server.name}"
        # its memory guard watched the old containers from this server's directory and ends
        # with them; its pid file must not make the new server's guard think one already runs
        guard_pid = quote(f"{servers.record_dir(self.spec.name)}/memguard.pid")
        for node in server.nodes:
            if node in ctx.transports:
                ctx.transports[node].run(f"rm -f {guard_pid}", sudo=True, timeout=60,
                                         display="forget the earlier guard's pid file").check()
        return f"stopped the earlier single vLLM server {server.name}"


def check_phase(spec: ServeSpec) -> Phase:
    def facts(inv: Inventory, node: Node) -> dict[str, Any]:
        from orchestrator.engines.vllm.serve import servers_facts

        # probed: a server of this name that was ready and answers no more is restarted
        return servers_facts(inv, node)

    return Phase("server-check", [Placement(spec)], facts)
