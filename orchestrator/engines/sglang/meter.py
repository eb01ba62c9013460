"""SGLang's speculative-decoding figures: the Prometheus gauges sglang:spec_accept_length and
sglang:spec_accept_rate, their value at a cell's end."""

from __future__ import annotations

from typing import Any

from orchestrator.engines.meters import SpecMeter, parse_prometheus


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
