"""What the engine says about speculative decoding, and the nodes' state (GPU, memory).

Speculative decoding figures come from each engine's own /metrics, with its real names: each
engine's `spec_meter` (orchestrator/engines/NAME/meter.py, on the base in engines/meters.py)
says how they are read.
"""

from __future__ import annotations

import re
from typing import Any

from orchestrator.engines.meters import Fetch, SpecMeter, counter, meter_class, meter_for, parse_prometheus

__all__ = ["Fetch", "SpecMeter", "counter", "meter_class", "meter_for", "parse_prometheus"]


# ---------------------------------------------------------------- the nodes' state
GPU_FIELDS = ("clocks.sm", "clocks.max.sm", "temperature.gpu", "power.draw", "memory.used",
              "utilization.gpu")
NODE_STATE_CMD = (f"nvidia-smi --query-gpu={','.join(GPU_FIELDS)} --format=csv,noheader,nounits; "
                  "echo '--meminfo'; grep -E '^(MemTotal|MemAvailable):' /proc/meminfo")


def parse_node_state(stdout: str) -> dict[str, Any]:
    """nvidia-smi's CSV line and /proc/meminfo -> {sm_clock_mhz, temperature_c, ...}.
    A Spark's nvidia-smi reports memory.used as [N/A] (unified memory): then memory used is
    MemTotal - MemAvailable of the node."""
    gpu_part, _, mem_part = stdout.partition("--meminfo")
    out: dict[str, Any] = {}
    lines = [line for line in gpu_part.strip().splitlines() if "," in line]
    if lines:
        values = [v.strip() for v in lines[0].split(",")]
        for name, key in zip(GPU_FIELDS, ("sm_clock_mhz", "max_sm_clock_mhz", "temperature_c",
                                          "power_w", "gpu_memory_used_mib", "utilization_pct"),
                             strict=False):
            try:
                out[key] = float(values[GPU_FIELDS.index(name)])
            except (ValueError, IndexError):
                out[key] = None
    mem = dict(re.findall(r"^(\w+):\s+(\d+) kB", mem_part, re.M))
    if "MemTotal" in mem and "MemAvailable" in mem:
        out["memory_used_gb"] = round((int(mem["MemTotal"]) - int(mem["MemAvailable"])) / 1024**2, 2)
        out["memory_total_gb"] = round(int(mem["MemTotal"]) / 1024**2, 2)
    if out.get("gpu_memory_used_mib") is not None:
        out["memory_used_gb"] = round(out["gpu_memory_used_mib"] / 1024, 2)
    return out
