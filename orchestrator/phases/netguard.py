"""Node-side commands of the network phase: validate + install the netplan file, apply it under a
rollback guard, confirm it (or roll back).

The guard itself is orchestrator/node/netguard.py, sent on stdin (never on a command line). It
follows `netplan try`: the new config stays only if the controller confirms it in time, after a
fresh management connection worked and every fabric peer answered.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from orchestrator.commands import join, quote
from orchestrator.inventory import Inventory, Node
from orchestrator.node import script
from orchestrator.paths import NETPLAN_BACKUP, NETPLAN_FILE, STATE_DIR

ABSENT_MARKER = f"{STATE_DIR}/netplan-backup.absent"
ROLLED_BACK_PATH = f"{STATE_DIR}/netplan-rolled-back.json"
CONFIRMED_SHA_PATH = f"{STATE_DIR}/netplan-confirmed.sha256"
GUARD_DIR = f"{STATE_DIR}/netguard"
GUARD_SCRIPT = f"{GUARD_DIR}/netguard.py"
ARMED_PATH = f"{GUARD_DIR}/armed.json"
DECIDED_PATH = f"{GUARD_DIR}/decided"
SBIN_PATH = "PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin"
"""Appended, not prepended: the node's own order (e.g. /usr/local first) must win."""

GUARD_SECONDS = 60
"""Without a confirmation within this time the node restores its previous netplan config."""
PING_SECONDS = 20
"""How long the confirmation waits for each peer to answer (links may take a moment to come up)."""


@cache
def guard_script() -> str:
    return script("netguard.py")


def write_netplan_cmd() -> str:
    """stdin -> temp root -> `netplan generate` (validation) -> rollback point -> install 0600.

    The install goes through the node-side ledger (orchestrator/node/ledger.py): a file of the
    user's at our path is kept as the original (down puts it back), and the rollback point the
    guard restores is what is on disk now, unless that is sparkctl's own unconfirmed file from an
    unfinished run (then the point that run saved stays). Never a marker left by an older run.
    """
    from orchestrator.phases.files import ledger_cmd

    new = "$tmp/etc/netplan/40-sparkctl-fabric.yaml"
    install = ledger_cmd("install", "__NEW__", NETPLAN_FILE, "600", NETPLAN_BACKUP, ABSENT_MARKER,
                         CONFIRMED_SHA_PATH).replace("__NEW__", f'"{new}"')
    lines = [
        "set -e",
        SBIN_PATH,
        "umask 077",
        'tmp=$(mktemp -d /tmp/sparkctl-netplan.XXXXXX)',
        "trap 'rm -rf \"$tmp\"' EXIT",
        'mkdir -p "$tmp/etc/netplan"',
        f'cat > "{new}"',
        f'if ! out=$(netplan generate --root-dir "$tmp" 2>&1); then '
        f'echo "netplan generate rejected the rendered {NETPLAN_FILE}: $out" >&2; exit 3; fi',
        f"mkdir -p {quote(STATE_DIR)} && chmod 755 {quote(STATE_DIR)}",
        "mkdir -p /etc/netplan",
        install,
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class ArmConfig:
    """What the guard needs to undo an apply: addresses sparkctl adds, MTUs before, deadline."""

    added: list[tuple[str, str]] = field(default_factory=list)
    previous_mtu: dict[str, int | None] = field(default_factory=dict)
    seconds: int = GUARD_SECONDS

    def to_json(self) -> str:
        return json.dumps({"added": [list(a) for a in self.added], "previous_mtu": self.previous_mtu,
                           "seconds": self.seconds}, sort_keys=True)


def guard_cmd(mode: str, config: dict[str, Any] | str) -> str:
    """Run the guard script from stdin in `mode` (confirm, abort)."""
    text = config if isinstance(config, str) else json.dumps(config, sort_keys=True)
    return SBIN_PATH + "; " + join(["python3", "-", mode, text])


def arm_and_apply_cmd(config: ArmConfig) -> str:
    """Save the guard (from stdin) on the node, start it detached, then `netplan apply`."""
    return (
        f"{SBIN_PATH}; mkdir -p {quote(GUARD_DIR)} && chmod 700 {quote(GUARD_DIR)} && "
        f"cat > {quote(GUARD_SCRIPT)} && chmod 700 {quote(GUARD_SCRIPT)} && "
        + join(["python3", GUARD_SCRIPT, "arm", config.to_json()])
    )


@dataclass(frozen=True)
class PeerCheck:
    interface: str
    peer: str
    address: str

    def to_json(self) -> dict[str, str]:
        return {"interface": self.interface, "peer": self.peer, "address": self.address}


def peer_checks(inventory: Inventory, node: Node) -> list[PeerCheck]:
    """Every other node's fabric address inside the subnet of one of this node's interfaces.

    Works for b2b, switch and ring alike: in a ring each link is its own subnet.
    """
    checks: list[PeerCheck] = []
    for iface in inventory.fabric.interfaces:
        network = ipaddress.IPv4Interface((node.addresses or {})[iface]).network
        for other in inventory.nodes:
            if other.name == node.name:
                continue
            for cidr in (other.addresses or {}).values():
                ip = ipaddress.IPv4Interface(cidr).ip
                if ip in network:
                    checks.append(PeerCheck(iface, other.name, str(ip)))
    return checks


def confirm_config(checks: list[PeerCheck], sha: str, seconds: int = PING_SECONDS) -> dict[str, Any]:
    return {"checks": [c.to_json() for c in checks], "sha": sha, "seconds": seconds}


def parse_answer(stdout: str) -> dict[str, Any]:
    """The guard prints one JSON object as its last line."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return {}


def describe_rollback(rollback: dict[str, Any] | None) -> str:
    if not rollback:
        return "the rollback guard reported nothing"
    text = str(rollback.get("restored", "rolled back"))
    if rollback.get("apply_rc"):
        text += f"; but `netplan apply` of the old config exited {rollback['apply_rc']}: " + str(
            rollback.get("apply_err", "")
        ).strip()[-200:]
    return text
