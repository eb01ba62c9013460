"""Per-node memory for the lab: a cgroup v1 memory cgroup per node, and the node's /proc/meminfo.

A DGX Spark has 128 GB of unified memory; a lab node gets a real memory cgroup with a small
limit (`lab up --node-memory 2G`) and presents it to everything inside the node *scaled up* by
`--memory-scale` (default 64: 2 GiB real look like 128 GiB), so recipes keep their real numbers
while the lab uses little of the host. The simulated engine allocates its per-node estimate
divided by the same factor, so loading a model really fills the node's cgroup.

Where: the cgroup is created under the lab process's OWN memory cgroup (`/proc/self/cgroup`),
as `<own>/sparklab<ID>/<node>`, so the host's (and any supervisor's) limits still apply to the
lab; `lab down` removes it. The node's unshare process joins it before exec, so every process
of the node (sshd, containers, the engine) is charged to it; `lab exec`/faults join it too.

/proc/meminfo: real tools read /proc/meminfo, so each node shows its own there. The node's
PID 1 (node_supervisor.py) reads the cgroup (bound read-only at /run/sparklab/memcg by the node
init) every 0.5 s and rewrites /run/sparklab/meminfo in place with fixed-width numbers (one
pwrite, the length never changes, so a reader never sees a torn or empty file), bind-mounted
over /proc/meminfo in the node; the docker shim binds the same file over /proc/meminfo in
containers (as on a real node, where a container's /proc/meminfo is the node's).
Headroom: the cgroup's hard limit is the node's memory plus PROCESS_HEADROOM, not shown in
/proc/meminfo. The lab's own small processes (a `docker inspect` through the Python docker shim,
sshd, the guard) are not scaled down: 20 MB real looks like 1.3 GB at scale 64, where on a Spark
it is nothing. Without the headroom, memory squeezed to within a GB of the node's total (all the
memory guard must see) leaves a few MiB real, and the next such process makes the kernel's OOM
killer end the squeezer before the guard can see MemAvailable low.
Figures (limit = the node's memory, without the headroom): MemTotal = limit, MemFree = limit -
usage, MemAvailable = MemFree + the cgroup's file
pages (reclaimable page cache), Cached = the cgroup's cache; each times the scale.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

from sparklab.identity import LabError, LabIdentity

CGROUP_MOUNT = Path("/sys/fs/cgroup/memory")
DEFAULT_NODE_MEMORY = 2 * 1024**3
DEFAULT_SCALE = 64
PROCESS_HEADROOM = 64 * 1024**2  # real bytes above the node's memory before the OOM killer acts
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'2G', '512M', '1.5GiB', '1048576' -> bytes."""
    match = _SIZE.match(text)
    if not match:
        raise LabError(f"not a size: {text!r} (e.g. 2G, 512M)", 2)
    factor = 1024 ** "BKMGT".index((match.group(2) or "B").upper())
    return int(float(match.group(1)) * factor)


def own_cgroup() -> str:
    """This process's memory cgroup path (relative to the memory hierarchy's root)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return path
    raise LabError("no cgroup v1 memory controller here (/proc/self/cgroup): the lab's memory "
                   "accounting needs one", 1)


def lab_cgroup(ident: LabIdentity, parent: str | None = None) -> Path:
    base = parent if parent is not None else own_cgroup()
    return CGROUP_MOUNT / base.lstrip("/") / f"sparklab{ident.lab_id}"


def node_cgroup(root: Path, node: str) -> Path:
    return root / node


def available() -> bool:
    return (CGROUP_MOUNT / "memory.limit_in_bytes").exists()


def create(root: Path, nodes: list[str], limit: int) -> None:
    if root.name != root.name.lower() or not root.name.startswith("sparklab"):
        raise LabError(f"refusing to create cgroup {root}", 1)
    root.mkdir(exist_ok=True)
    with contextlib.suppress(OSError):
        (root / "memory.use_hierarchy").write_text("1\n")
    for node in nodes:
        path = node_cgroup(root, node)
        path.mkdir(exist_ok=True)
        # the headroom is for the lab's unscaled process overhead (see the module docstring)
        (path / "memory.limit_in_bytes").write_text(f"{limit + PROCESS_HEADROOM}\n")


def join(path: Path, pid: int = 0) -> None:
    """Move `pid` (0: the caller) into the node's cgroup."""
    (path / "cgroup.procs").write_text(f"{pid or os.getpid()}\n")


def joiner(path: Path | None):  # type: ignore[no-untyped-def]
    """A preexec_fn that joins `path` (None, or a cgroup that is gone: do nothing)."""
    def preexec() -> None:
        if path is not None:
            with contextlib.suppress(OSError):
                join(path)
    return preexec


def remove(root: Path, timeout: float = 5.0) -> list[str]:
    """rmdir the node cgroups, then the lab's (their processes must have been killed)."""
    if not root.name.startswith("sparklab") or not root.is_dir():
        return []
    removed = []
    deadline = time.monotonic() + timeout
    for path in [*sorted(p for p in root.iterdir() if p.is_dir()), root]:
        while True:
            try:
                path.rmdir()
                removed.append(f"cgroup {path}")
                break
            except OSError:
                if time.monotonic() > deadline:
                    removed.append(f"cgroup {path} (still busy, left)")
                    break
                time.sleep(0.05)
    return removed


def usage(path: Path) -> dict[str, int]:
    """The node's cgroup figures in real bytes: limit (the hard one, headroom included), usage,
    cache, file pages."""
    stat = {}
    for line in (path / "memory.stat").read_text().splitlines():
        key, _, value = line.partition(" ")
        stat[key] = int(value)
    return {"limit": int((path / "memory.limit_in_bytes").read_text()),
            "usage": int((path / "memory.usage_in_bytes").read_text()),
            "cache": stat.get("total_cache", stat.get("cache", 0)),
            "file": stat.get("total_active_file", 0) + stat.get("total_inactive_file", 0)}
