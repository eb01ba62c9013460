"""Real Python packages from PyPI for the lab's images, installed once per machine into the
lab's shared cache as a tree whose usr/ becomes a lower layer of every node's /usr.

A virtual environment built with the host's /usr/bin/python3 (the Python the nodes and their
containers run) at `<root>/usr/lib/sparklab/<name>`, so inside a node or container it is
`/usr/lib/sparklab/<name>`. The venv is built in a staging directory and renamed into place
once complete: several labs may start at once, and a half-built tree must never be a layer.
Its console scripts carry the staging path in their shebangs, so images call
`/usr/lib/sparklab/<name>/bin/python -m ...` (lab/sparklab/image/bin).
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sparklab.identity import CACHE_DIR, LabError

PYTHON = "/usr/bin/python3"


@dataclass(frozen=True)
class PipTree:
    name: str          # the venv's folder under /usr/lib/sparklab
    requirement: str   # what pip installs, pinned
    what: str          # for messages: what the lab needs it for
    base: Path         # the cache folder of this package
    root: Path         # the finished tree (its usr/ is the layer)
    marker: Path       # written once the tree is complete

    @property
    def venv_in_node(self) -> str:
        return f"/usr/lib/sparklab/{self.name}"

    def ensure(self) -> Path:
        """The tree, installed on first use."""
        if self.marker.exists():
            return self.root
        self.base.mkdir(parents=True, exist_ok=True)
        with open(self.base / "install.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self.marker.exists():
                self._install()
        return self.root

    def _install(self) -> None:
        self.root.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix="root.", dir=self.root.parent))
        venv = staging / self.venv_in_node.lstrip("/")
        venv.parent.mkdir(parents=True)
        steps = [[PYTHON, "-m", "venv", str(venv)],
                 [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", self.requirement]]
        for argv in steps:
            result = subprocess.run(argv, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                shutil.rmtree(staging, ignore_errors=True)
                raise LabError(f"could not install {self.requirement} for {self.what} "
                               f"({' '.join(argv[-3:])}):\n{result.stderr.strip()[-1500:]}", 1)
        if self.root.exists():  # a half-finished earlier attempt, never a lower layer in use
            shutil.rmtree(self.root)
        staging.rename(self.root)
        self.marker.write_text(f"{self.requirement}\n")

    def lower_layers(self) -> list[Path]:
        """[the tree's usr/] for the nodes' /usr overlay; [] (with a warning) when it cannot be
        installed here: the lab still runs, only the image needing it lacks it."""
        try:
            return [self.ensure() / "usr"]
        except LabError as exc:
            print(f"sparklab: warning: {exc}", file=sys.stderr)
            return []


__all__ = ["CACHE_DIR", "PipTree"]
