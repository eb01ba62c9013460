"""Token counters and latency histograms of the simulated engine, as vLLM and SGLang publish
them on /metrics: `PREFIX:prompt_tokens_total`, `PREFIX:generation_tokens_total` (counters),
`PREFIX:time_to_first_token_seconds` and `PREFIX:inter_token_latency_seconds` (histograms,
cumulative `_bucket{le=...}`, `_sum`, `_count`), measured on the scheduler's own wall clock:
a request's first token after its arrival, each later token after the one before."""
from __future__ import annotations

import threading

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
               0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


class Histogram:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += times
        self.total += times
        self.sum += value * times

    def text(self, name: str, help_text: str, labels: str) -> str:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        for bound, count in zip(self.bounds, self.counts, strict=True):
            lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {count}')
        lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.total}')
        lines.append(f"{name}_sum{{{labels}}} {self.sum}")
        lines.append(f"{name}_count{{{labels}}} {self.total}")
        return "\n".join(lines) + "\n"


class TokenStats:
    """What the scheduler loop reports per iteration; `prometheus()` for /metrics."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)

    def first_token(self, prompt_tokens: int, seconds: float) -> None:
        with self.lock:
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += 1
            self.ttft.observe(seconds)

    def tokens(self, count: int, seconds: float) -> None:
        """`count` tokens of one request out `seconds` after its previous ones."""
        if count <= 0:
            return
        with self.lock:
            self.generation_tokens += count
            self.itl.observe(seconds / count, count)

    def prometheus(self, prefix: str, labels: str) -> str:
        with self.lock:
            return (
                f"# HELP {prefix}:prompt_tokens_total Number of prefill tokens processed.\n"
                f"# TYPE {prefix}:prompt_tokens_total counter\n"
                f"{prefix}:prompt_tokens_total{{{labels}}} {self.prompt_tokens}\n"
                f"# HELP {prefix}:generation_tokens_total Number of generation tokens processed.\n"
                f"# TYPE {prefix}:generation_tokens_total counter\n"
                f"{prefix}:generation_tokens_total{{{labels}}} {self.generation_tokens}\n"
                + self.ttft.text(f"{prefix}:time_to_first_token_seconds",
                                 "Histogram of time to first token in seconds.", labels)
                + self.itl.text(f"{prefix}:inter_token_latency_seconds",
                                "Histogram of inter-token latency in seconds.", labels))
