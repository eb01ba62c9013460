"""`sparkctl chat`: one chat completion to a running server, or through the gateway, over an
SSH forward from the controller (nothing listens beyond the node's own addresses for it)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from orchestrator.cli import CONTEXT, inventory_option, json_option, run_command
from orchestrator.cli.completion import complete_server

if TYPE_CHECKING:
    from orchestrator.commands import Secret
    from orchestrator.remote.transport import Transport


@dataclass(frozen=True)
class Target:
    """Where the completion goes: a node, the address and port there, the model, the key."""

    transport: Transport
    host: str
    port: int
    model: str
    key: Secret | None
    said: dict[str, Any]
    """What --json adds about it ("server", "node" or "gateway")."""
    what: str
    """How an error names it ("server NAME on NODE", "the gateway on NODE")."""


def server_target(session: Any, inventory: Any, name: str | None) -> Target:
    from orchestrator.cli.launch import _running_server
    from orchestrator.engines.apikey import probe_host, read_node_key  # key: over SSH

    transport, server = _running_server(session, inventory, name)
    record = server.record
    return Target(transport, probe_host(record.host), record.port, record.model,
                  read_node_key(transport, record), {"server": server.name, "node": server.node},
                  f"server {server.name} on {server.node}")


def read_gateway_key(transport: Transport) -> Secret:
    """The gateway's master key from its router config on its node (root only), over SSH's
    stdout (orchestrator/node/gateway_key.py prints that key alone): never on a command line."""
    from orchestrator.commands import Secret, quote
    from orchestrator.errors import SparkctlError
    from orchestrator.node import script
    from orchestrator.phases.gateway_spec import CONFIG_FILE
    from orchestrator.state import register_secret

    result = transport.run(f"python3 -c {quote(script('gateway_key.py'))} {quote(CONFIG_FILE)}",
                           sudo=True, timeout=30, display=f"read the gateway's key ({CONFIG_FILE})")
    value = result.stdout.strip()
    if not result.ok or not value:
        raise SparkctlError(
            f"{transport.node}: the gateway has an API key, but its config {CONFIG_FILE} cannot "
            f"be read ({result.stderr.strip()[-200:] or 'no api_key in it'}); start it again with "
            "`sparkctl gateway up --api-key-file FILE`")
    secret = Secret(value)
    register_secret(secret)
    return secret


def gateway_target(session: Any) -> Target:
    """The running gateway (its record, gateway.json, found by probing every node), the model
    of its replicas and, when it has one, its key."""
    from orchestrator.engines.apikey import probe_host
    from orchestrator.errors import SparkctlError
    from orchestrator.gateway import control as gateway

    found = gateway.find_gateway(gateway.probe_all(session.transports, liveliness=False))
    if found is None or not found.state:
        raise SparkctlError("no gateway runs: `sparkctl gateway up` first, or chat with a server "
                            "directly (`sparkctl chat --server NAME`)")
    state, transport = found.state, session.transports[found.node]
    models = sorted({r["model"] for r in state.get("replicas") or []})
    if not models:
        raise SparkctlError(f"the gateway on {found.node} has no replica: launch a server, then "
                            "`sparkctl gateway up` again")
    key = read_gateway_key(transport) if state.get("key") else None
    return Target(transport, probe_host(state["host"]), int(state["port"]), models[0], key,
                  {"gateway": True, "node": found.node}, f"the gateway on {found.node}")


def _chat(prompt: str | None, inventory_path: str | None, max_tokens: int, as_json: bool,
          name: str | None = None, through_gateway: bool = False) -> int:
    import json
    import time
    import urllib.error
    import urllib.request

    from orchestrator.cli import launch as launch_cli
    from orchestrator.core.output import http_error_text as said  # (its message, never bytes)
    from orchestrator.core.report import print_json
    from orchestrator.engines.apikey import bearer
    from orchestrator.errors import InputError, SparkctlError
    from orchestrator.remote.tunnel import Forwarder
    from orchestrator.yamlio import read_prompt

    if through_gateway and name:
        raise InputError("--gateway and --server exclude each other: the gateway picks the "
                         "replica (`sparkctl gateway status` lists them)")
    prompt = read_prompt(prompt, sys.stdin, "Paris is great because")
    manager, inventory = launch_cli._server_on_head(inventory_path, "chat")
    with manager as session:
        target = (gateway_target(session) if through_gateway
                  else server_target(session, inventory, name))
        headers = {"Content-Type": "application/json", **bearer(target.key)}
        with Forwarder(target.transport, target.port, remote_host=target.host) as forward:
            body = {"model": target.model, "max_tokens": max_tokens,
                    "messages": [{"role": "user", "content": prompt}]}
            request = urllib.request.Request(
                f"http://127.0.0.1:{forward.local_port}/v1/chat/completions",
                data=json.dumps(body).encode(), headers=headers)
            started = time.monotonic()
            try:
                with urllib.request.urlopen(request, timeout=600) as response:
                    answer = json.loads(response.read())
            except urllib.error.HTTPError as exc:
                raise SparkctlError(f"{target.what} answered HTTP {exc.code}: "
                                    f"{said(exc.read())}") from None
            except (urllib.error.URLError, OSError) as exc:
                raise SparkctlError(f"no answer through the tunnel to {target.what}: {exc}") from None
            seconds = time.monotonic() - started
    text = answer["choices"][0]["message"].get("content") or ""
    tokens = (answer.get("usage") or {}).get("completion_tokens", 0)
    rate = tokens / max(seconds, 1e-3)
    if as_json:
        print_json({"command": "chat", "ok": True, "model": target.model, "reply": text,
                    **target.said, "completion_tokens": tokens, "seconds": round(seconds, 3),
                    "tokens_per_second": round(rate, 2)})
    else:
        click.echo(text)
        click.echo(f"[{target.model}: {tokens} tokens in {seconds:.2f}s, {rate:.1f} tokens/s]",
                   err=True)
    return 0


@click.command(context_settings=CONTEXT)
@click.argument("prompt", required=False)
@inventory_option
@click.option("--max-tokens", type=click.IntRange(min=1), default=256, show_default=True)
@json_option
@click.option("--server", "name", metavar="NAME", help="Which server (needed when several run).",
              shell_complete=complete_server)
@click.option("--gateway", "through_gateway", is_flag=True,
              help="Through the gateway instead (`sparkctl gateway up`): its model, and its key "
                   "read on its node, never given on a command line.")
def chat(prompt: str | None, inventory_path: str | None, max_tokens: int, as_json: bool,
         name: str | None, through_gateway: bool) -> None:
    """Send one chat completion to the running server, through SSH to its node.

    PROMPT defaults to stdin (when piped). Prints the reply, and tokens/s on stderr.
    --gateway sends it through the gateway (docs/gateway.md).
    """
    run_command(lambda: _chat(prompt, inventory_path, max_tokens, as_json, name, through_gateway))
