"""The gateway's probe of one node and the doors of its relays: take a replica out of the
gateway and drain it, put it back. A leaf (the gateway spec only), so `down --server`
(phases/gateway_down.py) drains a replica without importing the gateway's server discovery.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.phases import gateway_spec as gs

if TYPE_CHECKING:
    from orchestrator.remote.transport import Transport

Note = Callable[[str], None]


@dataclass
class Probe:
    node: str
    state: dict[str, Any] | None
    relays: dict[str, dict[str, Any]]
    port_free: bool | None
    live: bool
    address_missing: bool = False
    workers: dict[str, dict[str, Any]] | None = None
    """On the gateway's node: the router's own worker list by URL ({"healthy", "load"})."""


def probe(transport: Transport, host: str | None = None, port: int | None = None,
          liveliness: bool = False) -> Probe:
    result = transport.run(gs.probe_cmd(host, port, liveliness), sudo=True, timeout=60,
                           display="gateway probe")
    try:
        data = json.loads(result.stdout) if result.ok else {}
    except ValueError:
        data = {}
    return Probe(transport.node, data.get("state"), data.get("relays") or {},
                 data.get("port_free"), bool(data.get("live")), bool(data.get("address_missing")),
                 data.get("workers"))


def set_in_rotation(transport: Transport, server: str, inside: bool) -> None:
    transport.run(gs.relay_signal_cmd(server, "USR2" if inside else "USR1"), sudo=True,
                  timeout=30, display=f"{'back into' if inside else 'out of'} the gateway: "
                  f"{server}").check()


def router_request(transports: dict[str, Transport], request: dict[str, Any]
                   ) -> dict[str, Any] | None:
    """Run gateway_workers.py with REQUEST on the node whose router runs (None: no gateway)."""
    for node in sorted(transports):
        found = probe(transports[node])
        if found.state:
            answer = transports[node].run(
                gs.workers_cmd(), stdin=json.dumps({"config": gs.CONFIG_FILE, **request}),
                sudo=True, timeout=60 + float(request.get("wait") or 0),
                display="the router's workers").check()
            return dict(json.loads(answer.stdout))
    return None


def worker_url(transports: dict[str, Transport], server: str) -> str | None:
    """SERVER's worker URL in the router, from the gateway's record (None: not behind it)."""
    for node in sorted(transports):
        state = probe(transports[node]).state
        if state:
            return next((f"http://{r['address']}:{r['port']}" for r in state.get("replicas") or []
                         if r.get("server") == server), None)
    return None


def leave_router(transports: dict[str, Transport], server: str) -> bool:
    """Take SERVER out of the router through its own API (`DELETE /workers/ID`): no new
    request goes to it; its requests in flight carry on. False when it is not behind it."""
    url = worker_url(transports, server)
    if url is None:
        return False
    router_request(transports, {"workers": None, "remove": [url], "wait": 10})
    return True


def drain(transport: Transport, server: str, timeout: float, note: Note,
          transports: dict[str, Transport] | None = None) -> bool:
    """Take SERVER out of the router (TRANSPORTS: every node's, to find it) and close its
    relay's door, then wait until none of its requests is in flight."""
    if transports:
        leave_router(transports, server)
    set_in_rotation(transport, server, False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        relay = probe(transport).relays.get(server) or {}
        if not relay.get("alive"):
            return True
        if not relay.get("accepting") and not relay.get("busy"):
            return True
        time.sleep(0.3)
    note(f"rolling: {server}: requests still in flight after {timeout:.0f} s; relaunching "
         "anyway (the gateway retries what fails on another replica)")
    return False
