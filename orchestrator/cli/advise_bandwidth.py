"""`sparkctl advise --memory-bandwidth measure`: the memory bandwidth of the first node advise
would use, timed there by orchestrator/node/membw.py (one core copying a 64 MB buffer).

For an engine that decodes on the CPU (the lab's real llama.cpp) this is the figure a step's
weight read goes at, so the prediction stays first-principles and measured / predicted means
something; on a Spark the GPU reads the unified memory at 273 GB/s, which one CPU core's copy
does not show (keep the default there). See docs/advise.md.
"""

from __future__ import annotations

import json

from orchestrator.errors import SparkctlError

COPY_MB = 64
"""Far above any CPU's last-level cache share, small enough for a lab node's 2 GB."""
ROUNDS = 8
"""The best of several copies: the others are slowed by whatever else runs on the node."""


def measure_bandwidth(inventory_path: str | None) -> tuple[float, str]:
    """GB/s (bytes read + written per second, as STREAM's copy counts) and where it came from."""
    from orchestrator.commands import python_script_cmd
    from orchestrator.core.runner import load_inventory_option
    from orchestrator.core.session import open_session
    from orchestrator.node import script

    inventory, _ = load_inventory_option(inventory_path)
    node = inventory.ordered_nodes()[0].name
    with open_session(inventory, "advise", quiet=True) as session:
        transport = session.transports.get(node)
        if transport is None:
            raise SparkctlError(f"--memory-bandwidth measure: {node} is unreachable")
        result = transport.run(python_script_cmd({"mb": COPY_MB, "rounds": ROUNDS}),
                               stdin=script("membw.py"), timeout=120)
    try:
        gbs = float(json.loads(result.stdout)["gbs"])
    except (ValueError, KeyError, TypeError):
        said = (result.stderr or result.stdout)[-300:]
        raise SparkctlError(f"--memory-bandwidth measure on {node}: the copy did not report "
                            f"(exit {result.exit_status}): {said}") from None
    return gbs, f"memory bandwidth {gbs:g} GB/s (measured on {node}: one core copying {COPY_MB} MB)"
