"""The gateway follows the servers: `launch` and `down --server` end here (issue 29).

LiteLLM 1.80.11 changes its routing table at runtime only through its management API
(`/model/new`, `/model/delete`), and both answer "No DB Connected" without a database; the
gateway runs without one (nothing to keep, no outbound calls). So:

- a replica that LEAVES needs no restart: `down --server` first closes its relay's door and
  waits for its requests in flight (gateway_down.LeaveGateway), then its relay stops; LiteLLM
  keeps the deployment but every connection to it is refused, so each request is retried on
  another replica (num_retries) and the address cools down. The record (what `gateway status`
  shows) drops it at once; LiteLLM's own list drops it at its next restart.
- a replica that JOINS (a new name, or a server moved to another node or port) needs LiteLLM
  restarted with the new table: the config's model list is swapped on the node (the key never
  leaves it), the container is stopped gracefully (uvicorn finishes the requests in flight,
  up to DRAIN_SECONDS) and started again; while it starts (seconds on a Spark, about a minute
  in the lab) the gateway's port refuses connections. That is said before it happens.
- a relaunch in place (same name, node and port) changes nothing: its relay carries on.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from orchestrator.commands import quote
from orchestrator.gateway import control as gateway
from orchestrator.phases import gateway_spec as gs
from orchestrator.remote.container import ContainerCommands

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory
    from orchestrator.remote.transport import Transport

DRAIN_SECONDS = 60
"""`docker stop -t`: how long LiteLLM may finish the requests in flight before it restarts."""


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
    """Bring a running gateway's table to the live servers: "none" (no gateway), "unchanged",
    "followed" (a replica left: no restart) or "restarted" (a replica joined)."""
    probes = gateway.probe_all(transports, liveliness=True)
    gw = gateway.find_gateway(probes)
    if gw is None or not gw.state:
        return "none"
    state = gw.state
    now = gs.replicas_from(gateway.live_servers(transports, inventory),
                           lambda n: inventory.mpi_address(inventory.node(n)),
                           gateway.key_reader(transports))
    joined, left = changes(state.get("replicas") or [], now)
    if not joined and not left:
        return "unchanged"
    spec = gs.GatewaySpec(gw.node, str(state["host"]), int(state["port"]), now,
                          image=str(state.get("image") or gs.IMAGE),
                          client=inventory.mpi_address(inventory.node(gw.node)))
    gateway._sync_relays(transports, spec, probes, note)
    head = transports[gw.node]
    fingerprint, salt = state.get("fingerprint"), str(state.get("salt") or "")
    if left:
        note(f"gateway: {', '.join(left)} left the routing table (no restart: LiteLLM retries "
             "its address's refused connections on the other replicas)")
    if joined:
        note(f"gateway: restarting LiteLLM on {gw.node} so {', '.join(joined)} joins: it "
             f"finishes its requests in flight (up to {DRAIN_SECONDS} s), then its port "
             "refuses connections until it answers again (LiteLLM changes its table at runtime "
             "only with a database)")
        salt = gs.new_salt()
        fingerprint = _swap_config(head, spec, salt)
        litellm = ContainerCommands(gs.CONTAINER)
        head.run(litellm.stop_cmd(DRAIN_SECONDS) + " >/dev/null 2>&1; true",
                 sudo=True, timeout=DRAIN_SECONDS + 60, display="stop the gateway (graceful)")
        head.run(litellm.start_cmd(), sudo=True, timeout=120,
                 display=f"start {gs.CONTAINER}").check()
        gateway._wait_live(head, spec, note)
    gateway.write_record(head, {**spec.record(salt or None), "key": bool(state.get("key")),
                                "salt": salt, "fingerprint": fingerprint})
    return "restarted" if joined else "followed"


def _swap_config(head: Transport, spec: gs.GatewaySpec, salt: str) -> str:
    from orchestrator.node import script

    request = {"path": gs.CONFIG_FILE, "model_list": spec.config()["model_list"],
               "extra": spec.fingerprinted(), "salt": salt, "rounds": gs.FINGERPRINT_ROUNDS}
    result = head.run("python3 -c " + quote(script("gateway_config.py")), stdin=json.dumps(request),
                      sudo=True, timeout=60, display=f"new model list in {gs.CONFIG_FILE}").check()
    return str(json.loads(result.stdout)["fingerprint"])


def after_change(session: Any, inventory: Inventory, note: gateway.Note) -> None:
    """For launch and `down --server` (lock held): follow, and say what changed. A gateway
    that cannot follow does not fail the launch or down that already succeeded."""
    from orchestrator.errors import SparkctlError

    try:
        outcome = follow(session.transports, inventory, note)
    except (SparkctlError, ValueError, KeyError, OSError) as exc:  # an odd answer from a node
        note(f"gateway: could not follow the change ({exc}); `sparkctl gateway up` again")
        return
    if outcome in ("followed", "restarted"):
        note(f"gateway: routing table updated ({outcome}); `sparkctl gateway status` shows it")
