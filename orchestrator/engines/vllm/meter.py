"""vLLM's speculative-decoding figures: the Prometheus counters vllm:spec_decode_num_drafts,
vllm:spec_decode_num_draft_tokens and vllm:spec_decode_num_accepted_tokens (`_total` in the
exposition): their delta over a cell."""

from __future__ import annotations

from orchestrator.engines.meters import CounterMeter


class VllmMeter(CounterMeter):
    source = "vLLM /metrics counters vllm:spec_decode_num_{drafts,draft_tokens,accepted_tokens}"
    NAMES = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
             "vllm:spec_decode_num_accepted_tokens")
    MISSING = "no vllm:spec_decode_* counters in /metrics (no drafting)"
