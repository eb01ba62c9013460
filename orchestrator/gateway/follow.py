"""The gateway follows the servers: `launch` and `down --server` end here (issue 29), and a
rolling relaunch puts a replica back this way.

The router (the SGLang Model Gateway) changes its workers at runtime through its own API, so
nothing restarts:
- a replica that LEAVES: `down --server` first takes it out of the router (`DELETE
  /workers/ID`: no new request goes to it), waits for its requests in flight through its relay
  (gateway_down.LeaveGateway), then the relay stops; here the config and the record drop it.
- a replica that JOINS (a new name, or a server moved to another node or port): its relay
  starts, the config (0600, on the gateway's node) gets it and the router gets `POST /workers`
  with its key; this waits until the router lists it healthy.
- a relaunch in place (same name, node and port) changes nothing, unless its key changed (a
  rolling key rotation): the router's worker is then replaced with the new key.
Only replicas of the model the gateway fronts join: the router 0.3.2 does not route by model.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from orchestrator.core.step import NodeContext, Outcome, Phase, Step, Unchanged
from orchestrator.gateway import control as gateway
from orchestrator.phases import gateway_spec as gs

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.remote.transport import Transport

JOIN_WAIT = 60
"""Seconds to wait for the router to list a joining replica healthy (its first /health)."""


def _key(r: dict[str, Any] | gs.Replica) -> tuple[str, str, int]:
    if isinstance(r, gs.Replica):
        return (r.node, r.address, r.port)
    return (str(r.get("node")), str(r.get("address")), int(r.get("port") or 0))


def changes(before: list[dict[str, Any]], now: tuple[gs.Replica, ...]) -> tuple[list[str], list[str]]:
    """(joined, left) server names between the record's table and the live servers (pure)."""
    old = {str(r.get("server")): _key(r) for r in before}
    new = {r.server: _key(r) for r in now}
    joined = sorted(name for name, where in new.items() if old.get(name) != where)
    left = sorted(name for name, where in old.items() if new.get(name) != where)
    return joined, left


def follow(transports: dict[str, Transport], inventory: Inventory, note: gateway.Note) -> str:
    """Bring a running gateway's workers to the live servers: "none" (no gateway),
    "unchanged" or "followed" (a replica joined or left, or the router's list was put right)."""
    probes = gateway.probe_all(transports, liveliness=True)
    gw = gateway.find_gateway(probes)
    if gw is None or not gw.state:
        return "none"
    state = gw.state
    found = gs.replicas_from(gateway.live_servers(transports, inventory),
                             lambda n: inventory.mpi_address(inventory.node(n)),
                             gateway.key_reader(transports))
    fronted = {str(r.get("model")) for r in state.get("replicas") or []}
    model = sorted(fronted)[0] if fronted else (found[0].model if found else "")
    now = tuple(r for r in found if r.model == model)
    for other in sorted({r.server for r in found if r.model != model}):
        note(f"gateway: {other} serves another model than {model}: not behind the gateway "
             f"({gs.ROUTER} does not route by model)")
    joined, left = changes(state.get("replicas") or [], now)
    spec = gs.GatewaySpec(gw.node, str(state["host"]), int(state["port"]), now,
                          client=inventory.mpi_address(inventory.node(gw.node)))
    gateway._sync_relays(transports, spec, probes, note)
    head = transports[gw.node]
    salt = gs.new_salt()
    answer = head.run(gs.workers_cmd(), stdin=json.dumps({
        "config": gs.CONFIG_FILE, "workers": [r.worker() for r in now], "wait": JOIN_WAIT,
        "extra": spec.fingerprinted(), "salt": salt, "rounds": gs.FINGERPRINT_ROUNDS}),
        sudo=True, timeout=JOIN_WAIT + 60, display="the router's workers").check()
    result = json.loads(answer.stdout)
    if left:
        note(f"gateway: {', '.join(left)} left the router (DELETE /workers; no restart)")
    if joined:
        note(f"gateway: {', '.join(joined)} joined the router (POST /workers; no restart)")
    gateway.write_record(head, {**spec.record(salt), "key": bool(state.get("key")),
                                "salt": salt, "fingerprint": result["fingerprint"]})
    changed = joined or left or result.get("added") or result.get("removed")
    return "followed" if changed else "unchanged"


RECORD = f"{gs.GATEWAY_RUN}/gateway.json"
"""The gateway's record on the node it runs on: where there is none, no gateway runs."""


class GatewaySeen(Step):
    """Which nodes hold a gateway record, from the facts a launch gathers anyway (one file
    fact per node): with none, the launch ends without probing every node for a gateway."""

    name = "gateway"
    scope = "head"

    def check(self, ctx: NodeContext) -> Outcome:
        nodes = sorted(name for name, facts in ctx.cluster_facts.items()
                       if (record := facts.file(RECORD)) is not None and record.exists)
        ctx.options.gateway_nodes = nodes
        return Unchanged(f"a gateway's record on {', '.join(nodes)}: it follows the servers"
                         if nodes else "no gateway runs: nothing to follow")


def seen_phase() -> Phase:
    """The launch's look for a gateway (its last phase): nothing in a launch writes a gateway
    record (a gateway change takes the cluster lock), so the facts gathered up front serve."""
    def facts(inventory: Inventory, node: Node) -> dict[str, Any]:
        return {"files": {RECORD: False}}

    return Phase("gateway-check", [GatewaySeen()], facts, stale_after=())


def after_change(session: Any, inventory: Inventory, note: gateway.Note,
                 seen: list[str] | None = None) -> None:
    """For launch and `down --server` (lock held): follow, and say what changed. A gateway
    that cannot follow does not fail the launch or down that already succeeded. SEEN: the
    nodes whose gateway record the run's facts showed (GatewaySeen; [] skips the probes)."""
    from orchestrator.errors import SparkctlError

    if seen == []:
        return  # no gateway record on any node: no gateway to follow
    try:
        outcome = follow(session.transports, inventory, note)
    except (SparkctlError, ValueError, KeyError, OSError) as exc:  # an odd answer from a node
        note(f"gateway: could not follow the change ({exc}); `sparkctl gateway up` again")
        return
    if outcome == "followed":
        note("gateway: routing table updated (no restart); `sparkctl gateway status` shows it")
