"""Phase "port-check", first of every launch: the TCP ports the server will bind are free on
each of its nodes, for every engine and every port it declares (HTTP, Ray's GCS, SGLang's
dist-init: the recipe's `listen_ports`).

Why first and on every serving node: a taken port used to surface only when the engine tried
to bind it, after the model had loaded (13 s in the lab, minutes on a Spark), and on the step
of the node that waited for it rather than the node where it was taken, with the cause only in
a log tail. Read-only, so a refusal here leaves the cluster exactly as it was.

A listener inside one of this cluster's sparkctl containers is not in the way: it is a server
the launch's own steps judge (kept, restarted, replaced or refused; node/ports.py says whose).
Except one in a container of another named server (label sparkctl.server, any engine): the
launch never stops a server of another name, so that one is in the way, named with its fix.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from orchestrator.commands import quote
from orchestrator.core.step import NodeContext, Outcome, Phase, Step, Unchanged
from orchestrator.errors import SparkctlError
from orchestrator.recipe import ListenPort

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node


WILDCARDS = {"*", "0.0.0.0", "[::]", "::", ""}


def clash(want: ListenPort, listening_on: str) -> bool:
    """Whether a listener on LISTENING_ON keeps WANT from binding (the kernel's rule: the same
    address, or either side on every address)."""
    mine = "127.0.0.1" if want.address == "localhost" else want.address
    return mine in WILDCARDS or listening_on in WILDCARDS or listening_on == mine


def ports_cmd(inventory: Inventory, ports: list[int]) -> str:
    from orchestrator.node import script

    args = {"ports": sorted(set(ports)), "cluster": inventory.cluster.name}
    return f"python3 -c {quote(script('ports.py'))} {quote(json.dumps(args, sort_keys=True))}"


def holder(entry: dict[str, Any]) -> str:
    process = f"{entry.get('process') or '?'} (pid {entry.get('pid') or '?'})"
    if entry.get("container"):
        process += f" in container {entry['container']}"
    if entry.get("server"):
        process += f" of server {entry['server']} (`sparkctl down --server {entry['server']}`)"
    return f"{process} on {entry.get('address') or '*'}"


def in_the_way(entry: dict[str, Any], server: str | None) -> bool:
    """Not sparkctl's, or (launching server SERVER) another named server's."""
    theirs = entry.get("server")
    return not entry.get("ours") or bool(server and theirs and theirs != server)


class PortsFree(Step):
    """Fails on the node where a wanted port is taken, naming the port, its use, the process
    that holds it and the way to pick another."""

    name = "ports"

    def __init__(self, wanted: list[ListenPort], server: str | None = None) -> None:
        self.wanted, self.server = wanted, server

    def check(self, ctx: NodeContext) -> Outcome:
        mine = [p for p in self.wanted if p.node == ctx.node.name]
        if not mine:
            return Unchanged("the server binds no port here")
        answer = ctx.facts.command("ports")
        try:
            found = json.loads(answer.out if answer else "")
        except ValueError:
            found = {"error": ((answer.err if answer else "") or "no answer").strip()[-200:]}
        if "error" in found:
            return Unchanged(f"ports unknown ({found['error']}); the engine will say if one is taken")
        taken = []
        for want in mine:
            others = [e for e in found["ports"].get(str(want.port), [])
                      if in_the_way(e, self.server) and clash(want, str(e.get("address") or "*"))]
            if others:
                taken.append(f"port {want.port} ({want.what}) is taken by "
                             f"{', '.join(holder(e) for e in others)}: stop it, or {want.fix}")
        if taken:
            raise SparkctlError(f"{ctx.node.name}: " + "; ".join(taken)
                                + ". Nothing was started or downloaded.")
        return Unchanged("free: " + ", ".join(f"{p.port} ({p.what})" for p in mine))


def phase(wanted: list[ListenPort], server: str | None = None) -> Phase:
    """On every node; the nodes the server does not bind on answer without a command."""
    def facts(inventory: Inventory, node: Node) -> dict[str, Any]:
        ports = [p.port for p in wanted if p.node == node.name]
        return {"commands": {"ports": ports_cmd(inventory, ports)}} if ports else {}

    return Phase("port-check", [PortsFree(wanted, server)], facts)


def with_port_check(phases: list[Phase], wanted: list[ListenPort],
                    server: str | None = None) -> list[Phase]:
    """The launch plan with the port check first (before a --replace stops anything); SERVER:
    the name of the server it launches."""
    return [phase(wanted, server), *phases]

