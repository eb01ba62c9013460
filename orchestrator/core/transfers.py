"""Downloads and copies in progress, for `sparkctl dashboard` running in another process.

The models phase of a `launch` (its `hf download` on each node, its fan-out copy from the head
to each peer) keeps one small JSON record per transfer in this machine's state directory
(`transfers/CLUSTER/`), rewritten at most once a second while bytes move and removed when the
transfer ends, whatever its outcome. The dashboard reads them at each look: no round trip to
the nodes, nothing added to their load. A record holds no secret: the node, the repository,
bytes, rate and the tool's own last progress line. A record whose process is gone (a launch
killed with SIGKILL) is not shown, and the next launch of the cluster removes it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from orchestrator.state import state_dir

EVERY = 1.0  # seconds between two writes of one record (the last one always written)
PERCENT = re.compile(r"(\d{1,3}(?:\.\d+)?)%")


@dataclass(frozen=True)
class Transfer:
    kind: str                        # "download" (hf download on `node`) or "copy" (to `node`)
    node: str
    what: str                        # the repository, or "spark-a -> spark-b"
    pid: int                         # the sparkctl process that runs it
    started: float                   # Unix times
    updated: float
    done_bytes: int | None = None
    total_bytes: int | None = None
    bytes_per_s: float | None = None
    percent: float | None = None
    line: str = ""                   # the tool's last progress line, as it printed it

    @property
    def key(self) -> str:
        return f"{self.kind} {self.node} {self.what}"


def directory_of(cluster: str, base: Path | None = None) -> Path:
    return (base or state_dir()) / "transfers" / re.sub(r"[^A-Za-z0-9._-]", "_", cluster)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _load(path: Path) -> Transfer | None:
    try:
        doc = json.loads(path.read_text())
        return Transfer(**doc) if isinstance(doc, dict) else None
    except (OSError, ValueError, TypeError):
        return None


def read_transfers(cluster: str, base: Path | None = None) -> list[Transfer]:
    """The transfers of `cluster` under way now (oldest first); unreadable records and those
    of a process that is gone are left out."""
    directory = directory_of(cluster, base)
    try:
        paths = sorted(directory.glob("*.json"))
    except OSError:
        return []
    found = [t for t in map(_load, paths) if t is not None and _alive(t.pid)]
    return sorted(found, key=lambda t: (t.started, t.key))


class Transfers:
    """The records of one phase's transfers: `update` as progress comes, `close` at the end
    (in a `finally`: every record this object wrote is removed)."""

    def __init__(self, cluster: str, base: Path | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.directory = directory_of(cluster, base)
        self._clock = clock
        self._lock = threading.Lock()
        self._records: dict[str, tuple[Path, Transfer]] = {}
        self._sweep()

    def _sweep(self) -> None:
        """Records a killed run left behind."""
        with contextlib.suppress(OSError):
            for path in self.directory.glob("*.json"):
                found = _load(path)
                if found is None or not _alive(found.pid):
                    path.unlink(missing_ok=True)

    def update(self, kind: str, node: str, what: str, *, done: int | None = None,
               total: int | None = None, rate: float | None = None, line: str = "") -> None:
        """Progress of one transfer (started by its first update); written when a second has
        passed since the last write, or when it reached its total. A failure to write is no
        failure of the transfer: the dashboard only misses its progress."""
        now = self._clock()
        name = hashlib.sha256(f"{kind} {node} {what}".encode()).hexdigest()[:16]
        found = PERCENT.findall(line)
        percent = (100.0 * done / total if done is not None and total else
                   float(found[-1]) if found else None)
        finished = (done is not None and total is not None and done >= total) or \
            (percent is not None and percent >= 100)
        with self._lock:
            path, before = self._records.get(name, (self.directory / f"{name}.json", None))
            if before is None:
                before = Transfer(kind, node, what, os.getpid(), now, now)
            elif now - before.updated < EVERY and not finished:
                return
            record = replace(before, updated=now, done_bytes=done, total_bytes=total,
                             bytes_per_s=rate, percent=percent, line=line.strip()[-160:])
            self._records[name] = (path, record)
            with contextlib.suppress(OSError):
                self.directory.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(asdict(record)))
                os.replace(tmp, path)

    def close(self) -> None:
        with self._lock:
            for path, _ in self._records.values():
                with contextlib.suppress(OSError):
                    path.unlink(missing_ok=True)
            self._records.clear()
