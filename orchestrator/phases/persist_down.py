"""What `down` does about `launch --persist` (phases/persist.py): the boot units go first.

On each node: every sparkctl boot unit (or, with `down --server NAME`, that server's) is
disabled and stopped (`systemctl disable --now`, so a boot still waiting for its peers ends),
its unit file and boot plan are removed through the ledger (a file someone changed since
sparkctl wrote it is left alone and named), and the boot script too once no unit is left. The
containers' restart policy (`unless-stopped`) goes with the containers `down` removes next; the
report names each container and its policy, so it says exactly what stops coming back.
The boot logs (`/var/log/sparkctl/boot-<server>.log`) go too, unless `down --keep-logs`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.commands import join, quote
from orchestrator.core.step import Change, NodeContext, Outcome, Step, Unchanged
from orchestrator.inventory import Inventory
from orchestrator.phases.boot_units import (
    BOOT_LOG_DIR,
    BOOT_SCRIPT,
    launch_marker,
    parse_units,
    plan_path,
    unit_name,
    unit_path,
    units_cmd,
)
from orchestrator.phases.files import ledger_answer, undo_files_cmd


def restart_policies_cmd(inventory: Inventory) -> str:
    """`<name> <restart policy>` per container of this cluster's (sparkctl's labels)."""
    ids = join(["docker", "ps", "-aq", "--filter", "label=sparkctl.managed=true",
                "--filter", f"label=sparkctl.cluster={inventory.cluster.name}"])
    inspect = join(["docker", "inspect", "-f", "{{.Name}} {{.HostConfig.RestartPolicy.Name}}"])
    return f"ids=$({ids} 2>/dev/null); [ -z \"$ids\" ] || {inspect} $ids 2>/dev/null; true"


BOOT_LOGS = f"{BOOT_LOG_DIR}/boot-*.log"


def boot_log(server: str) -> str:
    return f"{BOOT_LOG_DIR}/boot-{server}.log"


def units_facts() -> dict[str, Any]:
    """The boot units alone: all a launch without --persist reads (its stale units go)."""
    return {"commands": {"boot_units": units_cmd()}}


def facts(inventory: Inventory) -> dict[str, Any]:
    """What `down` reads: the boot units, the containers' restart policies, the boot logs."""
    request = units_facts()
    request["commands"].update({"restart_policies": restart_policies_cmd(inventory),
                                "boot_logs": f"ls -1 {BOOT_LOGS} 2>/dev/null; true"})
    return request


def logs_left_cmd() -> str:
    """For down's verify step: a line per boot log still there."""
    return f"ls -1 {BOOT_LOGS} 2>/dev/null | sed 's/^/boot log: /'"


def kept_text(network: bool, keep_logs: bool) -> str:
    """down's verify line: exactly what it kept, and why."""
    kept = ["the Hugging Face cache", *([] if network else ["the fabric network (--network)"]),
            *(["the boot logs (--keep-logs)"] if keep_logs else [])]
    return "nothing else left; kept: " + ", ".join(kept)


class RemoveBootLogs(Step):
    """What the boot units wrote, `/var/log/sparkctl/boot-<server>.log` (all, or one server's):
    removed unless the user asked to keep them (`down --keep-logs`); the directory goes once
    empty. A file of the user's in that directory is never touched."""

    name = "boot-logs"

    def __init__(self, server: str | None = None, keep: bool = False) -> None:
        self.server, self.keep = server, keep

    def check(self, ctx: NodeContext) -> Outcome:
        logs = [line.strip() for line in ctx.facts.output("boot_logs").splitlines()
                if line.strip() and (self.server is None or line.strip() == boot_log(self.server))]
        if not logs:
            return Unchanged("no boot log")
        if self.keep:
            return Unchanged(f"left alone (--keep-logs): {', '.join(logs)}")
        return Change(f"remove {', '.join(logs)}", commands=(
            f"rm -f -- {' '.join(quote(p) for p in logs)} && "
            f"{{ rmdir {quote(BOOT_LOG_DIR)} 2>/dev/null || true; }}",))


def restart_policies(ctx: NodeContext, containers: set[str] | None = None) -> list[str]:
    out = []
    for line in ctx.facts.output("restart_policies").splitlines():
        parts = line.strip().lstrip("/").split()
        if len(parts) == 2 and parts[1] not in ("", "no") and (
                containers is None or parts[0] in containers):
            out.append(f"{parts[0]} ({parts[1]})")
    return out


def removal(summary: str, units: list[str], files: list[str], servers: list[str]) -> Change:
    """Units disabled and stopped, their files removed through the ledger (what sparkctl wrote),
    and the servers' launch markers (/run/sparkctl/launched-<server>: until a reboot they would
    outlive `down`), /run/sparkctl with them once empty."""
    markers = [launch_marker(s) for s in servers]
    gone = (f"; rm -f -- {' '.join(quote(m) for m in markers)}; "
            f"rmdir {quote(markers[0].rsplit('/', 1)[0])} 2>/dev/null" if markers else "")
    return Change(summary, payload={"units": units, "files": files}, commands=(
        f"{join(['systemctl', 'disable', '--now', *units])} >&2; {undo_files_cmd(files)}; "
        f"systemctl daemon-reload >&2 || true{gone}; true",))


class RemoveBootUnits(Step):
    """Disable and remove sparkctl's boot units (all, or one server's)."""

    name = "boot-units"

    def __init__(self, server: str | None = None, containers: set[str] | None = None,
                 select: Callable[[dict[str, str]], list[str]] | None = None,
                 name: str = "boot-units") -> None:
        self.server = server
        self.containers = containers
        self.select = select
        self.name = name

    def check(self, ctx: NodeContext) -> Outcome:
        units = parse_units(ctx.facts.command("boot_units"), engines=True)
        if self.select is not None:  # launch: the units it made stale (persist.stale)
            servers = self.select(units)
            if not servers:
                return Unchanged("no stale boot unit")
            # the last unit of the node goes: its boot script with it, as `down` does
            script = [BOOT_SCRIPT] if len(servers) == len(units) else []
            return removal(f"disable and remove {', '.join(unit_name(s) for s in servers)} "
                           "(that server was replaced or launched without --persist)",
                           [unit_name(s) for s in servers],
                           [unit_path(s) for s in servers] + [plan_path(s) for s in servers] + script,
                           servers)
        servers = sorted(s for s in units if self.server in (None, s))
        policies = restart_policies(ctx, self.containers)
        if not servers:
            return Unchanged("no boot unit (not persistent here)"
                             + (f"; restart policy of {', '.join(policies)} goes with the "
                                "containers" if policies and self.server is None else ""))
        last = len(servers) == len(units)
        files = [unit_path(s) for s in servers] + [plan_path(s) for s in servers]
        if last:
            files.append(BOOT_SCRIPT)
        text = (f"disable and remove {', '.join(unit_name(s) for s in servers)} "
                f"({', '.join(f.rsplit('/', 1)[-1] for f in files[len(servers):])} too)")
        if policies:
            text += (f"; the restart policy of {', '.join(policies)} goes with "
                     + ("the containers removed next" if self.server is None else "its containers"))
        return removal(text, [unit_name(s) for s in servers], files, servers)

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        units = change.payload["units"]
        result = ctx.run(change.commands[0], sudo=True, timeout=60,
                         display=f"systemctl disable --now {' '.join(units)}; remove their files")
        answer = ledger_answer(result, ctx.node.name, self.name)
        left = [str(e.get("reason")) for e in answer.get("left") or []]
        return ("left alone: " + "; ".join(left)) if left else None
