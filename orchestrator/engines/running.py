"""Which engine's server runs on the cluster, whichever engine started it.

Every engine records its server in server.json (RUN_DIR on the head): the recipe, the model, the
port, and (from vLLM on) the engine, the container the server runs in, its pid file and the
words its command line contains. Records without those fields are TensorRT-LLM's (mpirun in the
`up` container). chat, tunnel and `launch` of another engine use this to find the server.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from orchestrator.commands import quote
from orchestrator.errors import SparkctlError
from orchestrator.paths import RUN_DIR, SERVER_JSON

if TYPE_CHECKING:
    from orchestrator.core.step import Phase
    from orchestrator.inventory import Inventory
    from orchestrator.remote.transport import Transport


def read_record(transport: Transport, inventory: Inventory) -> dict[str, Any] | None:
    result = transport.run(f"cat {quote(SERVER_JSON)} 2>/dev/null", sudo=True, timeout=60,
                           display=f"cat {SERVER_JSON}")
    if not result.ok or not result.stdout.strip():
        return None
    try:
        record = dict(json.loads(result.stdout))
    except (json.JSONDecodeError, TypeError, ValueError):
        return None
    record.setdefault("engine", "trtllm")
    record.setdefault("container", inventory.container.name)
    record.setdefault("main", "mpirun.pid")
    return record


def current_server(transport: Transport, inventory: Inventory) -> dict[str, Any] | None:
    """The recorded server if its main process still runs (checked in its own container)."""
    from orchestrator.engines.trtllm.serve import node_call

    record = read_record(transport, inventory)
    if record is None:
        return None
    try:
        status = node_call(transport, record["container"], action="status",
                           ours=record.get("ours"), main=record["main"])
    except SparkctlError:  # its container is gone: so is the server
        return None
    alive = bool((status.get("pids") or {}).get(record["main"], {}).get("alive"))
    return record if alive else None


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


def stop_other_engine_phase(running: dict[str, Any], inventory: Inventory) -> Phase:
    """--replace across engines: stop the other engine's server on every node first."""
    from orchestrator.core.step import Change, NodeContext, Outcome, Phase, Step
    from orchestrator.phases.teardown import managed_filter_args

    engine = str(running["engine"])

    class StopOtherEngine(Step):
        name = "stop-other-engine"

        def check(self, ctx: NodeContext) -> Outcome:
            return Change(f"stop {engine}'s server ({running.get('recipe', '?')})")

        def apply(self, ctx: NodeContext, change: Change) -> str | None:
            from orchestrator.commands import docker_cmd
            from orchestrator.engines.trtllm.serve import node_cmd

            if engine == "trtllm":
                command = node_cmd(ctx.inventory.container.name, action="stop", rotate=True)
            else:  # engines with their own per-server containers: remove those containers
                ids = docker_cmd("ps", "-aq", *managed_filter_args(ctx.inventory), "--filter",
                                 f"label=sparkctl.engine={engine}")
                pid_file = quote(f"{RUN_DIR}/{running.get('main') or 'server.pid'}")
                command = (f"ids=$({ids}); [ -z \"$ids\" ] || {docker_cmd('rm', '-f')} $ids "
                           f">/dev/null; rm -f {pid_file}")
            ctx.run(command, sudo=True, timeout=120, display=f"stop {engine}'s server").check()
            return f"stopped {engine}'s server"

    return Phase("replace", [StopOtherEngine()], lambda inv, node: {})
