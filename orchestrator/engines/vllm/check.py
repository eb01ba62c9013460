"""A vLLM launch's first phase: this server judged against every node's servers (from facts,
no remote call while planning), and the migration from the single-server layout.

The shared judgement (engines/servers.py, engines/lifecycle.py): a server of another name on a
shared node must leave this one's ports and memory free; one of this name runs the same
configuration (no-op, or restart when stalled or dead), another configuration (refused, or
replaced with --replace).

Migration: sparkctl before named vLLM servers ran one per cluster, recorded in RUN_DIR/server.json
on the head, in containers named `sparkctl-vllm` (pid file vllm.pid). Such a server is still
listed (node/servers.py's "legacy" record), so status sees it, `down` and `down --server NAME`
stop it. Relaunching its recipe under its name replaces it: its containers and record go, the
named server starts in their place, and the plan says so. A legacy server of another recipe is
any other server (its port and memory are judged; --replace does not reach it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.commands import quote
from orchestrator.core.step import Change, NodeContext, Outcome, Phase, Step, Unchanged
from orchestrator.engines import lifecycle, servers
from orchestrator.engines.lifecycle import Running, ServerRecord
from orchestrator.paths import SERVER_JSON

if TYPE_CHECKING:
    from orchestrator.engines.vllm.serve import ServeSpec
    from orchestrator.inventory import Inventory, Node


def legacy_of(spec: ServeSpec, found: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The previous version's single vLLM server this launch takes over: same name and recipe."""
    return next((s for s in found if s.get("legacy") and s.get("engine") == "vllm"
                 and s.get("name") == spec.name and s.get("recipe") == spec.recipe.name), None)


class Placement(Step):
    """Every node's servers against this one: its name, ports and memory (from facts)."""

    name = "placement"
    scope = "head"

    def __init__(self, spec: ServeSpec) -> None:
        self.spec = spec

    def check(self, ctx: NodeContext) -> Outcome:
        spec = self.spec
        everything = servers.from_facts(ctx.cluster_facts, ctx.inventory, alive_only=False)
        legacy = legacy_of(spec, everything)
        running = [s for s in everything if s.get("alive") and s is not legacy]
        decision, other = servers.judge(spec.wanted(), running, spec.options.replace,
                                        spec.options.ignore_memory)
        where = ", ".join(spec.nodes)
        if legacy is not None:
            return Change(
                f"replace {spec.name}, launched by an earlier sparkctl as the cluster's one vLLM "
                f"server (container {legacy.get('container')} on "
                f"{', '.join(legacy.get('nodes') or [])}, record {SERVER_JSON}): stop it and start "
                f"it as a named server ({spec.container} on {where}, record "
                f"{servers.record_dir(spec.name)}/server.json)", payload=legacy)
        dead = next((s for s in everything if s.get("name") == spec.name and not s.get("alive")
                     and not s.get("legacy") and s.get("config_hash") == spec.digest), None)
        if decision == "start" and dead is not None:
            # a rank's container or vllm serve ended: the rest of it (a Ray head whose worker
            # died, a vllm serve left holding the port) goes first, so it starts whole
            why = (f"its container ended on {', '.join(dead['dead_nodes'])}" if dead.get("dead_nodes")
                   else "vllm serve or its container ended")
            return Change(f"restart {spec.name}: dead ({why})", payload=dead)
        if decision == "replace" and other is not None:
            return Change(f"stop server {spec.name} (another configuration): --replace",
                          payload=other)
        if decision == "same" and other is not None:
            current = Running(ServerRecord.from_dict(other), bool(other.get("alive")),
                              other.get("health"), bool(other.get("ready_log")))
            if lifecycle.decide(current, spec.digest, False) == "restart":
                return Change(f"restart {spec.name}: {lifecycle.restart_reason(current)}",
                              payload=other)
            return Unchanged(f"{spec.name} already runs on {where} (config {spec.digest})")
        others = [s for s in running if s.get("name") != spec.name]
        return Unchanged(f"{spec.name} fits on {where} ({spec.estimate.total_gb:.1f} GB per node; "
                         f"{len(others)} other server(s) running)")

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        servers.stop_server(ctx.transports, ctx.inventory, change.payload)
        if not change.payload.get("legacy"):
            return f"stopped {change.payload.get('name')}"
        # its memory guard watched the old containers from this server's directory and ends
        # with them; its pid file must not make the new server's guard think one already runs
        guard_pid = quote(f"{servers.record_dir(self.spec.name)}/memguard.pid")
        for node in change.payload.get("nodes") or [ctx.inventory.head_name]:
            if node in ctx.transports:
                ctx.transports[node].run(f"rm -f {guard_pid}", sudo=True, timeout=60,
                                         display="forget the earlier guard's pid file").check()
        return f"stopped the earlier single vLLM server {change.payload.get('name')}"


def check_phase(spec: ServeSpec) -> Phase:
    def facts(inv: Inventory, node: Node) -> dict[str, Any]:
        from orchestrator.engines.vllm.serve import servers_facts

        # probed: a server of this name that was ready and answers no more is restarted
        return servers_facts(inv, node)

    return Phase("server-check", [Placement(spec)], facts)
