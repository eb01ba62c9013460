"""`--inventory`: which inventory a command acts on, loaded and checked, and how it was chosen.

Apart from the runner (core/runner.py, which re-exports these) so a command can load its
inventory before importing the machinery that runs a plan: `up` opens its connections then
(core/speculate.py) while the rest is still being imported.
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.errors import InputError
from orchestrator.inventory import Inventory

IMPLICIT: dict[str, str] = {}
"""Inventory source -> how it was chosen when the user did not name it (no --inventory, no
$SPARKCTL_INVENTORY): mutating commands then say which cluster they act on, and refuse --yes
off a terminal (docs/inventory.md)."""


def load_inventory_option(option: str | None) -> tuple[Inventory, Path]:
    from orchestrator.inventory_checks import load_inventory, resolve_inventory_path
    from orchestrator.state import state_dir

    path = resolve_inventory_path(option, state_dir())
    if not path.exists():
        hint = "" if option else (
            " (no --inventory given, $SPARKCTL_INVENTORY unset and no earlier `up` remembered; "
            "pass --inventory FILE, or run `sparkctl lab up` for a simulated cluster)"
        )
        raise InputError(f"inventory file not found: {path}{hint}")
    inventory = load_inventory(path)
    if not option and not os.environ.get("SPARKCTL_INVENTORY"):
        remembered = (state_dir() / "last-inventory")
        try:
            from_up = remembered.read_text().strip() == str(path)
        except OSError:
            from_up = False
        IMPLICIT[inventory.source] = ("remembered from the last `up` on this account" if from_up
                                      else "the default in the current directory")
    return inventory, path


def implicit_cluster(inventory: Inventory) -> str | None:
    """'cluster NAME (head H, inventory F; how it was chosen)' when the user did not name it."""
    origin = IMPLICIT.get(inventory.source)
    if origin is None:
        return None
    return (f"cluster {inventory.cluster.name} (head {inventory.head_name}, inventory "
            f"{inventory.source}; {origin})")
