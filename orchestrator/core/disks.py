"""Full disks and read-only filesystems, named: node-side answers and facts in words.

Every command that writes on a node can hit them; they are judged here, below the phases, so
the executor, the lock and the runner name the cause (node, path, free space) the same way.
"""

from __future__ import annotations

import errno
from typing import Any

from orchestrator.remote.gathered import NodeFacts

__all__ = ["MIN_FREE_BYTES", "describe_os_error", "format_bytes", "space_problems"]


def describe_os_error(answer: dict[str, Any]) -> str:
    """{"error", "errno", "path", "free_bytes"} from a node-side script, in words."""
    path = answer.get("path") or "?"
    free = answer.get("free_bytes")
    room = f" ({format_bytes(free)} free)" if isinstance(free, int) else ""
    if answer.get("errno") == errno.ENOSPC:
        return f"no space left on the filesystem of {path}{room}: free some space on the node"
    if answer.get("errno") == errno.EROFS:
        return f"the filesystem of {path} is read-only: remount it read-write"
    return f"{path}: {answer.get('error')}{room}"


MIN_FREE_BYTES = 1_000_000
"""Less free than this where sparkctl writes (state, config, netplan) counts as a full disk."""


def space_problems(facts: NodeFacts) -> list[str]:
    """A full disk or read-only filesystem where sparkctl writes, named with path and free space
    (from the `space` fact every facts gathering answers)."""
    problems: list[str] = []
    seen: set[str] = set()
    for path, entry in sorted(facts.space.items()):
        checked = entry.checked
        if checked in seen:
            continue
        free = entry.free_bytes
        if entry.readonly:
            problems.append(f"the filesystem of {path} ({checked}) is read-only")
            seen.add(checked)
        elif isinstance(free, int) and free < MIN_FREE_BYTES:
            problems.append(f"disk full: {format_bytes(free)} free on the filesystem of {path} "
                            f"({checked})")
            seen.add(checked)
    return problems


def format_bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"
