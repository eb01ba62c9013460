"""The box guard: what each node's GPU says about its clock, temperature, power and throttling,
and the three states Spark owners lose hours to.

- The clock stuck far under its maximum while the GPU is busy: a GB10 can fall into a low-power
  state (SM clock ~702 MHz of 3003, decode about halved) that no throttle reason explains and
  that survives a reboot; only removing AC power for a while clears it.
- A temperature near the limit: sustained load there ends in thermal power-offs.
- An active thermal or power throttle reason (NVML's clock event reasons bitmask).

Read with the same nvidia-smi call as status's memory figures (one round trip per node, no
extra load): `--query-gpu=...,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,
clocks_throttle_reasons.active --format=csv,noheader,nounits`. A GB10 answers `[N/A]` for its
memory and power limit; a figure a node does not report is absent, never 0, and judges nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.remote.gathered import NodeFacts

# the fields after status's memory ones, in this order (GPU_FIELDS[i] -> GpuReading field)
GPU_FIELDS = ("clocks.sm", "clocks.max.sm", "temperature.gpu", "power.draw",
              "clocks_throttle_reasons.active")

# Busy enough that a low clock means something: an idle GPU drops its clock on purpose.
BUSY_UTILIZATION_PCT = 50.0
# "Far under": the stuck state sits at 500-850 MHz of 3003 (~17-28 %); a loaded GB10 runs
# at ~2400 MHz (80 %).
STUCK_CLOCK_FRACTION = 0.5
# Owners' boxes that powered off under sustained load read 90-92 °C before, with the SW thermal
# slowdown engaged; capping the clock brought them to 65-80 °C. Warn before that.
HOT_TEMPERATURE_C = 85.0

# NVML clock event ("throttle") reasons, nvml.h's nvmlClocksEventReason* bits
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
THERMAL_BITS = SW_THERMAL | HW_THERMAL
POWER_BITS = SW_POWER_CAP | HW_POWER_BRAKE | HW_SLOWDOWN

POWER_CYCLE = ("power-cycle the box fully: shut it down, unplug the power adapter from the wall "
               "and from the box, wait 60 s, plug it back in (a reboot does not clear this state)")
COOL_DOWN = ("give it air (nothing against its vents, room around it) or cap its clock until it "
             "cools: `sudo nvidia-smi -lgc 0,2100`")
POWER_CHECK = ("check the power adapter is the one that came with the box, plugged straight "
               "into the wall, and nothing else caps its power")


@dataclass(frozen=True)
class GpuReading:
    """One node's GPU, as nvidia-smi answered; None where it answered [N/A] or nothing."""

    utilization_pct: float | None = None
    sm_clock_mhz: float | None = None
    max_sm_clock_mhz: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    throttle_reasons: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The known figures but the utilisation (status's memory carries it already)."""
        return {k: v for k, v in asdict(self).items() if v is not None and k != "utilization_pct"}


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]", ""
        return None


def _bitmask(text: str) -> int | None:
    try:
        return int(text, 16) if text.lower().startswith("0x") else None
    except ValueError:
        return None


def parse_reading(values: list[str]) -> GpuReading:
    """nvidia-smi's CSV values: utilization.gpu first, then GPU_FIELDS (a shorter answer, from
    the fallback query without them, gives only the utilisation)."""
    padded = [v.strip() for v in values] + [""] * (1 + len(GPU_FIELDS))
    return GpuReading(utilization_pct=_number(padded[0]), sm_clock_mhz=_number(padded[1]),
                      max_sm_clock_mhz=_number(padded[2]), temperature_c=_number(padded[3]),
                      power_w=_number(padded[4]), throttle_reasons=_bitmask(padded[5]))


@dataclass(frozen=True)
class GpuProblem:
    """What is wrong with a node's GPU (`kind`: stuck-clock, hot, thermal-throttle,
    power-throttle) and what to do about it."""

    kind: str
    what: str
    remedy: str

    def text(self) -> str:
        return f"{self.what}: {self.remedy}"


def judge(gpu: GpuReading) -> list[GpuProblem]:
    """The box guard's verdicts over one reading (pure)."""
    problems: list[GpuProblem] = []
    reasons = gpu.throttle_reasons or 0
    if reasons & THERMAL_BITS:
        problems.append(GpuProblem("thermal-throttle", "GPU thermal slowdown is active"
                                   + _at(gpu), COOL_DOWN))
    elif gpu.temperature_c is not None and gpu.temperature_c >= HOT_TEMPERATURE_C:
        problems.append(GpuProblem("hot", f"GPU at {gpu.temperature_c:g} °C, near its limit "
                                   "(sustained load there ends in thermal power-offs)", COOL_DOWN))
    if reasons & POWER_BITS:
        problems.append(GpuProblem("power-throttle", "GPU power throttle is active"
                                   + _at(gpu), POWER_CHECK))
    if (not reasons & (THERMAL_BITS | POWER_BITS) and gpu.sm_clock_mhz is not None
            and gpu.max_sm_clock_mhz and gpu.utilization_pct is not None
            and gpu.utilization_pct >= BUSY_UTILIZATION_PCT
            and gpu.sm_clock_mhz < STUCK_CLOCK_FRACTION * gpu.max_sm_clock_mhz):
        problems.append(GpuProblem(
            "stuck-clock", f"GPU clock stuck at {gpu.sm_clock_mhz:g} of {gpu.max_sm_clock_mhz:g} "
            f"MHz while {gpu.utilization_pct:g} % busy, with no throttle reason (the GB10's "
            "low-power state: decode runs at about half speed)", POWER_CYCLE))
    return problems


def _at(gpu: GpuReading) -> str:
    figures = []
    if gpu.sm_clock_mhz is not None:
        figures.append(f"{gpu.sm_clock_mhz:g} MHz")
    if gpu.temperature_c is not None:
        figures.append(f"{gpu.temperature_c:g} °C")
    return f" ({', '.join(figures)})" if figures else ""


def gpu_text(gpu: dict[str, Any]) -> str:
    """`SM 2418/3003 MHz, 41 °C, 4.12 W` from a reading's dict; "" when nothing is known."""
    parts = []
    if "sm_clock_mhz" in gpu:
        top = gpu.get("max_sm_clock_mhz")
        parts.append(f"SM {gpu['sm_clock_mhz']:g}" + (f"/{top:g}" if top else "") + " MHz")
    if "temperature_c" in gpu:
        parts.append(f"{gpu['temperature_c']:g} °C")
    if "power_w" in gpu:
        parts.append(f"{gpu['power_w']:g} W")
    return ", ".join(parts)


def gpu_fields(gpu_section: str) -> list[str]:
    """The CSV values of nvidia-smi's line in status's memory answer (after `--gpu`)."""
    line = next((row for row in gpu_section.strip().splitlines() if "," in row), "")
    return line.split(",") if line else []


def node_gpu(facts: NodeFacts) -> GpuReading:
    """The node's GPU clock, temperature, power and throttle reasons from status's memory
    answer (memory.used, memory.total, utilization.gpu, then GPU_FIELDS)."""
    fields = gpu_fields(facts.output("memory").partition("--gpu")[2])
    return parse_reading(fields[2:]) if len(fields) >= 3 else GpuReading()


def guard_nodes(nodes: dict[str, dict[str, Any]], facts: dict[str, NodeFacts]) -> None:
    """Each node's box-guard verdicts become its problems (status exits 1), kinds listed under
    "gpu_problems" for the dashboard."""
    for name, node_facts in facts.items():
        found = judge(node_gpu(node_facts))
        nodes[name]["gpu_problems"] = [problem.kind for problem in found]
        if found:
            nodes[name]["problems"].extend(problem.text() for problem in found)
            nodes[name]["state"] = "problem"
