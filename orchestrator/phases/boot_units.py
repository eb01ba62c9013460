"""The names of `launch --persist`'s files on a node, and reading them back (status, down).

Kept apart from phases/persist.py (which writes them) so that down (phases/persist_down.py)
and status read the same names without importing the writer.
"""

from __future__ import annotations

from typing import Any

from orchestrator.paths import CONFIG_DIR
from orchestrator.remote.fact_records import CommandResult

BOOT_DIR = f"{CONFIG_DIR}/boot"
BOOT_SCRIPT = f"{BOOT_DIR}/sparkctl-boot.py"
UNIT_DIR = "/etc/systemd/system"
BOOT_LOG_DIR = "/var/log/sparkctl"
UNIT_PREFIX = "sparkctl-serve-"


def unit_name(server: str) -> str:
    return f"{UNIT_PREFIX}{server}.service"


def unit_path(server: str) -> str:
    return f"{UNIT_DIR}/{unit_name(server)}"


def plan_path(server: str) -> str:
    return f"{BOOT_DIR}/{server}.json"


def server_of_unit(path: str) -> str | None:
    """The server a sparkctl boot unit belongs to (None: not one of ours)."""
    name = path.rsplit("/", 1)[-1]
    if name.startswith(UNIT_PREFIX) and name.endswith(".service"):
        return name[len(UNIT_PREFIX):-len(".service")]
    return None


def units_cmd() -> str:
    """One line per sparkctl boot unit on the node: `<unit> enabled|disabled <engine>` (the
    engine from its boot plan, `?` without one)."""
    return (f"for f in {UNIT_DIR}/{UNIT_PREFIX}*.service; do [ -e \"$f\" ] || continue; "
            "n=${f##*/}; s=$(systemctl is-enabled \"$n\" 2>/dev/null); "
            f"p={BOOT_DIR}/${{n#{UNIT_PREFIX}}}; p=${{p%.service}}.json; "
            "e=$(sed -n 's/^ *\"engine\": \"\\([a-z0-9]*\\)\",*$/\\1/p' \"$p\" 2>/dev/null | head -1); "
            "echo \"$n ${s:-disabled} ${e:-?}\"; done")


def parse_units(answer: CommandResult | None, engines: bool = False) -> dict[str, Any]:
    """units_cmd's answer -> {server: enabled} (engines=True: {server: engine})."""
    out: dict[str, Any] = {}
    for line in (answer.out if answer else "").splitlines():
        parts = line.split()
        server = server_of_unit(parts[0]) if parts else None
        if server:
            out[server] = (parts[2] if len(parts) > 2 else "?") if engines else (
                parts[1:2] == ["enabled"])
    return out


def persistence(units: dict[str, dict[str, bool]], server: str) -> dict[str, Any]:
    """Is `server` persistent? From every node's units ({node: {server: enabled}})."""
    enabled = sorted(node for node, found in units.items() if found.get(server))
    disabled = sorted(node for node, found in units.items() if server in found and not found[server])
    return {"persistent": bool(enabled), "unit": unit_name(server), "nodes": enabled,
            **({"disabled_on": disabled} if disabled else {})}


def launch_marker(server: str) -> str:
    """Made by launch when it starts the unit itself (the server runs: only watch); in /run, so
    a reboot removes it and the unit then brings the server up; `down` removes it with the
    unit (phases/persist_down.py)."""
    return f"/run/sparkctl/launched-{server}"
