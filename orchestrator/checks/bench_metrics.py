"""What the engine says about speculative decoding, and the nodes' state (GPU, memory).

Speculative decoding figures come from each engine's own /metrics, with its real names:

- trtllm: /metrics is a JSON list of iteration stats (only with `enable_iter_perf_stats: true`),
  drained on read; each entry's `specDecodingStats` has numDraftTokens, numAcceptedTokens,
  numRequestsWithDraftTokens, acceptanceLength, iterLatencyMS, draftOverhead. Polled every
  second during a cell and summed.
- vllm: Prometheus counters `vllm:spec_decode_num_drafts`, `vllm:spec_decode_num_draft_tokens`,
  `vllm:spec_decode_num_accepted_tokens` (`_total` in the exposition): the delta over the cell.
- sglang: Prometheus gauges `sglang:spec_accept_length`, `sglang:spec_accept_rate`: their value
  at the cell's end.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

Fetch = Callable[[], str]
"""GET /metrics through the forward; returns the body (raises OSError on failure)."""

def parse_prometheus(text: str) -> dict[str, float]:
    """Sample name -> sum over its label sets, read by prometheus_client's parser (the
    reference one: escapes, timestamps, exemplars). A line it refuses costs only that line."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return _sums(text_string_to_metric_families(text))
    except ValueError:
        pass
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            try:
                for name, value in _sums(text_string_to_metric_families(line + "\n")).items():
                    out[name] = out.get(name, 0.0) + value
            except ValueError:
                continue
    return out


def _sums(families: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in families:
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    return out


def counter(values: dict[str, float], name: str) -> float | None:
    for key in (name + "_total", name):
        if key in values:
            return values[key]
    return None


def trtllm_counts(text: str) -> dict[str, float]:
    """Sums of specDecodingStats over the iteration stats in one /metrics answer."""
    sums = {"drafted": 0.0, "accepted": 0.0, "requests": 0.0, "iterations": 0.0}
    try:
        stats = json.loads(text or "[]")
    except ValueError:
        return sums
    for entry in stats if isinstance(stats, list) else []:
        if isinstance(entry, str):  # some versions return each entry as a JSON string
            try:
                entry = json.loads(entry)
            except ValueError:
                continue
        spec = entry.get("specDecodingStats") if isinstance(entry, dict) else None
        if not isinstance(spec, dict) or not spec.get("numDraftTokens"):
            continue
        sums["drafted"] += float(spec.get("numDraftTokens", 0))
        sums["accepted"] += float(spec.get("numAcceptedTokens", 0))
        sums["requests"] += float(spec.get("numRequestsWithDraftTokens", 0))
        sums["iterations"] += 1
    return sums


class SpecMeter:
    """begin() at a cell's start, poll() while it runs, end() -> figures or None."""

    source = ""
    prometheus = False
    """/metrics is Prometheus text that reading leaves alone (status reads it too)."""

    def __init__(self, fetch: Fetch) -> None:
        self.fetch = fetch
        self.note: str | None = None

    def read(self) -> str | None:
        try:
            return self.fetch()
        except OSError as exc:
            self.note = f"/metrics unreadable: {exc}"
            return None

    def begin(self) -> None: ...

    def poll(self) -> None: ...

    def end(self) -> dict[str, Any] | None:
        return None


class TrtllmMeter(SpecMeter):
    source = "TensorRT-LLM /metrics iteration stats (specDecodingStats)"

    def begin(self) -> None:
        self.read()  # drain what earlier requests left
        self.sums = {"drafted": 0.0, "accepted": 0.0, "requests": 0.0, "iterations": 0.0}

    def poll(self) -> None:
        text = self.read()
        if text is not None:
            for key, value in trtllm_counts(text).items():
                self.sums[key] += value

    def end(self) -> dict[str, Any] | None:
        self.poll()
        s = self.sums
        if not s["drafted"] or not s["requests"]:
            self.note = self.note or ("no specDecodingStats in /metrics: no draft model, or "
                                      "enable_iter_perf_stats is not true in the recipe's "
                                      "llm_api_options")
            return None
        return {"acceptance_rate": s["accepted"] / s["drafted"],
                "acceptance_length": (s["accepted"] + s["requests"]) / s["requests"],
                "draft_tokens": int(s["drafted"]), "accepted_tokens": int(s["accepted"]),
                "drafts": int(s["requests"]), "source": self.source}


class VllmMeter(SpecMeter):
    prometheus = True
    source = "vLLM /metrics counters vllm:spec_decode_num_{drafts,draft_tokens,accepted_tokens}"
    NAMES = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
             "vllm:spec_decode_num_accepted_tokens")

    def snapshot(self) -> list[float | None]:
        text = self.read()
        values = parse_prometheus(text or "")
        return [counter(values, name) for name in self.NAMES]

    def begin(self) -> None:
        self.start = self.snapshot()

    def end(self) -> dict[str, Any] | None:
        finish = self.snapshot()
        if any(v is None for v in [*self.start, *finish]):
            self.note = self.note or "no vllm:spec_decode_* counters in /metrics (no drafting)"
            return None
        drafts, drafted, accepted = (b - a for a, b in zip(self.start, finish, strict=True))  # type: ignore[operator]
        if drafted <= 0 or drafts <= 0:
            self.note = "no draft tokens during the cell"
            return None
        return {"acceptance_rate": accepted / drafted, "acceptance_length": 1 + accepted / drafts,
                "draft_tokens": int(drafted), "accepted_tokens": int(accepted),
                "drafts": int(drafts), "source": self.source}


class SglangMeter(SpecMeter):
    prometheus = True
    source = "SGLang /metrics gauges sglang:spec_accept_length, sglang:spec_accept_rate"

    def end(self) -> dict[str, Any] | None:
        values = parse_prometheus(self.read() or "")
        length, rate = values.get("sglang:spec_accept_length"), values.get("sglang:spec_accept_rate")
        if length is None and rate is None:
            self.note = self.note or "no sglang:spec_accept_* gauges in /metrics"
            return None
        return {"acceptance_rate": rate, "acceptance_length": length, "source": self.source}


METERS: dict[str, type[SpecMeter]] = {"trtllm": TrtllmMeter, "vllm": VllmMeter, "sglang": SglangMeter}
"""engine name -> how its speculative-decoding figures are read."""


def meter_class(engine: str) -> type[SpecMeter]:
    """The engine's meter: from METERS, else its own (Engine.spec_meter), else none."""
    meter: type[SpecMeter] | None = METERS.get(engine)
    if meter is None:
        from orchestrator.engines import REGISTRY, get_engine

        meter = getattr(get_engine(engine), "spec_meter", None) if engine in REGISTRY else None
    return meter or SpecMeter


def meter_for(engine: str, fetch: Fetch) -> SpecMeter:
    return meter_class(engine)(fetch)


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
