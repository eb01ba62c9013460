"""Time to first token and inter-token latency, p50 and p95, from an engine's own Prometheus
histograms (over the server's life), computed as Prometheus' histogram_quantile() does: the
bucket holding the rank, linear inside it. vLLM and SGLang name them alike after their prefix:
`time_to_first_token_seconds`, `inter_token_latency_seconds` (vLLM before 0.9:
`time_per_output_token_seconds`). Label sets (model, tp_rank) are summed bucket by bucket.
"""

from __future__ import annotations

import math

HISTOGRAMS = {
    "ttft": ("time_to_first_token_seconds",),
    "itl": ("inter_token_latency_seconds", "time_per_output_token_seconds"),
}
QUANTILES = (("p50", 0.5), ("p95", 0.95))


def _buckets(text: str, names: tuple[str, ...]) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of the first histogram named by one of `names`."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:  # a malformed exposition: no latency figures, the rest of status stays
        return []
    for name in names:
        for family in families:
            if family.type != "histogram" or not (family.name == name or family.name.endswith(":" + name)):
                continue
            sums: dict[float, float] = {}
            for sample in family.samples:
                if sample.name.endswith("_bucket") and "le" in sample.labels:
                    bound = float(sample.labels["le"])
                    sums[bound] = sums.get(bound, 0.0) + float(sample.value)
            if sums:
                return sorted(sums.items())
    return []


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """histogram_quantile(q) over cumulative buckets ending with +Inf; None without samples."""
    if not buckets or not math.isinf(buckets[-1][0]):
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):  # in the open bucket: the highest finite bound, as Prometheus
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 0.0)
        lower, below = bound, count
    return None


def latency_figures(text: str) -> dict[str, float]:
    """{ttft_p50_s, ttft_p95_s, itl_p50_s, itl_p95_s}: those the engine's histograms give."""
    out: dict[str, float] = {}
    for key, names in HISTOGRAMS.items():
        buckets = _buckets(text, names)
        for label, q in QUANTILES:
            value = quantile(q, buckets)
            if value is not None:
                out[f"{key}_{label}_s"] = value
    return out
