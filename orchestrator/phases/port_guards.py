"""Port guards (iptables chains `sparkctl-...` hooked from INPUT, orchestrator/node/portguard.py)
leave with their server: one server's chain when it stops (`down --server`, a replace: the
record's `port_guard` names it, engines/servers.py), every one at `down`, checked gone after.

An engine installs its own (an engine folder under engines/); this module only removes,
so `down` needs no engine. A node without iptables has no chain to remove: nothing to do.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.commands import quote
from orchestrator.core.step import Change, NodeContext, Outcome, Step, Unchanged
from orchestrator.errors import SparkctlError
from orchestrator.node import script

FACT = "port_guards"


def guard_cmd(mode: str, config: dict[str, Any]) -> str:
    """portguard.py on the node (as root): its text as `python3 -c`, the config as one argument."""
    return (f"python3 -c {quote(script('portguard.py'))} {mode} "
            f"{quote(json.dumps(config, sort_keys=True))}")


def remove_cmd(chain: str | None = None) -> str:
    """Unhook and delete CHAIN (None: every sparkctl chain) on a node; absent is fine."""
    return guard_cmd("remove", {"chain": chain} if chain else {"all": True})


def facts() -> dict[str, Any]:
    return {"commands": {FACT: guard_cmd("list", {})}}


def answer_of(out: str, err: str = "") -> dict[str, Any]:
    """portguard.py's JSON line from its output, or {"error": what it printed instead}."""
    for line in reversed(out.strip().splitlines()):
        try:
            return dict(json.loads(line))
        except (json.JSONDecodeError, TypeError, ValueError):
            continue
    return {"error": (err or out or "no answer").strip()[-300:]}


def fact_of(ctx: NodeContext, key: str) -> dict[str, Any]:
    """The node's answer to the command its facts ran under KEY."""
    answer = ctx.facts.command(key)
    return answer_of(answer.out, answer.err) if answer is not None else {"error": "no answer"}


class RemovePortGuards(Step):
    """`down`: every sparkctl chain in the node's firewall, unhooked and deleted."""

    name = "port-guards"

    def check(self, ctx: NodeContext) -> Outcome:
        found = fact_of(ctx, FACT)
        if found.get("missing"):
            return Unchanged("no iptables here, so no port guard")
        if "error" in found:  # down goes on: the removal says what it finds
            return Change(f"remove every sparkctl chain from the firewall (could not list them: "
                          f"{found['error']})", commands=(remove_cmd(),))
        chains = list(found.get("chains") or [])
        if not chains:
            return Unchanged("no port guard")
        return Change(f"remove the port guard chain(s) {', '.join(chains)} from the firewall "
                      "(the servers they guard are stopped first)", commands=(remove_cmd(),))

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        result = ctx.run(change.commands[0], sudo=True, timeout=120,
                         display="python3 -c <portguard> remove every sparkctl chain")
        found = answer_of(result.stdout, result.stderr)
        if not result.ok or "error" in found:
            raise SparkctlError(f"{ctx.node.name}: could not remove its port guards: "
                                f"{found.get('error') or result.stderr.strip()[-300:]}")
        return f"removed {', '.join(found.get('removed') or []) or 'nothing'}"


def verify_line() -> str:
    """A shell line for down's verify: prints every sparkctl chain still in the firewall."""
    listing = "; ".join(f"{tool} -w -S 2>/dev/null | sed -n 's/^-N \\(sparkctl-.*\\)/firewall "
                        f"chain ({tool}): \\1/p'" for tool in ("iptables", "ip6tables"))
    return f"{{ {listing}; }}"
