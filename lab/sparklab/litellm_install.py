"""The real LiteLLM proxy for the lab's gateway image, installed once from PyPI into the lab's
shared cache (`<cache>/litellm/<version>/`, sparklab/pip_tree.py).

Inside a node or container it is `/usr/lib/sparklab/litellm`; the image's `litellm`
(lab/sparklab/image/bin/litellm) runs its proxy CLI. Nothing of the proxy is simulated: the
gateway in the lab is LiteLLM's own server, routing, retries and cooldowns.
"""

from __future__ import annotations

from pathlib import Path

from sparklab.pip_tree import CACHE_DIR, PipTree

LITELLM_VERSION = "1.80.11"
"""Pinned: the PyPI release of the image sparkctl pins (ghcr.io/berriai/litellm:v1.80.11-stable.1,
orchestrator/phases/gateway_spec.py)."""
BASE = CACHE_DIR / "litellm"
LITELLM = PipTree("litellm", f"litellm[proxy]=={LITELLM_VERSION}", "the lab's gateway image",
                  BASE, BASE / LITELLM_VERSION / "root", BASE / LITELLM_VERSION / "complete")


def litellm_lower_layers() -> list[Path]:
    """[the LiteLLM tree's usr/], or [] with a warning when PyPI cannot be reached: the lab
    still runs, only `sparkctl gateway up` fails there (its container cannot start)."""
    return LITELLM.lower_layers()
