"""The real Ray for the lab's vLLM image, installed once from PyPI into the lab's shared cache.

A virtual environment built with the host's /usr/bin/python3 (the Python the nodes and their
containers run) at `<cache>/ray/root-<version>/usr/lib/sparklab/ray`; that root's usr/ is a lower
layer of every node's /usr, so inside a node or container it is `/usr/lib/sparklab/ray`. The
image's `python3` and `ray` (lab/sparklab/image/bin) use it. Only vLLM is simulated: `ray start`,
the GCS, raylets, placement groups and actors are the real thing, over the lab's fabric.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import tempfile
from pathlib import Path

from sparklab.identity import CACHE_DIR, LabError

RAY_VERSION = "2.60.0"
"""Pinned: the Ray the lab's vLLM image carries (any Ray 2.x that `pip` installs works)."""
BASE = CACHE_DIR / "ray"
RAY_ROOT = BASE / f"root-{RAY_VERSION}"
VENV_IN_NODE = "/usr/lib/sparklab/ray"
_MARKER = BASE / f"complete-{RAY_VERSION}"
PYTHON = "/usr/bin/python3"


def ray_root() -> Path:
    """The tree whose usr/ is a lower layer of each node's /usr; installed on first use."""
    if _MARKER.exists():
        return RAY_ROOT
    BASE.mkdir(parents=True, exist_ok=True)
    with open(BASE / "install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several labs may start at once
        if not _MARKER.exists():
            _install()
    return RAY_ROOT


def _install() -> None:
    staging = Path(tempfile.mkdtemp(prefix="root.", dir=BASE))
    venv = staging / VENV_IN_NODE.lstrip("/")
    venv.parent.mkdir(parents=True)
    steps = [[PYTHON, "-m", "venv", str(venv)],
             [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", f"ray=={RAY_VERSION}"]]
    for argv in steps:
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise LabError(f"could not install Ray {RAY_VERSION} for the lab's vLLM image "
                           f"({' '.join(argv[-3:])}):\n{result.stderr.strip()[-1500:]}", 1)
    if RAY_ROOT.exists():  # a half-finished earlier attempt, never a lower layer in use
        shutil.rmtree(RAY_ROOT)
    staging.rename(RAY_ROOT)
    _MARKER.write_text(f"ray=={RAY_VERSION}\n")


def ray_lower_layers() -> list[Path]:
    """[the Ray tree's usr/] for the nodes' /usr overlay; [] (with a warning) when Ray cannot be
    installed here: the lab still serves TensorRT-LLM, only the vLLM image lacks Ray then."""
    import sys

    try:
        return [ray_root() / "usr"]
    except LabError as exc:
        print(f"sparklab: warning: {exc}", file=sys.stderr)
        return []
