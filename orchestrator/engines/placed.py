"""What every engine whose servers are named and placed shares (one container per server and
node, several servers at once: SGLang, llama.cpp), so engines never import each other: the
server-check phase (this server judged against every node's servers), the record step, a
failed start stopped, one real chat completion, and the persist phase.

Each engine's launch spec (engines/NAME/serve.py ServeSpec) is an engines/serverspec.ServerSpec.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from orchestrator.commands import quote
from orchestrator.core.step import Change, NodeContext, Outcome, Phase, Step, Unchanged
from orchestrator.engines import lifecycle, servers
from orchestrator.engines.readiness import parse_lines, probe_cmd
from orchestrator.engines.serverspec import ServerSpec
from orchestrator.errors import SparkctlError
from orchestrator.remote.container import ContainerTransport

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.recipe import BaseRecipe, LaunchOptions
    from orchestrator.remote.transport import Transport


PlacedSpec = ServerSpec
"""One launch of one placed server (its engine's ServeSpec)."""


def log_tail(transport: Transport | None, container: str, lines: int = 25) -> str:
    if transport is None:
        return "(node unreachable)"
    try:
        out = ContainerTransport(transport, container).logs(lines, sudo=True, timeout=60)
        return out.strip() or "(empty)"
    except SparkctlError as exc:
        return f"(could not read its log: {exc})"


class Smoke(Step):
    """One real chat completion on the server's first node."""

    name = "smoke-test"
    kind = "verify"
    scope = "head"

    def __init__(self, spec: PlacedSpec) -> None:
        self.spec = spec

    def runs_on(self, inventory: Inventory) -> str:
        return self.spec.first

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        first = self.spec.first_request
        answer = first.answer  # sent by the readiness wait on the node once ready, if it was
        if answer is None:
            command = probe_cmd(self.spec.recipe.port, self.spec.host, self.spec.key_file,
                                first.body)
            answer = parse_lines(ctx.transports[self.spec.first].run(
                command, sudo=True, timeout=360, display="one chat completion").stdout)
        if answer.get("code") != 200:
            raise SparkctlError(f"{self.spec.first}: the chat completion failed (HTTP "
                                f"{answer.get('code')}): {str(answer.get('body'))[:300]}")
        tokens = (json.loads(answer["body"]).get("usage") or {}).get("completion_tokens", "?")
        return (f"chat completion on {self.spec.first}: {tokens} token{'' if tokens == 1 else 's'} "
                f"in {answer.get('seconds', 0):.2f}s")


class Placement(Step):
    """Every node's servers against this one: its name, ports and memory (from facts)."""

    name = "placement"
    scope = "head"

    def __init__(self, spec: PlacedSpec) -> None:
        self.spec = spec

    def check(self, ctx: NodeContext) -> Outcome:
        running = servers.from_facts(ctx.cluster_facts)
        decision, other = servers.judge(self.spec.wanted(), running, self.spec.options.replace,
                                        self.spec.options.ignore_memory)
        where = ", ".join(self.spec.nodes)
        others = [s for s in running if s.name != self.spec.name]
        if decision == "replace" and other is not None:
            return Change(f"stop server {self.spec.name} (another configuration): --replace",
                          payload=other)
        mine = f"{self.spec.estimate.total_gb:.1f} GB per node"
        if decision == "same" and other is not None:
            # the shared judgement (engines/lifecycle.py): stalled or dead -> restart
            current = lifecycle.running_of(other)
            if lifecycle.decide(current, self.spec.digest, False) == "restart":
                return Change(f"restart {self.spec.name}: {lifecycle.restart_reason(current)}",
                              payload=other)
        if decision == "same":
            return Unchanged(f"{self.spec.name} already runs on {where} (config {self.spec.digest})")
        return Unchanged(f"{self.spec.name} fits on {where} ({mine}; {len(others)} other "
                         "server(s) running)")

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        servers.stop_server(ctx.transports, ctx.inventory, change.payload)
        return f"stopped {change.payload.name}"


class Record(Step):
    """server.json of this server on its first node (what status, chat, tunnel and down read)."""

    name = "record"
    scope = "head"

    def __init__(self, spec: PlacedSpec) -> None:
        self.spec = spec

    def check(self, ctx: NodeContext) -> Outcome:
        running = servers.from_facts(ctx.cluster_facts)
        mine = next((s for s in running if s.name == self.spec.name), None)
        if mine and mine.record.config_hash == self.spec.digest:
            return Unchanged(f"{servers.record_dir(self.spec.name)}/server.json on {self.spec.first}")
        return Change(f"record {self.spec.name} in {servers.record_dir(self.spec.name)}/server.json "
                      f"on {self.spec.first}")

    batch = True  # on the first node: its one command, in the serve phase's batch
    timeout = 60

    def command(self) -> str:
        path = f"{servers.record_dir(self.spec.name)}/server.json"
        text = json.dumps(self.spec.record(), indent=1, sort_keys=True)
        return (f"install -d -m 0755 {quote(servers.record_dir(self.spec.name))} && "
                f"printf '%s\\n' {quote(text)} > {quote(path + '.tmp')} && "
                f"mv -f {quote(path + '.tmp')} {quote(path)}")

    def batch_commands(self, ctx: NodeContext, change: Change) -> tuple[str, ...] | None:
        return (self.command(),) if ctx.node.name == self.spec.first else None

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        path = f"{servers.record_dir(self.spec.name)}/server.json"
        result = ctx.transports[self.spec.first].run(self.command(), sudo=True,
                                                     timeout=self.timeout, display=f"write {path}")
        return self.done(ctx, change, [result])

    def done(self, ctx: NodeContext, change: Change, results: list[Any]) -> str | None:
        results[-1].check()
        return None


def check_phase(spec: PlacedSpec) -> Phase:
    def facts(inv: Inventory, node: Node) -> dict[str, Any]:
        # probed: a server of this name that was ready and answers no more is restarted
        return {"commands": {"servers": servers.servers_cmd(inv, node, probe=True)}}

    return Phase("server-check", [Placement(spec)], facts)


def persist_phase(spec: PlacedSpec, options: LaunchOptions, engine: str, rank: str) -> Phase:
    """`launch --persist` for a server whose containers are the server (phases/persist.py):
    docker restarts every node's container at boot; the first node's boot unit waits for
    /health 200, each other node's for its container (RANK names what runs there)."""
    from orchestrator.phases import persist
    from orchestrator.phases.memory import guard_threshold

    container, nodes, e = spec.container, list(spec.nodes), spec.estimate
    recipe: BaseRecipe = spec.recipe

    def part(node: Node) -> persist.Part:
        if node.name == nodes[0]:
            return persist.Part(containers=[container], health_port=recipe.port)
        return persist.Part(containers=[container], ready=[
            (f"{rank.format(index=nodes.index(node.name))} in {container} running",
             persist.running_cmd(container))])

    return persist.phase(persist.PersistSpec(
        server=spec.name, engine=engine, recipe=recipe, inventory=spec.inventory,
        nodes=nodes, part=part, guard_gb=guard_threshold(options.guard_min_available_gb, recipe),
        loaded_gb=e.weights_gb + e.draft_gb + e.runtime_gb, deadline=options.timeout))
