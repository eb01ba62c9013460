"""The gateway's operations over the nodes: up (idempotent), status, down, and taking one
replica out and back in (a rolling relaunch). The plan-free imperative form, as `chat` and
`tunnel` are: every change is a few commands on a few nodes, judged first from one probe per
node so bad input (a port taken) is refused before anything changes.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from orchestrator.commands import install_file_cmd, join, quote
from orchestrator.errors import InputError, SparkctlError
from orchestrator.phases import gateway_spec as gs
from orchestrator.phases.gateway_relays import (
    Note,
    Probe,
    drain,
    leave_router,
    probe,
    router_request,
    set_in_rotation,
)
from orchestrator.remote.gathered import NodeFacts

__all__ = ["Note", "Probe", "drain", "leave_router", "probe", "router_request",
           "set_in_rotation"]  # where rolling and status look

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory
    from orchestrator.records import Server
    from orchestrator.remote.transport import Transport

LIVE_TIMEOUT = 60.0
"""Seconds for the router to answer /health and list its workers after it starts (under a
second on an idle machine)."""


def probe_all(transports: dict[str, Transport], liveliness: bool = True) -> dict[str, Probe]:
    from orchestrator.remote.cluster import parallel

    outcomes = parallel(lambda n: probe(transports[n], liveliness=liveliness), sorted(transports))
    return {n: o.get() for n, o in outcomes.items() if o.ok}


def find_gateway(probes: dict[str, Probe]) -> Probe | None:
    return next((p for p in probes.values() if p.state), None)


def live_servers(transports: dict[str, Transport], inventory: Inventory) -> list[Server]:
    from orchestrator.engines import servers

    return servers.gather(transports, inventory, probe=True)


def key_reader(transports: dict[str, Transport]) -> Any:
    """key_of(server) for replicas_from: a server's API key from its node's file, over SSH."""
    from orchestrator.engines.apikey import read_node_key

    def key_of(server: Server) -> Any:
        if server.node not in transports:
            raise SparkctlError(f"cannot reach {server.node} to read the API key of {server.name}")
        return read_node_key(transports[server.node], server.record)

    return key_of


def desired(inventory: Inventory, node: str, host: str, port: int, key: Any,
            found: list[Server], key_of: Any = None) -> gs.GatewaySpec:
    def address_of(name: str) -> str:
        return inventory.mpi_address(inventory.node(name))

    replicas = gs.replicas_from(found, address_of, key_of)
    if not replicas:
        raise SparkctlError("no model server runs on its node's loopback: start one with "
                            "`sparkctl launch RECIPE` (several of one recipe with --nodes/--name "
                            "are replicas; --host beyond loopback serves without the gateway), "
                            "then `sparkctl gateway up`")
    models = sorted({r.model for r in replicas})
    if len(models) > 1:
        raise InputError(f"the live servers serve {len(models)} models ({', '.join(models)}): "
                         f"the gateway ({gs.ROUTER}) routes a request to any of its replicas "
                         "whatever model it names, so it fronts the replicas of one model; stop "
                         "the others (`sparkctl down --server NAME`) or reach them directly "
                         "(`sparkctl tunnel --server NAME`); its multi-model mode cannot start offline "
                         "(docs/gateway.md)")
    return gs.GatewaySpec(node, host, port, replicas, key, client=address_of(node))


def up(transports: dict[str, Transport], inventory: Inventory, spec: gs.GatewaySpec,
       note: Note) -> str:
    """Make the gateway be `spec`: "unchanged", "relays" (relays or router workers put back),
    "started" or "restarted"."""
    if spec.node not in transports:
        raise SparkctlError(f"cannot reach {spec.node}, where the gateway runs")
    probes = probe_all(transports, liveliness=True)
    here = probe(transports[spec.node], spec.host, spec.port, liveliness=True)
    other = next((p for p in probes.values() if p.state and p.node != spec.node), None)
    if other is not None:
        raise InputError(f"a gateway already runs on {other.node}: `sparkctl gateway down` first")
    ours = here.state or {}
    if here.address_missing:
        raise InputError(f"--host {spec.host}: {spec.node} has no such address (use 127.0.0.1, "
                         f"0.0.0.0 or one of {spec.node}'s own addresses; `ip -4 addr` there "
                         "lists them)")
    # our own gateway holds its port: a new --host on that port replaces it (not "taken")
    own_port = bool(ours) and ours.get("port") == spec.port
    if not here.port_free and not own_port:
        raise InputError(f"port {spec.port} on {spec.node} ({spec.host}) is taken by another "
                         "program: choose another with --port")
    same = gs.matches(ours, spec)
    registered = set(here.workers or {})
    if same and here.live and all(_door_open(probes, r, spec.client) and r.url in registered
                                  for r in spec.replicas):
        return "unchanged"
    _sync_relays(transports, spec, probes, note)
    head = transports[spec.node]
    if same and here.live:
        back = router_request(transports, {"workers": None, "wait": 30}) or {}
        for url in back.get("added") or []:
            note(f"gateway: {url} was missing from the router: added back")
        return "relays"
    installed = head.run(gs.install_cmd(), sudo=True, timeout=600,
                         display=f"{gs.ROUTER} on {spec.node}")
    if not installed.ok:
        raise SparkctlError(f"{spec.node}: could not put {gs.ROUTER} in place: "
                            f"{installed.stderr.strip()[-800:]}")
    if "installed" in installed.stdout:
        note(f"gateway: {gs.ROUTER} unpacked on {spec.node} in {gs.ROUTER_TREE} (sha256 checked)")
    head.run(install_file_cmd(gs.CONFIG_FILE, 0o600), stdin=spec.config_text(), sudo=True,
             timeout=60, display=f"write {gs.CONFIG_FILE} (0600; holds the keys)").check()
    head.run(f"chmod 700 {quote(gs.GATEWAY_CONFIG_DIR)}", sudo=True, timeout=30).check()
    head.run(gs.stop_router_cmd() + "; " + gs.remove_legacy_cmd(), sudo=True, timeout=120,
             display="stop the router (and an older sparkctl's LiteLLM container)").check()
    note(f"gateway: starting {gs.ROUTER} on {spec.node} {spec.host}:{spec.port}")
    try:
        head.run(gs.start_cmd(), sudo=True, timeout=60, display="start the router").check()
        _wait_live(head, spec)
    except BaseException:
        # no gateway runs now: its config (the keys) and record go too, so nothing is left
        # that `gateway down` would have to find
        head.run(gs.stop_router_cmd() + "; " + join(
            ["rm", "-rf", "--", gs.GATEWAY_CONFIG_DIR, f"{gs.GATEWAY_RUN}/gateway.json"]),
            sudo=True, timeout=120)
        raise
    write_record(head, spec.record())
    return "restarted" if ours else "started"


def write_record(head: Transport, record: dict[str, Any]) -> None:
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    head.run(install_file_cmd(f"{gs.GATEWAY_RUN}/gateway.json", gs.RECORD_MODE), stdin=text,
             sudo=True, timeout=60, display="write gateway.json (0600)").check()


def _door_open(probes: dict[str, Probe], replica: gs.Replica, client: str) -> bool:
    """The replica's relay runs, lets the gateway's node in and has its door open (a door left
    closed, e.g. by an interrupted rolling relaunch, is not "unchanged")."""
    relay = (probes[replica.node].relays.get(replica.server) or {}) if replica.node in probes else {}
    return bool(relay.get("alive") and relay.get("accepting") and relay.get("allow") == [client])


def _sync_relays(transports: dict[str, Transport], spec: gs.GatewaySpec,
                 probes: dict[str, Probe], note: Note) -> None:
    """Every replica's relay running, letting in the gateway's node, with its door open; the
    relays of servers no longer behind the gateway stopped."""
    wanted = {r.server for r in spec.replicas}
    for node, p in probes.items():
        for server in sorted(set(p.relays) - wanted):
            transports[node].run(gs.relay_signal_cmd(server, "TERM"), sudo=True, timeout=30)
    for r in spec.replicas:
        if r.node not in transports:
            raise SparkctlError(f"cannot reach {r.node}, where replica {r.server} runs")
        relay = (probes[r.node].relays.get(r.server) or {}) if r.node in probes else {}
        if relay.get("alive") and relay.get("allow") != [spec.client]:
            # started for another gateway node (or before relays checked their peer)
            transports[r.node].run(gs.relay_signal_cmd(r.server, "TERM"), sudo=True, timeout=30)
        elif relay.get("alive") and not relay.get("accepting"):
            note(f"gateway: {r.server} on {r.node} was out of the rotation (its door closed, "
                 "e.g. by an interrupted rolling relaunch): back in")
            set_in_rotation(transports[r.node], r.server, True)
        out = transports[r.node].run(gs.relay_start_cmd(r, spec.client), sudo=True, timeout=30,
                                     display=f"relay for {r.server} on {r.node}").check()
        if "started" in out.stdout:
            note(f"gateway: {r.server} on {r.node} reachable at {r.address}:{r.port} (relay, "
                 f"from {spec.client} only)")
    keep_at_boot(transports, sorted({spec.node} | {r.node for r in spec.replicas}), note)


def keep_at_boot(transports: dict[str, Transport], nodes: list[str], note: Note) -> None:
    """The gateway's boot unit on NODES: a reboot of one of them brings its relays (and the
    router, on the gateway's node) back, as `launch --persist` brings servers back."""
    command, request = gs.boot_install_cmd()
    for node in nodes:
        out = transports[node].run(command, stdin=request, sudo=True, timeout=60,
                                   display=f"{gs.BOOT_UNIT} on {node}").check()
        if "installed" in out.stdout:
            note(f"gateway: {gs.BOOT_UNIT} enabled on {node} (back after a reboot)")


def _wait_live(head: Transport, spec: gs.GatewaySpec) -> None:
    """Until the router answers /health and lists every replica as a worker."""
    started = time.monotonic()
    deadline = started + LIVE_TIMEOUT
    urls = {r.url for r in spec.replicas}
    while time.monotonic() < deadline:
        p = probe(head, spec.host, spec.port, liveliness=True)
        if p.live and urls <= set(p.workers or {}):
            return
        pid = quote(gs.ROUTER_PID)
        running = head.run(f"[ -f {pid} ] && grep -qsa -- {quote(gs.ROUTER_PATTERN)} "
                           f"/proc/$(cat {pid})/cmdline", sudo=True, timeout=60)
        if not running.ok and time.monotonic() > started + 5:  # its pid file is written at once
            break
        time.sleep(0.5)
    logs = head.run(f"tail -n 30 {quote(gs.ROUTER_LOG)} 2>&1", sudo=True, timeout=60).stdout
    raise SparkctlError(f"the gateway on {spec.node} did not answer on {spec.host}:{spec.port} "
                        f"with its {len(urls)} worker(s) within {LIVE_TIMEOUT:.0f} s; its log "
                        f"ends:\n{logs.strip()[-2000:]}")


def _probe_with_gateway(transports: dict[str, Transport]) -> tuple[dict[str, Probe], Probe | None]:
    probes = probe_all(transports, liveliness=True)
    return probes, find_gateway(probes)


def status(transports: dict[str, Transport], inventory: Inventory) -> dict[str, Any]:
    """The gateway's record, whether it answers, and each replica's health and rotation."""
    probes, gw = _probe_with_gateway(transports)
    if gw is None:
        return {"running": False, "relays": {n: p.relays for n, p in probes.items() if p.relays}}
    state = dict(gw.state or {})
    health = {(s.name, s.node): s.health for s in live_servers(transports, inventory)}
    replicas = []
    for r in state.get("replicas") or []:
        on_node = probes.get(r["node"])
        relay = (on_node.relays if on_node else {}).get(r["server"]) or {}
        code = health.get((r["server"], r["node"]))
        worker = (gw.workers or {}).get(f"http://{r['address']}:{r['port']}")
        replicas.append({**r, "health": "healthy" if code == 200 else (
            "down" if not code else f"HTTP {code}"),
            "in_gateway": bool(relay.get("alive") and relay.get("accepting") and worker),
            "router_healthy": bool(worker and worker.get("healthy")),
            "in_flight": relay.get("busy", 0)})
    host = state.get("host")
    shown = inventory.node(gw.node).host if host == "0.0.0.0" else host
    return {"running": True, "live": gw.live, "node": gw.node,
            "address": f"http://{shown}:{state.get('port')}/v1", "key": bool(state.get("key")),
            "router": state.get("router"), "replicas": replicas}


def down(transports: dict[str, Transport]) -> list[str]:
    """Stop the router, remove its config (the keys) and record, and every relay."""
    probes = probe_all(transports, liveliness=False)
    done = []
    for node, p in sorted(probes.items()):
        # the boot unit first: a reboot during the rest must not bring anything back
        commands = [gs.boot_remove_cmd()]
        commands += [gs.relay_signal_cmd(server, "TERM") for server in sorted(p.relays)]
        if p.state:
            commands += [gs.stop_router_cmd(), gs.remove_legacy_cmd(),
                         join(["rm", "-rf", "--", gs.GATEWAY_CONFIG_DIR,
                               f"{gs.GATEWAY_RUN}/gateway.json", gs.ROUTER_LOG])]
            done.append(f"gateway on {node} removed")
        if p.relays:
            done.append(f"{len(p.relays)} relay(s) on {node} stopped")
        for command in commands:
            transports[node].run(command, sudo=True, timeout=120).check()
    return done


def summary(cluster_facts: dict[str, NodeFacts]) -> dict[str, Any]:
    """For `sparkctl status` (pure): the gateway from every node's probe fact ("gateway"), with
    each model's replicas and how many are in the rotation (their relay's door open)."""
    probes: dict[str, dict[str, Any]] = {}
    for node, facts in cluster_facts.items():
        answer = facts.output("gateway")
        try:
            probes[node] = json.loads(answer)
        except ValueError:
            continue
    found = next(((n, p) for n, p in sorted(probes.items()) if p.get("state")), None)
    if found is None:
        return {"running": False}
    node, probe_doc = found
    state = probe_doc["state"]
    models: dict[str, dict[str, int]] = {}
    out: list[str] = []
    counted: dict[str, dict[str, Any]] = {}  # per replica: its relay's counters (dashboard rates)
    for r in state.get("replicas") or []:
        relay = (probes.get(r["node"], {}).get("relays") or {}).get(r["server"]) or {}
        entry = models.setdefault(r["model"], {"replicas": 0, "in_rotation": 0,
                                               "requests": 0, "errors": 0})
        entry["replicas"] += 1
        inside = bool(relay.get("alive") and relay.get("accepting"))
        entry["in_rotation"] += int(inside)
        if not inside:
            out.append(str(r["server"]))
        if relay.get("alive") and isinstance(relay.get("requests"), int):
            counters = {"requests": relay["requests"], "errors": int(relay.get("errors") or 0)}
            counted[f"{r['node']}/{r['server']}"] = {"model": str(r["model"]), **counters}
            entry["requests"] += counters["requests"]
            entry["errors"] += counters["errors"]
    return {"running": True, "node": node, "host": state.get("host"), "port": state.get("port"),
            "key": bool(state.get("key")), "live": bool(probe_doc.get("live")), "models": models,
            "out_of_rotation": out, "relays": counted}


def attach_to_status(result: dict[str, Any], facts: dict[str, NodeFacts]) -> None:
    """`sparkctl status`: the gateway's summary, and a closed door as a problem (exit 1)."""
    doc = result["gateway"] = summary(facts)
    closed = problem(doc)
    if closed and doc["node"] in result["nodes"]:
        result["nodes"][doc["node"]]["problems"].append(closed)
        result["ok"] = False


def problem(doc: dict[str, Any]) -> str | None:
    """What `status` says (and exits 1 for) when a replica behind the gateway takes no
    requests: its door closed (a rolling relaunch under way or interrupted) or its relay gone."""
    out = doc.get("out_of_rotation") or []
    if not doc.get("running") or not out:
        return None
    return (f"gateway: {', '.join(out)} out of the rotation (door closed or relay gone): "
            "`sparkctl gateway up` puts it back")
