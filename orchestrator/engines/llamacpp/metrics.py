"""What llama-server's Prometheus /metrics (`--metrics`, always on) says during a bench cell.

llama.cpp's counters (tools/server/server-context.cpp): `llamacpp:spec_decode_num_drafts_total`,
`..._num_draft_tokens_total`, `..._num_accepted_tokens_total` for speculative decoding (the same
shape as vLLM's, read as deltas over the cell), and `llamacpp:tokens_predicted_total` /
`llamacpp:tokens_predicted_seconds_total`: the server's own generation rate over the cell,
shown beside the client's figure (`engine_generation_tps`).
"""

from __future__ import annotations

from typing import Any

from orchestrator.checks.bench_metrics import VllmMeter, counter, parse_prometheus

PREDICTED = ("llamacpp:tokens_predicted_total", "llamacpp:tokens_predicted_seconds_total")


class LlamacppMeter(VllmMeter):
    source = ("llama.cpp /metrics counters llamacpp:spec_decode_num_{drafts,draft_tokens,"
              "accepted_tokens}, llamacpp:tokens_predicted{,_seconds}")
    NAMES = ("llamacpp:spec_decode_num_drafts", "llamacpp:spec_decode_num_draft_tokens",
             "llamacpp:spec_decode_num_accepted_tokens")

    def snapshot(self) -> list[float | None]:
        text = self.read()
        values = parse_prometheus(text or "")
        return [counter(values, name) for name in (*self.NAMES, *PREDICTED)]

    def end(self) -> dict[str, Any] | None:
        finish = self.snapshot()
        deltas = [None if a is None or b is None else b - a
                  for a, b in zip(self.start, finish, strict=True)]
        drafts, drafted, accepted, tokens, seconds = deltas
        rate = f"{tokens / seconds:.1f}" if tokens and seconds else None
        if not drafted or not drafts or accepted is None:
            self.note = (f"no draft tokens; llama-server's own counters: {tokens:.0f} tokens "
                         f"generated in {seconds:.2f}s of decoding ({rate} t/s)" if rate else
                         "no llamacpp:* counters in /metrics")
            return None
        return {"acceptance_rate": accepted / drafted, "acceptance_length": 1 + accepted / drafts,
                "draft_tokens": int(drafted), "accepted_tokens": int(accepted),
                "drafts": int(drafts), "engine_generation_tps": float(rate) if rate else None,
                "source": self.source}
