"""SGLang: one container per server and node (`sparkctl-sglang-<name>`) running
`python3 -m sglang.launch_server`, on the nodes the launch names (default: the head), several
servers at once. Multi-node servers meet at `--dist-init-addr <first node's fabric IP>:<port>`
with the fabric environment the other engines use. See docs/engines.md.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """ENGINE, built on first use: importing this package (e.g. for its settings or recipes,
    engines/__init__.py) builds nothing, so a command imports only the engines it uses."""
    if name == "ENGINE":
        from orchestrator.engines.sglang.engine import ENGINE

        return ENGINE
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
