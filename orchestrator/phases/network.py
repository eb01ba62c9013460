"""Phase "network": the fabric netplan file, applied with automatic rollback.

Three steps, in lock-step over the nodes:
  netplan  render /etc/netplan/40-sparkctl-fabric.yaml, compare by sha256, validate it with
           `netplan generate` in a temp root, keep a backup, install it 0600 (one command)
  apply    when the live addresses/MTU differ: arm a detached rollback guard, `netplan apply`
  confirm  for nodes applied in this run (or with a guard still waiting from an earlier run):
           a FRESH management SSH connection, then every fabric peer must answer a ping; then
           the guard is confirmed, otherwise the node rolls back at once and the step fails.
The management interface is never written: only the inventory's fabric interfaces are in the file.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from orchestrator.core.step import (
    Change,
    NodeContext,
    NotVerified,
    Outcome,
    Phase,
    Step,
    Unchanged,
)
from orchestrator.errors import SparkctlError
from orchestrator.inventory import Inventory, Node
from orchestrator.paths import LEDGER, NETPLAN_BACKUP, NETPLAN_FILE
from orchestrator.phases import netguard
from orchestrator.phases.files import check_written, ownership
from orchestrator.phases.netguard import (
    ABSENT_MARKER,
    ARMED_PATH,
    CONFIRMED_SHA_PATH,
    DECIDED_PATH,
    ROLLED_BACK_PATH,
    ArmConfig,
)
from orchestrator.remote.facts import File, FileInfo, request_of
from orchestrator.remote.node_facts import LINKS, NETPLAN_FILES, LinkTable
from orchestrator.remote.transport import SSHTransport, Transport
from orchestrator.render import render, sha256, unified_diff


def phase(inventory: Inventory) -> Phase:
    return Phase("network", [NetplanFile(), NetplanApply(), ConfirmFabric()], facts=network_request)


# The files the network phase reads (typed facts: remote/facts.py), with their text or not.
FILES = {path: File(path, content) for path, content in (
    (NETPLAN_FILE, True), (NETPLAN_BACKUP, False), (ABSENT_MARKER, False), (ROLLED_BACK_PATH, True),
    (CONFIRMED_SHA_PATH, True), (ARMED_PATH, False), (DECIDED_PATH, False), (LEDGER, True))}


def network_request(inventory: Inventory, node: Node) -> dict[str, Any]:
    return request_of(*FILES.values(), NETPLAN_FILES, LINKS)


def render_netplan(inventory: Inventory, node: Node) -> str:
    addresses = node.addresses or {}
    interfaces = [{"name": name, "address": addresses[name]} for name in inventory.fabric.interfaces]
    return render("netplan/fabric.yaml.j2", node=node.name, cluster=inventory.cluster.name,
                  interfaces=interfaces, mtu=inventory.fabric.mtu)


def _file(ctx: NodeContext, path: str) -> FileInfo:
    return FILES[path].read(ctx.facts) or FileInfo(exists=False)


def conflicting_files(ctx: NodeContext) -> list[str]:
    """Other netplan files that define our fabric interfaces: reported, never overwritten."""
    ours = set(ctx.inventory.fabric.interfaces)
    out = []
    for path, fact in sorted(NETPLAN_FILES.read(ctx.facts).items()):
        if path == NETPLAN_FILE:
            continue
        shared = sorted(ours & set(fact.interfaces))
        if shared:
            out.append(f"{path} also defines {', '.join(shared)}")
        elif fact.error:
            out.append(f"{path} could not be read as YAML ({fact.error[:80]})")
    return out


def _warnings(ctx: NodeContext) -> str:
    conflicts = conflicting_files(ctx)
    if not conflicts:
        return ""
    return ("; WARNING: " + "; ".join(conflicts)
            + " (netplan merges them with ours; remove the fabric interfaces from those files)")


class NetplanFile(Step):
    name = "netplan"

    def check(self, ctx: NodeContext) -> Outcome:
        content = render_netplan(ctx.inventory, ctx.node)
        fact = _file(ctx, NETPLAN_FILE)
        same = fact.exists and fact.sha256 == sha256(content)
        if same and fact.mode == 0o600:
            return Unchanged(f"{NETPLAN_FILE} up to date{_warnings(ctx)}")
        if same:
            return Change(f"chmod 600 {NETPLAN_FILE}{_warnings(ctx)}",
                          diff=f"{NETPLAN_FILE}: mode {fact.mode or 0:o} -> 600\n",
                          payload=content)
        diff = unified_diff(NETPLAN_FILE, fact.content if fact.exists else None, content)
        verb = "update" if fact.exists else "write"
        kept = ""
        if (fact.exists and FILES[LEDGER].read(ctx.facts) is not None
                and ownership(ctx, NETPLAN_FILE) != "ours"):
            verb = "replace"
            kept = "; the file there was not written by sparkctl: it is kept, `down --network` puts it back"
        return Change(f"{verb} {NETPLAN_FILE} (validated with netplan generate){kept}{_warnings(ctx)}",
                      diff=diff, payload=content)

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        content = change.payload
        result = ctx.run(netguard.write_netplan_cmd(), stdin=content, sudo=True,
                         display=f"validate and install {NETPLAN_FILE}")
        if result.exit_status == 3:
            raise SparkctlError(
                f"{ctx.node.name}: network/netplan: {result.stderr.strip()[-600:]}\n"
                "Nothing was installed; check fabric.interfaces, the addresses and fabric.mtu "
                "in the inventory"
            )
        check_written(result, ctx.node.name, "network/netplan")
        return None


def live_drift(ctx: NodeContext) -> tuple[list[str], ArmConfig]:
    """What differs between the live fabric links and the inventory, and how to undo an apply."""
    links = (LINKS.read(ctx.facts) or LinkTable({})).links
    mtu = ctx.inventory.fabric.mtu
    drift: list[str] = []
    added: list[tuple[str, str]] = []
    previous_mtu: dict[str, int | None] = {}
    for iface in ctx.inventory.fabric.interfaces:
        link = links.get(iface)
        if link is None:
            raise SparkctlError(f"{ctx.node.name}: fabric interface {iface} does not exist "
                                "(preflight lists the interfaces this node has)")
        address = (ctx.node.addresses or {})[iface]
        previous_mtu[iface] = link.mtu
        if address not in link.addresses:
            drift.append(f"{iface}: add {address} (has {', '.join(link.addresses) or 'none'})")
            added.append((iface, address))
        if link.mtu != mtu:
            drift.append(f"{iface}: mtu {link.mtu} -> {mtu}")
    return drift, ArmConfig(added=added, previous_mtu=previous_mtu, seconds=netguard.GUARD_SECONDS)


def _earlier_rollback(ctx: NodeContext) -> str:
    fact = _file(ctx, ROLLED_BACK_PATH)
    if not fact.exists:
        return ""
    try:
        reason = json.loads(fact.content or "{}").get("reason", "?")
    except json.JSONDecodeError:
        reason = "?"
    return f"; note: an earlier apply was rolled back on this node ({reason})"


def guard_pending(ctx: NodeContext) -> bool:
    return _file(ctx, ARMED_PATH).exists and not _file(ctx, DECIDED_PATH).exists


def _mark_for_confirmation(ctx: NodeContext) -> None:
    ctx.shared.netplan_to_confirm.add(ctx.node.name)


class NetplanApply(Step):
    name = "apply"

    def check(self, ctx: NodeContext) -> Outcome:
        drift, config = live_drift(ctx)
        if not drift:
            if guard_pending(ctx):
                if not ctx.options.dry_run:
                    _mark_for_confirmation(ctx)
                return Unchanged("live addresses and MTU match; a rollback guard from an earlier, "
                                 "interrupted run is waiting and is confirmed below")
            return Unchanged(f"live addresses and MTU {ctx.inventory.fabric.mtu} match the "
                             f"inventory{_earlier_rollback(ctx)}")
        return Change(f"netplan apply ({'; '.join(drift)}), rolled back automatically unless "
                      f"confirmed within {config.seconds}s{_earlier_rollback(ctx)}",
                      diff="\n".join(drift) + "\n", payload=config,
                      # (the guard script itself goes on stdin: node/netguard.py)
                      commands=(netguard.arm_and_apply_cmd(config),))

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        result = ctx.run(change.commands[0], stdin=netguard.guard_script(),
                         sudo=True, timeout=180, display="arm rollback guard; netplan apply")
        answer = netguard.parse_answer(result.stdout)
        if result.exit_status != 0 or not answer.get("applied"):
            if not answer:
                result.check()
            raise SparkctlError(
                f"{ctx.node.name}: network/apply: {answer.get('error', 'netplan apply failed')}; "
                f"rolled back: {netguard.describe_rollback(answer.get('rollback'))}. "
                f"See `journalctl -u systemd-networkd` and {NETPLAN_FILE} on the node"
            )
        _mark_for_confirmation(ctx)
        return None


def open_fresh_transport(ctx: NodeContext) -> tuple[Transport, bool]:
    """A NEW management connection (proves the controller still reaches the node after apply).

    Returns (transport, opened): a local or test transport is reused and must not be closed.
    """
    current = ctx.transport
    if not isinstance(current, SSHTransport):
        assert current is not None
        return current, False
    from orchestrator.remote.connect import open_ssh

    return open_ssh(ctx.inventory, ctx.node, current.sudo_password, False, threading.Lock()), True


class ConfirmFabric(Step):
    name = "confirm"
    kind = "verify"

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        if ctx.node.name not in ctx.shared.netplan_to_confirm:
            return NotVerified("nothing applied in this run; nothing to confirm")
        checks = netguard.peer_checks(ctx.inventory, ctx.node)
        sha = sha256(render_netplan(ctx.inventory, ctx.node))
        command = netguard.guard_cmd("confirm", netguard.confirm_config(checks, sha))
        try:
            fresh, opened = open_fresh_transport(ctx)
        except SparkctlError as exc:
            raise SparkctlError(
                f"{ctx.node.name}: network/confirm: a fresh management connection failed after "
                f"netplan apply ({exc}); {self._abort(ctx, 'fresh management connection failed')}"
            ) from None
        try:
            result = fresh.run(command, stdin=netguard.guard_script(), sudo=True,
                               timeout=netguard.PING_SECONDS + 120,
                               display="ping fabric peers; confirm or roll back")
        finally:
            if opened:
                fresh.close()
        answer = netguard.parse_answer(result.stdout)
        outcome = answer.get("outcome")
        if outcome == "confirmed":
            peers = ", ".join(f"{c.peer} on {c.interface}" for c in checks) or "no peers"
            return f"confirmed: fresh management connection ok; peers answer: {peers}"
        if outcome == "rolled-back":
            failed = "; ".join(
                f"{f['peer']} unreachable on {f['interface']} ({f['address']})"
                for f in answer.get("failures", [])
            ) or "rollback requested"
            raise SparkctlError(
                f"{ctx.node.name}: network/confirm: rolled back: {failed} from {ctx.node.name}; "
                f"the node is back on its previous network config "
                f"({netguard.describe_rollback(answer.get('rollback'))}). Check the cables "
                "(`sparkctl netcheck`, ibdev2netdev) and the fabric addresses in the inventory"
            )
        if outcome == "late":
            raise SparkctlError(
                f"{ctx.node.name}: network/confirm: too late, the rollback guard already rolled "
                f"back ({netguard.describe_rollback(answer.get('rollback'))}); run `sparkctl up` again"
            )
        result.check()
        raise SparkctlError(f"{ctx.node.name}: network/confirm: no answer from the guard: "
                            f"{result.stdout[-300:]!r} {result.stderr[-300:]!r}")

    @staticmethod
    def _abort(ctx: NodeContext, reason: str) -> str:
        """Roll back now over the old connection; if that is gone too, the guard's deadline does it."""
        try:
            result = ctx.run(netguard.guard_cmd("abort", {"reason": reason}),
                             stdin=netguard.guard_script(), sudo=True, timeout=120,
                             display="roll back netplan now")
            answer = netguard.parse_answer(result.stdout)
            return "rolled back: " + netguard.describe_rollback(answer.get("rollback"))
        except SparkctlError:
            return (f"its rollback guard restores the previous network config within "
                    f"{netguard.GUARD_SECONDS}s")


def fabric_link_problem(ctx: NodeContext) -> tuple[str, str, str] | None:
    """(address, interface, what is wrong) when the node's rendezvous address (the one peers
    reach it at over the fabric) cannot be used now: interface gone, no link, address missing.
    None when it is fine or the links were not gathered (the engine's own start will tell)."""
    table = LINKS.read(ctx.facts)
    if table is None or table.error is not None:
        return None
    ip = ctx.inventory.mpi_address(ctx.node)
    for iface, cidr in (ctx.node.addresses or {}).items():
        if cidr.split("/")[0] != ip:
            continue
        link = table.links.get(iface)
        if link is None:
            return ip, iface, f"{iface} does not exist"
        if not link.carrier or not link.up:
            return ip, iface, f"{iface} has no link ({link.operstate}: cable out or peer down?)"
        if cidr not in link.addresses:
            return ip, iface, f"{iface} lacks its address {cidr}"
        return None
    return None
