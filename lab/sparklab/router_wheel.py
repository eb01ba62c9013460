"""The gateway router's wheel for the lab's nodes: PyPI `sglang-router` (the version sparkctl
pins, orchestrator/phases/gateway_spec.py), downloaded once per machine into the lab's shared
cache as a tree whose usr/ becomes a lower layer of every node's /usr.

Inside a node the file is at /usr/local/share/sparkctl/wheels/<wheel>: sparkctl's installer
looks there before asking pip's index (the lab's nodes reach no index), checks the pinned
sha256 and unpacks it, exactly as on a Spark. Nothing of the router is simulated.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sparklab.identity import CACHE_DIR, LabError

ROUTER_VERSION = "0.3.2"
"""Pinned: the release sparkctl's gateway runs (orchestrator/phases/gateway_spec.py)."""
BASE = CACHE_DIR / "sglang-router" / f"wheelhouse-{ROUTER_VERSION}"
ROOT = BASE / "root"
WHEELS = "usr/local/share/sparkctl/wheels"


def ensure() -> Path:
    """The tree, downloaded on first use (a staging folder renamed into place when complete:
    several labs may start at once)."""
    if (ROOT / WHEELS).is_dir() and any((ROOT / WHEELS).glob("*.whl")):
        return ROOT
    BASE.mkdir(parents=True, exist_ok=True)
    with open(BASE / "install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (ROOT / WHEELS).is_dir() and any((ROOT / WHEELS).glob("*.whl")):
            return ROOT
        staging = Path(tempfile.mkdtemp(prefix="root.", dir=BASE))
        (staging / WHEELS).mkdir(parents=True)
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "--dest", str(staging / WHEELS),
             f"sglang-router=={ROUTER_VERSION}"], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise LabError(f"could not download sglang-router=={ROUTER_VERSION} for the "
                           f"gateway:\n{result.stderr.strip()[-1500:]}", 1)
        shutil.rmtree(ROOT, ignore_errors=True)
        staging.rename(ROOT)
    return ROOT


def router_lower_layers() -> list[Path]:
    """[the wheelhouse tree's usr/], or [] with a warning when PyPI cannot be reached: the lab
    still runs, only `sparkctl gateway up` fails there (no wheel to unpack)."""
    try:
        return [ensure() / "usr"]
    except LabError as exc:
        print(f"sparklab: warning: {exc}", file=sys.stderr)
        return []
