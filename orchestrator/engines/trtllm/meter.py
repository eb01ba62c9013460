"""TensorRT-LLM's speculative-decoding figures: /metrics is a JSON list of iteration stats (only
with `enable_iter_perf_stats: true`), drained on read; each entry's `specDecodingStats` has
numDraftTokens, numAcceptedTokens, numRequestsWithDraftTokens, acceptanceLength, iterLatencyMS,
draftOverhead. Polled every second during a cell and summed."""

from __future__ import annotations

import json
from typing import Any

from orchestrator.engines.meters import SpecMeter


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
