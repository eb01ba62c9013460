"""up, switch topology: prove the fabric MTU end to end before anything relies on it.

MTU 9000 is right on a direct cable; through a switch, every switch port on the path must carry
jumbo frames too, and a port left at 1500 drops the big frames silently (small pings still
work; TCP, SSH and NCCL stall once segments fill a frame). So on `fabric.topology: switch`,
after the network phase, every node sends a don't-fragment ping of the full configured size
(`ping -M do -s MTU-28 -c 2 -W 2 -I IF PEER`) to every peer address on each fabric subnet.
Like the mpirun proof it runs after a change in this run, or with --verify.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from orchestrator.commands import join
from orchestrator.core.step import Change, NodeContext, NotVerified, Phase, Step
from orchestrator.errors import SparkctlError
from orchestrator.inventory import Inventory, Node
from orchestrator.phases.netguard import peer_checks

IP_ICMP_HEADERS = 28  # 20 bytes IPv4 + 8 bytes ICMP: a ping of MTU-28 bytes fills one frame
_RESULT = re.compile(r"^sparkctl-mtu (ok|fail) (\S+) (\S+) (\S+)$")


@dataclass(frozen=True)
class PathResult:
    ok: bool
    interface: str
    peer: str
    address: str


def df_ping_argv(mtu: int, interface: str, address: str) -> list[str]:
    """A full-size frame that may not be fragmented: it passes only if every hop carries `mtu`."""
    return ["ping", "-M", "do", "-s", str(mtu - IP_ICMP_HEADERS), "-c", "2", "-W", "2",
            "-I", interface, address]


def mtu_path_cmd(inventory: Inventory, node: Node) -> str:
    """One remote command: every DF ping of this node at once, one result line each."""
    parts = []
    for check in peer_checks(inventory, node):
        ping = join(df_ping_argv(inventory.fabric.mtu, check.interface, check.address))
        tag = join([check.interface, check.peer, check.address])
        parts.append(f"( if {ping} >/dev/null 2>&1; then echo sparkctl-mtu ok {tag}; "
                     f"else echo sparkctl-mtu fail {tag}; fi ) &")
    if not parts:
        return "true"
    return " ".join(parts) + " wait"


def parse_results(output: str) -> list[PathResult]:
    out = []
    for line in output.splitlines():
        match = _RESULT.match(line.strip())
        if match:
            status, interface, peer, address = match.groups()
            out.append(PathResult(status == "ok", interface, peer, address))
    return out


def switch_mtu_message(node: str, interface: str, address: str, mtu: int) -> str:
    """What to tell a user whose switch drops the configured frame size."""
    return (f"frames of {mtu} bytes do not pass between {node} {interface} and {address}: set "
            f"the switch ports to MTU >= {mtu} (jumbo frames), or set fabric.mtu: 1500 in the "
            "inventory")


def failure_message(inventory: Inventory, node: str, results: list[PathResult],
                    expected: int) -> str | None:
    """None when every peer answered at full size; else the error naming each failed path."""
    mtu = inventory.fabric.mtu
    failed = [r for r in results if not r.ok]
    lines = [switch_mtu_message(node, r.interface, r.address, mtu) + f" (peer {r.peer})"
             for r in failed]
    if len(results) < expected:
        lines.append(f"only {len(results)} of {expected} don't-fragment pings reported back")
    if not lines:
        return None
    return (f"{node}: fabric-mtu/df-ping: " + "; ".join(lines) + ". Small pings pass, so the "
            "links are up: a hop on the path (a switch port) carries smaller frames than "
            f"fabric.mtu {mtu}; `sparkctl netcheck` shows the mtu-ping rows")


class MtuPath(Step):
    name = "df-ping"
    kind = "verify"

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        if not ctx.shared.changed_steps and not ctx.options.verify:
            return NotVerified("not re-run: nothing changed (use --verify to prove the MTU anyway)")
        inventory, node = ctx.inventory, ctx.node
        expected = len(peer_checks(inventory, node))
        result = ctx.run(mtu_path_cmd(inventory, node), timeout=60,
                         display=f"don't-fragment ping at MTU {inventory.fabric.mtu} to every peer")
        results = parse_results(result.stdout)
        error = failure_message(inventory, node.name, results, expected)
        if error:
            raise SparkctlError(error)
        return (f"{inventory.fabric.mtu}-byte frames pass unfragmented to "
                f"{len(results)} peer address(es)")


def facts(inventory: Inventory, node: Node) -> dict[str, Any]:
    return {}


def phase(inventory: Inventory) -> Phase:
    return Phase("fabric-mtu", [MtuPath()], facts)
