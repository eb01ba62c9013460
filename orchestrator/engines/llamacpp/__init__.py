"""llama.cpp: `llama-server` on a server's first node and, for more nodes, `rpc-server` on each of
the others (llama.cpp's RPC backend: the layers are split over the nodes, the weights sent over
the fabric from the first node). GGUF models; one container per server and node,
`sparkctl-llamacpp-<name>`; several servers at once, placed like SGLang's. See docs/engines.md.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """ENGINE, built on first use: importing this package (e.g. for its settings or recipes,
    engines/__init__.py) builds nothing, so a command imports only the engines it uses."""
    if name == "ENGINE":
        from orchestrator.engines.llamacpp.engine import ENGINE

        return ENGINE
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
