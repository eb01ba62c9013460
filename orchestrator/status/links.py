"""Each fabric link's negotiated speed, read with `ethtool IF` in status's one facts round trip
(the same command netcheck's speed check runs), for `status --json` and the dashboard: a
ConnectX-7 port says 200000 Mb/s; a link that came up slower says so. Judging it stays
netcheck's (ethtool can say 200G on a degraded link: `netcheck --deep` measures it)."""

from __future__ import annotations

import re
from typing import Any

from orchestrator.commands import join
from orchestrator.inventory import Inventory
from orchestrator.remote.gathered import NodeFacts

SPEED = re.compile(r"Speed:\s*(\d+)\s*Mb/s")


def speed_commands(inventory: Inventory) -> dict[str, str]:
    return {f"ethtool:{i}": join(["ethtool", i]) for i in inventory.fabric.interfaces}


def attach_speeds(nodes: dict[str, dict[str, Any]], facts: dict[str, NodeFacts]) -> None:
    """`speed_mbps` on every reached node's fabric interface that exists (None: ethtool said
    no speed, as for a link down)."""
    for name, node_facts in facts.items():
        for iface, entry in ((nodes[name].get("network") or {}).get("interfaces") or {}).items():
            if entry.get("state") == "missing":
                continue
            found = SPEED.search(node_facts.output(f"ethtool:{iface}"))
            entry["speed_mbps"] = int(found.group(1)) if found else None
