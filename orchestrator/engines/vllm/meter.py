"""vLLM's speculative-decoding figures: the Prometheus counters vllm:spec_decode_num_drafts,
vllm:spec_decode_num_draft_tokens and vllm:spec_decode_num_accepted_tokens (`_total` in the
exposition): their delta over a cell."""

from __future__ import annotations

from typing import Any

from orchestrator.engines.meters import SpecMeter, counter, parse_prometheus


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
