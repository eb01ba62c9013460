"""`sparkctl gateway up|status|down`: one OpenAI-compatible address for every server (the SGLang
Model Gateway)."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from orchestrator.cli import CONTEXT, inventory_option, json_option, run_command

MAX_KEY_BYTES = 4096


def _note(line: str) -> None:
    click.echo(line, err=True)


@contextlib.contextmanager
def _locked(session: Any, inventory: Any, command: str, break_lock: bool) -> Iterator[None]:
    """The cluster lock, as up/launch/down take it: a gateway change must not interleave with
    a launch or down that changes the servers its routing table comes from."""
    from orchestrator.core.lock import ClusterLock
    from orchestrator.errors import SparkctlError

    head = inventory.head_name
    if head not in session.transports:
        raise SparkctlError(f"cannot reach the head {head} (it holds the cluster lock)")
    lock = ClusterLock(head, session.transports[head], command, break_lock)
    lock.ensure()
    try:
        yield
    finally:
        lock.release()


def read_key_file(path: str) -> Any:
    """The master key from FILE: a regular file only its owner can read, one line of printable
    ASCII starting with sk- (sparkctl's rule for the gateway's key). Never echoed; registered
    for redaction."""
    from orchestrator.commands import Secret
    from orchestrator.errors import InputError
    from orchestrator.state import register_secret
    from orchestrator.yamlio import read_user_file

    file = Path(path).expanduser()
    raw = read_user_file(file, "API key", limit=MAX_KEY_BYTES)
    mode = os.stat(file).st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InputError(f"API key file {file} is readable or writable by others (mode "
                         f"{stat.S_IMODE(mode):04o}): `chmod 600 {file}`")
    try:
        value = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise InputError(f"API key file {file} is not UTF-8 text") from None
    from orchestrator.engines.apikey import key_problem

    problem = key_problem(value)  # the rule every key sparkctl reads obeys
    if problem:
        raise InputError(f"API key file {file}: {problem} (its content is not shown)")
    if not value.startswith("sk-") or len(value) < 12:
        raise InputError(f"API key file {file}: the gateway's master key starts with sk- and has "
                         "at least 12 characters (its content is not shown)")
    secret = Secret(value)
    register_secret(secret)
    return secret


def _check_host(host: str, key: Any) -> None:
    import ipaddress

    from orchestrator.errors import InputError
    from orchestrator.phases.gateway_spec import is_loopback

    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise InputError(f"--host {host!r} is not an IP address (127.0.0.1, 0.0.0.0, or "
                             "one of the node's addresses)") from None
    if not is_loopback(host) and key is None:
        raise InputError(f"--host {host} makes the gateway reachable from other machines: "
                         "protect it with --api-key-file FILE (a key only you can read)")


def _up(inventory_path: str | None, host: str, port: int, key_file: str | None,
        node: str | None, as_json: bool, break_lock: bool = False) -> int:
    from orchestrator.cli.launch import _server_on_head
    from orchestrator.core.report import print_json
    from orchestrator.errors import InputError
    from orchestrator.gateway import control as gateway

    key = read_key_file(key_file) if key_file else None
    _check_host(host, key)
    manager, inventory = _server_on_head(inventory_path, "gateway up")
    where = node or inventory.head_name
    if where not in {n.name for n in inventory.nodes}:
        raise InputError(f"--nodes {where}: not an inventory node "
                         f"({', '.join(n.name for n in inventory.nodes)})")
    with manager as session, _locked(session, inventory, "gateway up", break_lock):
        found = gateway.live_servers(session.transports, inventory)
        spec = gateway.desired(inventory, where, host, port, key, found,
                               gateway.key_reader(session.transports))
        outcome = gateway.up(session.transports, inventory, spec, _note)
        shown = status_doc(session, inventory)
    if as_json:
        print_json({"command": "gateway up", "ok": True, "outcome": outcome, **shown})
    else:
        _note(f"gateway: {outcome}")
        _render(shown)
    return 0


def status_doc(session: Any, inventory: Any) -> dict[str, Any]:
    from orchestrator.gateway import control as gateway

    return gateway.status(session.transports, inventory)


def _render(doc: dict[str, Any]) -> None:
    if not doc.get("running"):
        click.echo("gateway: not running (`sparkctl gateway up`)")
        return
    click.echo(f"gateway  {doc['address']} on {doc['node']}  key {'on' if doc['key'] else 'off'}  "
               f"{doc.get('router')}  {'live' if doc.get('live') else 'NOT ANSWERING'}")
    models: dict[str, list[dict[str, Any]]] = {}
    for r in doc.get("replicas") or []:
        models.setdefault(r["model"], []).append(r)
    for model, replicas in sorted(models.items()):
        healthy = sum(1 for r in replicas if r["health"] == "healthy" and r["in_gateway"])
        click.echo(f"model    {model}: {len(replicas)} replica(s), {healthy} serving")
        for r in replicas:
            rotation = "in rotation" if r["in_gateway"] else "OUT of rotation"
            click.echo(f"  {r['server']:<16} {r['node']:<10} {r['address']}:{r['port']:<6} "
                       f"{r['health']:<8} {rotation}  in flight {r['in_flight']}")


def _status(inventory_path: str | None, as_json: bool) -> int:
    from orchestrator.cli.launch import _server_on_head
    from orchestrator.core.report import print_json

    manager, inventory = _server_on_head(inventory_path, "gateway status")
    with manager as session:
        doc = status_doc(session, inventory)
    closed = [r["server"] for r in doc.get("replicas") or [] if not r["in_gateway"]]
    if as_json:
        print_json({"command": "gateway status", "ok": not closed, **doc})
    else:
        _render(doc)
        if closed:
            click.echo(f"{', '.join(closed)} out of the rotation: `sparkctl gateway up` puts "
                       "it back", err=True)
    return 1 if closed else 0


def _down(inventory_path: str | None, as_json: bool, break_lock: bool = False) -> int:
    from orchestrator.cli.launch import _server_on_head
    from orchestrator.core.report import print_json
    from orchestrator.gateway import control as gateway

    manager, inventory = _server_on_head(inventory_path, "gateway down")
    with manager as session, _locked(session, inventory, "gateway down", break_lock):
        done = gateway.down(session.transports)
    if as_json:
        print_json({"command": "gateway down", "ok": True, "removed": done})
    else:
        for line in done or ["no gateway was running"]:
            click.echo(line)
    return 0


BREAK_LOCK = click.option("--break-lock", is_flag=True,
                          help="Take the cluster lock from a run that is gone.")


@click.group(context_settings=CONTEXT)
def gateway() -> None:
    """One OpenAI-compatible address for every server: the SGLang Model Gateway
    (sglang-router 0.3.2, pinned wheel) on the head.

    \b
    up      route requests to every live replica of the served model: least busy,
            retried on another replica, a replica failing /health out until it answers;
            back after a reboot (sparkctl-gateway.service on its nodes)
    status  address, key on/off, the replicas, their health and rotation
    down    stop the router, remove its config (the keys), its relays and boot unit
    `launch` and `down --server` change a running router's workers through its own
    API (POST /workers, DELETE /workers/ID): no restart; one leaving is drained
    first. No key on any command line. up/down take the cluster lock.
    See docs/gateway.md.
    """


@gateway.command("up", context_settings=CONTEXT)
@inventory_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address the gateway binds on its node; any but loopback needs --api-key-file.")
@click.option("--port", type=click.IntRange(1024, 65535), default=4000, show_default=True)
@click.option("--api-key-file", metavar="FILE",
              help="The master key (sk-..., one line; the file mode 0600). Clients send it as "
                   "`Authorization: Bearer KEY`. Never on argv, in logs or in docker inspect.")
@click.option("--nodes", "node", metavar="NODE", help="The node the gateway runs on (default: the head).")
@BREAK_LOCK
@json_option
def up(inventory_path: str | None, host: str, port: int, api_key_file: str | None,
       node: str | None, break_lock: bool, as_json: bool) -> None:
    """Start (or update) the gateway; a second run with nothing changed does nothing. It
    comes back after a reboot of its nodes (boot unit sparkctl-gateway.service)."""
    run_command(lambda: _up(inventory_path, host, port, api_key_file, node, as_json, break_lock))


@gateway.command("status", context_settings=CONTEXT)
@inventory_option
@json_option
def status(inventory_path: str | None, as_json: bool) -> None:
    """The gateway's address, key, models, replicas and their health (exit 1 when a replica
    is out of the rotation)."""
    run_command(lambda: _status(inventory_path, as_json))


@gateway.command("down", context_settings=CONTEXT)
@inventory_option
@BREAK_LOCK
@json_option
def down(inventory_path: str | None, break_lock: bool, as_json: bool) -> None:
    """Remove the gateway, its relays and its boot unit (the servers keep running)."""
    run_command(lambda: _down(inventory_path, as_json, break_lock))


def bench_gateway(opts: dict[str, Any]) -> int:
    """`bench --gateway`: node/gateway_bench.py on the gateway's node, rendered."""
    import json

    from orchestrator.cli.launch import _server_on_head
    from orchestrator.commands import quote
    from orchestrator.core.report import print_json
    from orchestrator.errors import SparkctlError
    from orchestrator.gateway import control as gateway
    from orchestrator.node import script
    from orchestrator.phases import gateway_spec

    manager, _ = _server_on_head(opts["inventory_path"], "bench --gateway")
    with manager as session:
        gw = gateway.find_gateway(gateway.probe_all(session.transports, liveliness=False))
        if gw is None or not gw.state:
            raise SparkctlError("no gateway runs: `sparkctl gateway up` first")
        state = gw.state
        replicas = [r for r in state.get("replicas") or []
                    if not opts.get("server") or opts["server"] in (r["server"], r["model"])]
        if not replicas:
            raise SparkctlError(f"no replica named {opts.get('server')!r} behind the gateway")
        model = replicas[0]["model"]
        concurrency = max(opts["concurrency"] or [8])  # parsed by `bench`
        args = {"gateway": f"http://127.0.0.1:{state['port']}", "config": gateway_spec.CONFIG_FILE,
                "model": model, "requests": 10 * opts["runs"], "seconds": 15,
                "concurrency": concurrency, "max_tokens": max(opts["tg"] or [32]),
                "direct": [f"http://{r['address']}:{r['port']}" for r in replicas
                           if r["model"] == model]}
        result = session.transports[gw.node].run(
            "python3 -c " + quote(script("gateway_bench.py")) + " " + quote(json.dumps(args)),
            sudo=True, timeout=600, display="bench through the gateway and direct").check()
    doc = {"command": "bench", "schema": "sparkctl-bench-gateway/1", "ok": True, "model": model,
           "node": gw.node, "replicas": len(args["direct"]), **json.loads(result.stdout)}
    if opts["as_json"]:
        print_json(doc)
        return 0
    lat, rates = doc["latency_ms"], doc["throughput"]
    click.echo(f"gateway vs direct on {gw.node}, {model}, {doc['replicas']} replica(s)")
    click.echo(f"latency  median of {doc['requests']}: direct {lat['direct']:.1f} ms, gateway "
               f"{lat['gateway']:.1f} ms: the gateway adds {doc['added_ms']:.1f} ms per request")
    for name in ("direct", "gateway"):
        r = rates[name]
        click.echo(f"c{doc['concurrency']:<7} {name:<8} {r['requests_per_s']:.2f} req/s, "
                   f"{r['tokens_per_s']:.1f} tokens/s ({r['requests']} requests, {r['errors']} "
                   "errors)")
    click.echo(f"throughput through the gateway: {doc['ratio'] * 100:.1f} % of direct")
    return 0
