"""`sparkctl down`: undo what `up` and `launch` created on each node, and nothing else.

One phase, steps in lock-step on every reachable node: stop the server processes (every rank),
remove the containers labelled as ours, (with --network) remove our netplan file and the fabric
addresses the inventory gave, then remove /etc/sparkctl and /var/lib/sparkctl, and verify. One
phase: the executor stops after the first phase when a node is unreachable, and down must still
clean every node it can reach.

The server is stopped by launch's own stop script (its pid files, with descendants), so only
processes sparkctl started are signalled. Never touched: containers without our labels (even one
with our name), netplan files other than ours (and ours only with the managed header), addresses
on interfaces the inventory does not list as fabric, the user's ~/.ssh, and the Hugging Face
cache (models are hundreds of GB; docs/operate.md says how to remove them).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.commands import docker_cmd, quote
from orchestrator.core.step import Change, NodeContext, Outcome, Phase, Plan, Step, Unchanged
from orchestrator.errors import SparkctlError
from orchestrator.inventory import Inventory, Node
from orchestrator.paths import CONFIG_DIR, LEDGER, NETPLAN_FILE, RUN_DIR, SERVER_JSON, STATE_DIR
from orchestrator.phases import adopted, oomguard, port_guards
from orchestrator.phases.boot_units import UNIT_DIR, UNIT_PREFIX
from orchestrator.phases.files import ledger_answer, ledger_cmd, ledger_entries, ownership, undo_files_cmd
from orchestrator.phases.managed import managed_containers, managed_ps_cmd
from orchestrator.phases.persist_down import kept_text, logs_left_cmd
from orchestrator.records import ServerRecord
from orchestrator.remote.fact_records import FileInfo
from orchestrator.remote.facts import request_of
from orchestrator.remote.node_facts import LINKS, NETPLAN_FILES, ContainerInfo, DockerContainer, LinkTable

LOCK_NAME, LOCK_GENERATION = "lock", "lock-generation"
"""On the head: the cluster lock (held while down runs) and core/lock.py's count of its takes."""
SERVER_STOP_SECONDS = 20
CONTAINER_STOP_SECONDS = 20


@dataclass(frozen=True)
class EngineParts:
    """What `down` needs from the engines, handed in by its caller (engines.serverctl.down_parts):
    phases import no engine."""

    containers: list[str]
    """The engines' fixed server containers (an older single-server layout's), inspected too."""
    stop_cmd: Callable[[str, list[str] | None, int], str]
    """(container, the record's process words, grace seconds) -> the command that stops the
    server processes its pid files name there (node/serverctl.py)."""


def down_facts(inventory: Inventory, node: Node, engines: EngineParts) -> dict[str, Any]:
    # the `up` container, and the engines' default server containers (server.json names one)
    containers = map(DockerContainer, [inventory.container.name, *engines.containers])
    return {
        "files": {NETPLAN_FILE: True, LEDGER: True, CONFIG_DIR: False, STATE_DIR: False,
                  SERVER_JSON: True},
        **request_of(NETPLAN_FILES, LINKS, *containers),
        "commands": {
            "managed": managed_ps_cmd(inventory),
            "state_entries": f"ls -A {quote(STATE_DIR)} 2>/dev/null || true",
            "pid_files": f"ls {quote(RUN_DIR)} 2>/dev/null | grep '[.]pid$' || true",
        },
    }


def _is_ours(container: ContainerInfo | None, inventory: Inventory) -> bool:
    return container is not None and container.managed_by(inventory.cluster.name)


def _file(ctx: NodeContext, path: str) -> FileInfo:
    return ctx.facts.file(path) or FileInfo(exists=False)


def _server_record(ctx: NodeContext) -> ServerRecord | None:
    """server.json (on the head) of a server an earlier sparkctl launched, when `down` runs
    before anything read (and so migrated) it: which container it runs in, its process words."""
    fact = _file(ctx, SERVER_JSON)
    try:
        data = json.loads(fact.content or "{}") if fact.exists else None
    except (json.JSONDecodeError, TypeError, ValueError):
        return None
    return ServerRecord.from_dict(data) if isinstance(data, dict) else None


class StopServer(Step):
    """Stop what launch started on this node, by the pid files it recorded (mpirun, ranks, vllm),
    in the container the server record names (the `up` container for TensorRT-LLM)."""

    name = "stop-server"

    def __init__(self, engines: EngineParts) -> None:
        self.engines = engines

    def check(self, ctx: NodeContext) -> Outcome:
        record = _server_record(ctx)
        name = (record.container if record else None) or ctx.inventory.container.name
        container = DockerContainer(name).read(ctx.facts, strict=False)
        running = container is not None and container.running
        pids = _pid_files(ctx)
        if not pids:
            return Unchanged("no server processes recorded")
        if not (running and _is_ours(container, ctx.inventory)):
            return Unchanged(f"container not running, so neither is {', '.join(pids)}")
        return Change(f"stop the server processes recorded in {', '.join(pids)}",
                      payload=(name, record.ours if record else None))

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        container, ours = change.payload
        command = self.engines.stop_cmd(container, ours, SERVER_STOP_SECONDS)
        result = ctx.run(command, sudo=True, timeout=SERVER_STOP_SECONDS + 60,
                         display="stop the server (launch's pid files)")
        if not result.ok:
            # the container may have stopped meanwhile: removing it next ends everything anyway
            return (f"could not stop it gracefully (exit {result.exit_status}); "
                    "the container removal ends it")
        try:
            answer = json.loads(result.stdout)
        except json.JSONDecodeError:
            return "stopped (the stop script gave no answer)"
        if answer.get("left"):
            raise SparkctlError(f"{ctx.node.name}: stop-server: processes {answer['left']} survived "
                                "SIGKILL; run `sparkctl down` again")
        return f"stopped {', '.join(answer.get('stopped') or []) or 'nothing (already gone)'}"


def _pid_files(ctx: NodeContext) -> list[str]:
    return sorted(e.rsplit("/", 1)[-1] for e in ctx.facts.output("pid_files").split() if e.endswith(".pid"))


class RemoveContainers(Step):
    """Stop and remove the containers labelled as this cluster's; leave every other alone."""

    name = "containers"

    def check(self, ctx: NodeContext) -> Outcome:
        ours = managed_containers(ctx.facts)
        note = ""
        named = DockerContainer(ctx.inventory.container.name).read(ctx.facts, strict=False)
        if named and not _is_ours(named, ctx.inventory):
            note = (f"; left alone: container {ctx.inventory.container.name} (not created by "
                    "sparkctl for this cluster)")
        if not ours:
            return Unchanged("no sparkctl container" + note)
        names = ", ".join(f"{c.name} ({c.state})" for c in ours)
        return Change(f"remove {names}{note}",
                      commands=(remove_containers_cmd([c.id for c in ours]),))


def remove_containers_cmd(ids: list[str]) -> str:
    # stop first so the entrypoint gets TERM; rm -f also covers one that will not stop
    return (docker_cmd("stop", "-t", CONTAINER_STOP_SECONDS, *ids) + " >/dev/null 2>&1; "
            + docker_cmd("rm", "-f", *ids) + " >/dev/null")


@dataclass(frozen=True)
class NetworkUndo:
    remove_file: bool
    """Undo our netplan file through the ledger: restore what stood there before, or remove it."""
    restore: bool
    """What stood there before `up` was a file of the user's: it is put back (for the summary)."""
    addresses: list[tuple[str, str]]
    """(interface, CIDR) pairs to delete: inventory fabric addresses still configured."""


class RemoveNetwork(Step):
    """Remove our netplan file, re-apply netplan, delete the fabric addresses we configured."""

    name = "network"

    def check(self, ctx: NodeContext) -> Outcome:
        fact = _file(ctx, NETPLAN_FILE)
        owner = ownership(ctx, NETPLAN_FILE)
        notes: list[str] = []
        if owner == "unrecorded":
            notes.append(f"left alone: {NETPLAN_FILE} was not written by sparkctl")
        elif owner == "changed":
            notes.append(f"left alone: {NETPLAN_FILE} was changed since sparkctl wrote it")
        elif owner == "absent":
            notes.append("no sparkctl netplan file")
        if ctx.inventory.fabric.network == "adopted":
            notes.append(adopted.adopted_note(ctx))
        for note in notes:  # what was not done belongs in the report's notes (stdout, piped)
            if note.startswith("left alone"):
                ctx.shared.notes.append(f"{ctx.node.name}: {note}")
        remove_file = owner == "ours"
        before = (ledger_entries(ctx).get(NETPLAN_FILE) or {}).get("before") or {}
        restore = remove_file and before.get("kind") == "file"
        kept_file = owner in ("unrecorded", "changed")
        addresses = [] if restore else self._addresses_to_flush(ctx, notes, kept_file)
        if not remove_file and not addresses:
            return Unchanged("; ".join(notes) or "nothing to remove")
        parts = []
        if restore:
            parts.append(f"restore the {NETPLAN_FILE} that was there before `up`, netplan apply")
        elif remove_file:
            parts.append(f"remove {NETPLAN_FILE}, netplan apply")
        if addresses:
            parts.append("delete " + ", ".join(f"{a} on {i}" for i, a in addresses))
        diff = ""
        if remove_file:  # a unified diff to nothing (or to the file from before `up`)
            lines = (fact.content or "").splitlines()
            target = f"{NETPLAN_FILE} (as before `up`)" if restore else "/dev/null"
            diff = (f"--- {NETPLAN_FILE} (on node)\n+++ {target}\n@@ -1,{len(lines)} +0,0 @@\n"
                    + "".join(f"-{line}\n" for line in lines))
        undo = NetworkUndo(remove_file, restore, addresses)
        return Change("; ".join(parts + notes), diff=diff, payload=undo, commands=(remove_network_cmd(undo),))

    def _addresses_to_flush(self, ctx: NodeContext, notes: list[str],
                            kept_file: bool) -> list[tuple[str, str]]:
        links = (LINKS.read(ctx.facts) or LinkTable({})).links
        claimed = {
            iface
            for path, entry in NETPLAN_FILES.read(ctx.facts).items()
            if path != NETPLAN_FILE or kept_file
            for iface in entry.interfaces
        }
        out = []
        for iface, address in sorted((ctx.node.addresses or {}).items()):
            if iface not in ctx.inventory.fabric.interfaces:
                continue
            if iface not in links or address not in links[iface].addresses:
                continue
            if iface in claimed:
                notes.append(f"left alone: {address} on {iface} (another netplan file configures {iface})")
                continue
            out.append((iface, address))
        return out

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        undo: NetworkUndo = change.payload
        result = ctx.run(change.commands[0], sudo=True, timeout=120, display="remove sparkctl fabric config")
        note = None
        if undo.remove_file:
            answer = ledger_answer(result, ctx.node.name, "network")
            left = [str(e.get("reason")) for e in answer.get("left") or []]
            note = "; ".join(left) or None
        if not result.ok:
            raise SparkctlError(
                f"{ctx.node.name}: network: removing the fabric config failed (exit "
                f"{result.exit_status}): {result.stderr.strip()[-400:]}. Check `netplan get` and "
                f"`ip addr` on the node; run `sparkctl down --network` again"
            )
        return note


def remove_network_cmd(undo: NetworkUndo) -> str:
    """One command: file gone (or the user's put back, through the ledger: only when what is on
    disk is exactly what sparkctl wrote), netplan re-applied, then our addresses deleted.

    netplan apply leaves addresses on interfaces it no longer manages, hence the explicit
    deletes; each one tolerates an address that is already gone.
    """
    lines = ["status=0"]
    if undo.remove_file:
        lines.append(f"{undo_files_cmd([NETPLAN_FILE])} || status=1")
        lines.append("netplan apply || status=1")
    lines += [f"ip addr del {quote(address)} dev {quote(iface)} 2>/dev/null"
              for iface, address in undo.addresses]
    lines.append("exit $status")
    return "; ".join(lines)


class RemoveFiles(Step):
    """/etc/sparkctl (cluster keys, trust files, entrypoint) and /var/lib/sparkctl (state).

    /etc/sparkctl is sparkctl's own directory, but a file in it that sparkctl wrote and someone
    changed since is left alone (the ledger says which). Without --network the ledger (and the
    user's original netplan file it keeps) stays, so a later `down --network` can still undo the
    netplan file exactly.
    """

    name = "files"

    def __init__(self, network: bool = True) -> None:
        self.network = network

    def keep(self, ctx: NodeContext) -> set[str]:
        keep = {LOCK_NAME, LOCK_GENERATION}
        if not self.network and NETPLAN_FILE in ledger_entries(ctx):
            keep |= {LEDGER.rsplit("/", 1)[-1], "originals"}
        return keep

    def check(self, ctx: NodeContext) -> Outcome:
        targets = []
        if _file(ctx, CONFIG_DIR).exists:
            targets.append(f"{CONFIG_DIR}/")
        entries = [e for e in _state_entries(ctx) if e not in self.keep(ctx)]
        if entries:
            targets.append(f"{STATE_DIR}/{{{','.join(entries)}}}")
        if not targets:
            return Unchanged("no sparkctl files")
        return Change("remove " + ", ".join(targets) + " (Hugging Face cache kept)",
                      commands=(remove_files_cmd(sorted(self.keep(ctx))),))

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        result = ctx.run(change.commands[0], sudo=True, display="remove /etc/sparkctl, /var/lib/sparkctl")
        answer = ledger_answer(result, ctx.node.name, "files")
        result.check()
        left = [str(e.get("reason")) for e in answer.get("left") or []]
        return "; ".join(left) or None


def _state_entries(ctx: NodeContext) -> list[str]:
    return sorted(e for e in ctx.facts.output("state_entries").split() if e)  # RemoveFiles.keep: the lock


def remove_files_cmd(keep: list[str]) -> str:
    """/etc/sparkctl through the ledger (changed files of sparkctl's stay), then the state
    directory except the names in `keep` (the lock, on the head, is held while down runs)."""
    state = quote(STATE_DIR)
    spare = " ".join(f"! -name {quote(name)}" for name in keep)
    return (
        f"{ledger_cmd('purge', CONFIG_DIR)} && "
        f"if [ -d {state} ]; then find {state} -mindepth 1 -maxdepth 1 {spare} "
        f"-exec rm -rf -- {{}} + && rmdir {state} 2>/dev/null; fi; true"
    )


class VerifyDown(Step):
    """Prove nothing sparkctl made is left on the node (fresh look, after the changes)."""

    name = "verify"
    kind = "verify"

    def __init__(self, network: bool, keep_logs: bool = False) -> None:
        self.network, self.keep_logs = network, keep_logs

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        result = ctx.run(verify_cmd(ctx.inventory, self.network, self.keep_logs), sudo=True,
                         timeout=60, display="check nothing is left")
        left = [line for line in result.stdout.splitlines() if line.strip()]
        if result.exit_status not in (0, 1) or left:
            detail = "; ".join(left) or result.stderr.strip()[-300:]
            raise SparkctlError(f"{ctx.node.name}: still present after down: {detail}")
        return kept_text(self.network, self.keep_logs)

    def check(self, ctx: NodeContext) -> Outcome:  # verify steps are never checked
        return Unchanged("verify")


def verify_cmd(inventory: Inventory, network: bool, keep_logs: bool = False) -> str:
    from orchestrator.phases import gateway_down

    checks = [
        managed_ps_cmd(inventory, "container: {{.Names}}"),
        f"ls {UNIT_DIR}/{UNIT_PREFIX}*.service 2>/dev/null | sed 's/^/boot unit: /'",
        f"[ ! -e {quote(CONFIG_DIR)} ] || echo 'directory: {CONFIG_DIR}'",
        *([] if keep_logs else [logs_left_cmd()]), gateway_down.verify_line(),
        port_guards.verify_line()]
    if network:  # a file of the user's at our path was left alone on purpose: only ours counts
        probe = f"printf '%s' {quote(json.dumps([NETPLAN_FILE]))} | {ledger_cmd('check')}"
        checks.append(f"[ ! -e {quote(NETPLAN_FILE)} ] || {{ {probe} | grep -q '\"ours\"' && "
                      f"echo 'file: {NETPLAN_FILE}'; }}")
    return "; ".join(checks) + "; true"


def down_phase(inventory: Inventory, network: bool, engines: EngineParts,
               keep_logs: bool = False) -> Phase:
    from orchestrator.phases import gateway_down, persist_down
    from orchestrator.remote.facts import merge_requests

    steps: list[Step] = [persist_down.RemoveBootUnits(), StopServer(engines), RemoveContainers(),
                         port_guards.RemovePortGuards(), gateway_down.StopRelays(),
                         gateway_down.RemoveRouter()]
    if network:
        steps.append(RemoveNetwork())
    steps += [oomguard.Remove(), RemoveFiles(network), persist_down.RemoveBootLogs(keep=keep_logs),
              VerifyDown(network, keep_logs)]
    return Phase("down", steps, lambda inv, node: merge_requests(
        [down_facts(inv, node, engines), persist_down.facts(inv), oomguard.down_facts(inv),
         gateway_down.facts(), port_guards.facts()]))


def build_down_plan(inventory: Inventory, network: bool, engines: EngineParts,
                    oom_guard_only: bool = False, keep_logs: bool = False) -> Plan:
    if oom_guard_only:  # `down --oom-guard`: only what `up --oom-guard` did
        return Plan("down", [Phase("down", [oomguard.Remove()],
                                   lambda inv, node: oomguard.down_facts(inv))])
    return Plan("down", [down_phase(inventory, network, engines, keep_logs)])
