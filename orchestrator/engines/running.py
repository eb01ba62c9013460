"""Which engine's server runs on the cluster, whichever engine started it.

A one-server engine (vLLM) records its server in server.json (RUN_DIR on the head): the recipe,
the model, the port, the engine, the container the server runs in, its pid file and the words
its command line contains. Records without those fields are TensorRT-LLM's from before its
servers had names (mpirun in the `up` container, pid files directly in RUN_DIR): still found,
stopped and replaced (engines/servers.py lists them as "legacy"). chat, tunnel and `launch` of
another engine use this to find the server.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from orchestrator.commands import quote
from orchestrator.core.step import Change, NodeContext, Outcome, Step, Unchanged
from orchestrator.errors import SparkctlError
from orchestrator.paths import SERVER_JSON
from orchestrator.remote.facts import Request
from orchestrator.remote.gathered import NodeFacts

if TYPE_CHECKING:
    from orchestrator.core.step import Phase
    from orchestrator.inventory import Inventory
    from orchestrator.remote.transport import Transport


def current_server(transport: Transport, inventory: Inventory) -> dict[str, Any] | None:
    """The recorded server if its main process still runs (checked in its own container): one
    command on the head (orchestrator/node/running.py)."""
    result = transport.run(running_cmd(inventory), sudo=True, timeout=90,
                           display="which server runs (server.json, its main process)")
    if not result.ok:
        return None
    return running_from_output(result.stdout)


def other_engine_refusal(running: dict[str, Any] | None, recipe: Any) -> str | None:
    """Launching an engine while another engine serves: refused (unless --replace)."""
    if running is None or running.get("engine") == recipe.engine:
        return None
    from orchestrator.engines import get_engine

    theirs = get_engine(str(running["engine"])).title
    mine = get_engine(recipe.engine).title
    return (f"the cluster already serves recipe {running.get('recipe', '?')} with {theirs} "
            f"(engine {running['engine']}, {running.get('model', '?')}); launching "
            f"{recipe.name} ({mine}) would replace it: pass --replace, or stop it first with "
            "`sparkctl down`")


def running_cmd(inventory: Inventory) -> str:
    """The head's facts command: the recorded server and whether its main process lives."""
    from orchestrator.engines import DEFAULT_ENGINE
    from orchestrator.engines.serverctl import process_words
    from orchestrator.node import script

    return "python3 -c " + " ".join(quote(a) for a in (
        script("running.py"), SERVER_JSON, inventory.container.name, script("serverctl.py"),
        DEFAULT_ENGINE, json.dumps(process_words())))


def running_from_facts(facts: NodeFacts) -> dict[str, Any] | None:
    """The running server's record from running_cmd's answer in the facts, or None."""
    return running_from_output(facts.output("running"))


def running_from_output(output: str) -> dict[str, Any] | None:
    """The running server's record from running_cmd's output, or None."""
    try:
        found = json.loads(output or "{}")
    except ValueError:
        return None
    return found.get("server") if found.get("alive") else None


def guard_phase(recipe: Any, inventory: Inventory, replace: bool,
                same_engine: list[Step] | None = None,
                more_facts: Request | None = None) -> Phase:
    """First phase of every launch, judged from facts (planning makes no remote call): another
    engine's server is refused unless --replace (then it is stopped here), and the engine's own
    guard steps judge a running server of the same engine."""
    from orchestrator.core.step import Phase
    from orchestrator.remote.facts import merge_requests

    def facts(inv: Inventory, node: Any) -> dict[str, Any]:
        from orchestrator.engines.servers import servers_cmd

        return merge_requests([{"commands": {"running": running_cmd(inv),
                                             "servers": servers_cmd(inv, node, legacy=False)}},
                               more_facts or {}])

    steps: list[Step] = [OtherEngineGuard(recipe, replace), *(same_engine or [])]
    return Phase("server-check", steps, facts, head_only=True)


class OtherEngineGuard(Step):
    """A server of another engine: refused without --replace, stopped with it."""

    name = "other-engine"
    scope = "head"

    def __init__(self, recipe: Any, replace: bool) -> None:
        self.recipe = recipe
        self.replace = replace

    def check(self, ctx: NodeContext) -> Outcome:
        running = running_from_facts(ctx.facts) or self.in_up_container(ctx)
        refusal = other_engine_refusal(running, self.recipe)
        if refusal is None or running is None:
            return Unchanged("no server of another engine runs")
        if not self.replace:
            raise SparkctlError(refusal)
        return Change(f"stop {running['engine']}'s server ({running.get('recipe', '?')}): --replace",
                      payload=running)

    def in_up_container(self, ctx: NodeContext) -> dict[str, Any] | None:
        """A named server whose processes run in the head's `up` container (what was the
        single recorded server of the cluster before servers had names)."""
        from orchestrator.engines.servers import from_facts

        found = from_facts({ctx.node.name: ctx.facts}, ctx.inventory)
        return next((s for s in found if s.get("main") and s.get("engine") != self.recipe.engine
                     and s.get("container") == ctx.inventory.container.name), None)

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        running: dict[str, Any] = change.payload
        engine = str(running["engine"])
        if running.get("legacy") is False:  # a named server (node/servers.py): its own stop
            from orchestrator.engines.servers import stop_server

            stop_server(ctx.transports, ctx.inventory, running)
            return f"stopped {engine}'s server {running.get('name')}"
        from orchestrator.engines.servers import stop_command

        command = stop_command(ctx.inventory, running)
        # every node: TensorRT-LLM's ranks live on each serving node
        for name, transport in ctx.transports.items():
            transport.run(command, sudo=True, timeout=120,
                          display=f"stop {engine}'s server on {name}").check()
        return f"stopped {engine}'s server"
