"""One benchmark run: every (depth, pp, tg, concurrency) cell, in llama-benchy's order.

For each cell: an optional warmup batch (discarded), then `runs` batches of `concurrency`
simultaneous streaming requests, each with a `depth`-token system message (when depth > 0) and
a `pp`-token user message, asking for `tg` tokens. While a cell runs, the engine's /metrics are
polled every second (speculative decoding); after it, every node's GPU state is sampled.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.bench.client import Endpoint, RequestResult, prompt_words, run_batch
from orchestrator.bench.metrics import SpecMeter
from orchestrator.bench.stats import DEFINITIONS, cell_figures
from orchestrator.errors import SparkctlError

SCHEMA = "sparkctl-bench/1"


@dataclass
class BenchConfig:
    tg: list[int] = field(default_factory=lambda: [128, 256])
    pp: list[int] = field(default_factory=lambda: [2048])
    depth: list[int] = field(default_factory=lambda: [0, 16384])
    concurrency: list[int] = field(default_factory=lambda: [1, 4, 8])
    runs: int = 3
    warmup: bool = True

    def cells(self) -> list[tuple[int, int, int, int]]:
        return [(d, p, t, c) for d in self.depth for p in self.pp for t in self.tg
                for c in self.concurrency]

    def requests(self) -> int:
        return sum(c * (self.runs + self.warmup) for *_, c in self.cells())

    PP_RATE = 1500
    TG_RATE = 20
    """Typical single-Spark speeds (a ~30B model: ~1,500 prompt t/s at pp2048, ~20 t/s
    generated per request): the basis of the duration said before a run starts."""

    def estimate_seconds(self) -> float:
        """Each batch: its requests' prompts prefilled one after another, then tg tokens."""
        return sum((self.runs + self.warmup) * (c * (p + d) / self.PP_RATE + t / self.TG_RATE)
                   for d, p, t, c in self.cells())


@dataclass
class Target:
    """What a run measures against: the endpoint, the engine's meter, the nodes' state."""

    endpoint: Endpoint
    meter: SpecMeter
    node_state: Callable[[], dict[str, Any]] = dict
    note: Callable[[str], None] = lambda line: None


def label(depth: int, pp: int, tg: int, concurrency: int) -> str:
    return f"pp{pp} tg{tg}" + (f" @ d{depth}" if depth else "") + f" c{concurrency}"


def messages(depth: int, pp: int, seed: str) -> list[dict[str, str]]:
    rng = random.Random(seed)  # a different text per request: no prefix-cache hits
    out = [{"role": "system", "content": prompt_words(depth, rng)}] if depth else []
    return [*out, {"role": "user", "content": prompt_words(max(pp, 1), rng)}]


class Poller:
    """Calls meter.poll() every `every` seconds in a thread until stopped."""

    def __init__(self, meter: SpecMeter, every: float = 1.0) -> None:
        self.meter, self.every = meter, every
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        while not self.stop.wait(self.every):
            self.meter.poll()

    def __enter__(self) -> Poller:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def run_bench(config: BenchConfig, target: Target, stop: threading.Event | None = None) -> dict[str, Any]:
    """Measure every cell; on Ctrl-C, stop the streams and return what was measured with
    "interrupted": true (the server is never touched)."""
    stop = stop or threading.Event()
    endpoint, note = target.endpoint, target.note
    doc: dict[str, Any] = {"schema": SCHEMA, "settings": asdict(config), "cells": [],
                           "definitions": DEFINITIONS, "interrupted": False,
                           "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        doc["nodes_before"] = target.node_state()
        probe = endpoint.stream([{"role": "user", "content": "Warmup " * 10}], 1, stop)
        if probe.error:
            raise SparkctlError(f"the server did not answer a warmup request: {probe.error}")
        latency = endpoint.latency()
        doc["latency_ms"] = latency * 1000
        note(f"[bench] latency through the forward: {latency * 1000:.1f} ms; "
             f"{len(config.cells())} cells, {config.requests()} requests")
        left = config.requests()
        for index, (depth, pp, tg, c) in enumerate(config.cells()):
            name = label(depth, pp, tg, c)
            batches: list[list[RequestResult]] = []
            target.meter.begin()
            with Poller(target.meter):
                for run in range(config.runs + config.warmup):
                    warm = config.warmup and run == 0
                    what = "warmup" if warm else f"run {run + (not config.warmup)}/{config.runs}"
                    note(f"[bench] {name}: {what}, {c} request{'s' * (c > 1)} "
                         f"({left} requests left)")
                    prompts = [messages(depth, pp, f"{index}-{run}-{i}-{time.time_ns()}")
                               for i in range(c)]
                    batch = run_batch(endpoint, prompts, tg, stop)
                    left -= c
                    if not warm:
                        batches.append(batch)
            spec = target.meter.end()
            figures = cell_figures(batches, pp + depth, latency, c)
            doc["cells"].append({"depth": depth, "pp": pp, "tg": tg, "concurrency": c,
                                 "runs": len(batches), "figures": figures, "spec_decoding": spec,
                                 "spec_note": None if spec else target.meter.note,
                                 "nodes": target.node_state()})
            if figures["error_count"]:
                note(f"[bench] {name}: {figures['error_count']} request(s) failed: "
                     f"{figures['errors'][0]}")
    except KeyboardInterrupt:
        stop.set()
        doc["interrupted"] = True
        note(f"[bench] interrupted after {len(doc['cells'])} cell(s); the server keeps running")
    doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return doc


def figure(cell: dict[str, Any], name: str) -> float | None:
    value = (cell.get("figures") or {}).get(name)
    return None if not value else float(value["mean"])


def find(doc: dict[str, Any], depth: int, pp: int, tg: int, c: int) -> dict[str, Any] | None:
    for cell in doc.get("cells", []):
        if (cell["depth"], cell["pp"], cell["tg"], cell["concurrency"]) == (depth, pp, tg, c):
            return cell
    return None


def peak(doc: dict[str, Any]) -> tuple[float | None, int | None]:
    """The highest peak_throughput of the run, and at which concurrency."""
    best: tuple[float | None, int | None] = (None, None)
    for cell in doc.get("cells", []):
        value = figure(cell, "peak_throughput")
        if value is not None and (best[0] is None or value > best[0]):
            best = (value, cell["concurrency"])
    return best


def spec_summary(doc: dict[str, Any]) -> dict[str, float] | None:
    """Acceptance over the whole run (counts summed when the engine gives counts)."""
    specs = [c["spec_decoding"] for c in doc.get("cells", []) if c.get("spec_decoding")]
    if not specs:
        return None
    if all("draft_tokens" in s for s in specs):
        drafted = sum(s["draft_tokens"] for s in specs)
        accepted = sum(s["accepted_tokens"] for s in specs)
        drafts = sum(s["drafts"] for s in specs)
        return {"acceptance_rate": accepted / drafted, "acceptance_length": 1 + accepted / drafts}
    rates = [s["acceptance_rate"] for s in specs if s.get("acceptance_rate") is not None]
    lengths = [s["acceptance_length"] for s in specs if s.get("acceptance_length") is not None]
    return {"acceptance_rate": sum(rates) / len(rates) if rates else None,  # type: ignore[dict-item]
            "acceptance_length": sum(lengths) / len(lengths) if lengths else None}  # type: ignore[dict-item]
