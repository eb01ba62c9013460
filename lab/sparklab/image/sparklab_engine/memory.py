"""The simulated engine's memory: loading a model really fills the node's memory cgroup.

A lab node presents its cgroup's memory scaled up (`memory_scale` in the lab config; 2 GiB real
x 64 = a Spark's 128 GiB, see sparklab/memory.py). While "loading", a rank allocates, in steps,
what sparkctl estimated this node holds once loaded (weights share + draft; the runtime share
is the lab processes' own memory, scaled), from
/var/lib/sparkctl/run/memory.json, written by sparkctl next to the server's other records),
divided by that factor; then, like TensorRT-LLM sizing its KV cache, the KV cache fraction of
the memory still available (/proc/meminfo, the node's). The memory is held until the process
ends. Without a memory cgroup (no scale) or without sparkctl's record, nothing is allocated.
"""
from __future__ import annotations

import json
import time

from .common import lab_config, trt_log

PLAN = "/var/lib/sparkctl/run/memory.json"
CHUNK = 8 * 1024 * 1024
GIB = 1024 ** 3
_held: list[bytearray] = []


def available_kb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


class Loader:
    def __init__(self) -> None:
        self.scale = int(lab_config().get("memory_scale") or 0)
        try:
            with open(PLAN) as f:
                plan = json.load(f)
        except (OSError, ValueError):
            plan = {}
        # the runtime share is what the lab's own processes (mpirun, the ranks' Python) already
        # take, scaled: allocate the weights and the draft only, or the runtime counts twice
        self.loaded_gb = max(0.0, float(plan.get("loaded_gb") or 0) - float(plan.get("runtime_gb") or 0))
        self.kv_fraction = float(plan.get("kv_cache_fraction") or 0)
        self.active = bool(self.scale and self.loaded_gb)
        self.target = int(self.loaded_gb * GIB / self.scale) if self.active else 0
        self.done = 0

    def step(self, progress: float) -> None:
        """Allocate up to `progress` (0..1) of the loaded size."""
        want = int(self.target * min(1.0, max(0.0, progress)))
        while self.done + CHUNK <= want:
            _held.append(bytearray(CHUNK))
            self.done += CHUNK

    def finish(self) -> None:
        if not self.active:
            return
        self.step(1.0)
        if self.target > self.done:
            _held.append(bytearray(self.target - self.done))
            self.done = self.target
        time.sleep(0.6)  # the node's /proc/meminfo is refreshed every 0.5 s
        avail = available_kb() * 1024
        kv_spark = int(avail * self.kv_fraction)
        kv_real = kv_spark // self.scale
        trt_log("I", f"[MemUsageChange] weights and runtime {self.loaded_gb:.1f} GiB; "
                     f"KV cache {self.kv_fraction:g} x {avail / GIB:.1f} GiB free = "
                     f"{kv_spark / GIB:.1f} GiB (sparklab: {kv_real / 1024**2:.0f} MiB real, "
                     f"scale {self.scale})")
        for _ in range(kv_real // CHUNK):
            _held.append(bytearray(CHUNK))
