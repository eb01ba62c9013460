"""The real Ray for the lab's vLLM image, installed once from PyPI into the lab's shared cache.

A virtual environment at `<cache>/ray/root-<version>/usr/lib/sparklab/ray` (sparklab/pip_tree.py);
that root's usr/ is a lower layer of every node's /usr, so inside a node or container it is
`/usr/lib/sparklab/ray`. The image's `python3` and `ray` (lab/sparklab/image/bin) use it. Only
vLLM is simulated: `ray start`, the GCS, raylets, placement groups and actors are the real
thing, over the lab's fabric.
"""

from __future__ import annotations

from pathlib import Path

from sparklab.pip_tree import CACHE_DIR, PipTree

RAY_VERSION = "2.60.0"
"""Pinned: the Ray the lab's vLLM image carries (any Ray 2.x that `pip` installs works)."""
BASE = CACHE_DIR / "ray"
RAY = PipTree("ray", f"ray=={RAY_VERSION}", "the lab's vLLM image", BASE,
              BASE / f"root-{RAY_VERSION}", BASE / f"complete-{RAY_VERSION}")
RAY_ROOT = RAY.root
VENV_IN_NODE = RAY.venv_in_node


def ray_root() -> Path:
    """The tree whose usr/ is a lower layer of each node's /usr; installed on first use."""
    return RAY.ensure()


def ray_lower_layers() -> list[Path]:
    """[the Ray tree's usr/] for the nodes' /usr overlay; [] (with a warning) when Ray cannot be
    installed here: the lab still serves TensorRT-LLM, only the vLLM image lacks Ray then."""
    return RAY.lower_layers()
