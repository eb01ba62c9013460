"""The benchmark's figures, defined exactly as llama-benchy 0.4.0 defines them (results.py).

A cell is one (depth, pp, tg, concurrency) combination measured over `runs` batches of
`concurrency` simultaneous requests. Per request: TTFR, estimated prompt processing time,
end-to-end TTFT, prefill and generation speed, peak. Per batch: prefill and generation
throughput across the batch, and the peak 1-second window over every token of the batch. Each
figure of a cell is the mean (and standard deviation) over the runs' values.
"""

from __future__ import annotations

import statistics
from typing import Any

from orchestrator.bench.client import RequestResult

DEFINITIONS = {
    "tg_throughput": "generation tokens/s. c1: mean over requests of (tokens after the first) / "
                     "(last token time - first token time). c>1: per batch, the sum of every "
                     "request's tokens after its first / (latest last token - earliest first "
                     "token); mean over runs",
    "tg_req_throughput": "generation tokens/s of one request (the c1 definition), mean over all "
                         "requests",
    "peak_throughput": "most tokens of the batch inside any 1 s window (token times interpolated "
                       "between events), per second; a batch shorter than 1 s: all tokens / its "
                       "duration; mean over runs",
    "peak_req_throughput": "the same peak per request, mean over requests",
    "pp_throughput": "prefill tokens/s. c1: mean over requests of prompt tokens / est_ppt. c>1: "
                     "per batch, the sum of prompt tokens / (latest first token - earliest "
                     "send); mean over runs",
    "pp_req_throughput": "prompt tokens / est_ppt per request, mean over requests",
    "ttfr_ms": "time to first response: send -> first SSE event with choices, ms",
    "est_ppt_ms": "estimated prompt processing time: TTFR - latency, ms",
    "e2e_ttft_ms": "time to first token: send -> first event with content, ms (includes the "
                   "network round trip through the SSH forward)",
    "ttft_ms": "e2e TTFT - latency, ms",
    "latency_ms": "mean of 3 GET /v1/models round trips through the forward (llama-benchy's "
                  "'api' latency mode), subtracted from TTFR and TTFT",
    "prompt_tokens": "the server's usage.prompt_tokens when within 20 % of pp + depth, else pp + "
                     "depth",
    "acceptance_rate": "accepted draft tokens / drafted tokens over the cell (engine metrics)",
    "acceptance_length": "mean tokens produced per step of a request that drafted: 1 + accepted "
                         "/ drafts (engines counting per iteration: (accepted + requests with "
                         "drafts) / requests with drafts, summed over the cell)",
}


def metric(values: list[float], scale: float = 1.0) -> dict[str, Any] | None:
    """mean, population std (numpy's default, as llama-benchy), percentiles and the values."""
    if not values:
        return None
    scaled = [v * scale for v in values]
    return {"mean": statistics.fmean(scaled), "std": statistics.pstdev(scaled),
            **percentiles(scaled), "values": scaled}


def percentiles(values: list[float]) -> dict[str, float]:
    """p50 / p90 / p99 (inclusive method: within the measured range; one value is all three)."""
    if len(values) == 1:
        return {"p50": values[0], "p90": values[0], "p99": values[0]}
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": cuts[49], "p90": cuts[89], "p99": cuts[98]}


def peak_rate(timestamps: list[float], window: float = 1.0) -> float:
    if not timestamps:
        return 0.0
    times = sorted(timestamps)
    duration = times[-1] - times[0]
    if 0 < duration < window:
        return len(times) / duration
    best, start = 0, 0
    for end, at in enumerate(times):
        while start < end and times[start] <= at - window:
            start += 1
        best = max(best, end - start + 1)
    return best / window


def decode_tokens(timestamps: list[float]) -> int:
    """Tokens that arrived after the first one (strictly later than the first timestamp)."""
    if len(timestamps) < 2:
        return 0
    return sum(1 for t in timestamps if t > timestamps[0])


def cell_figures(batches: list[list[RequestResult]], expected_prompt: int, latency: float,
                 concurrency: int) -> dict[str, Any]:
    """Every figure of one cell from its measured batches (errors are left out and counted)."""
    pp_req: list[float] = []
    tg_req: list[float] = []
    ttfr: list[float] = []
    est_ppt: list[float] = []
    e2e_ttft: list[float] = []
    ttft: list[float] = []
    pp_batch: list[float] = []
    tg_batch: list[float] = []
    peaks: list[float] = []
    peaks_req: list[float] = []
    prompt_seen: list[int] = []
    errors: list[str] = []
    for batch in batches:
        valid = [r for r in batch if not r.error]
        errors += [r.error for r in batch if r.error]
        if not valid:
            continue
        batch_prompt = 0
        all_times: list[float] = []
        firsts: list[float] = []
        lasts: list[float] = []
        decoded = 0
        for r in valid:
            times = r.token_timestamps()
            all_times += times
            if times:
                peaks_req.append(peak_rate(times))
                lasts.append(times[-1])
            elif r.end:
                lasts.append(r.end)
            prompt = expected_prompt
            if r.prompt_tokens > 0 and abs(r.prompt_tokens - expected_prompt) < expected_prompt * 0.2:
                prompt = r.prompt_tokens
            prompt_seen.append(r.prompt_tokens)
            batch_prompt += prompt
            ppt = 0.0
            if r.first_response is not None:
                ttfr.append(r.first_response - r.start)
            if r.first_token is not None:
                firsts.append(r.first_token)
                e2e = r.first_token - r.start
                e2e_ttft.append(e2e)
                ttft.append(max(0.0, e2e - latency))
                ppt = max(0.0, (r.first_response or r.first_token) - r.start - latency)
                est_ppt.append(ppt)
            if ppt > 0:
                pp_req.append(prompt / ppt)
            if len(times) > 1 and times[-1] > times[0] and decode_tokens(times):
                tg_req.append(decode_tokens(times) / (times[-1] - times[0]))
            decoded += decode_tokens(times)
        if firsts:
            starts = [r.start for r in valid]
            if max(firsts) > min(starts):
                pp_batch.append(batch_prompt / (max(firsts) - min(starts)))
            span = (max(lasts) if lasts else max(r.end for r in valid)) - min(firsts)
            if span > 0 and decoded:
                tg_batch.append(decoded / span)
        if all_times:
            peaks.append(peak_rate(all_times))
    pp_total = metric(pp_batch if concurrency > 1 else pp_req)
    tg_total = metric(tg_batch if concurrency > 1 else tg_req)
    return {
        "pp_throughput": pp_total,
        "pp_req_throughput": pp_total if concurrency == 1 else metric(pp_req),
        "tg_throughput": tg_total,
        "tg_req_throughput": tg_total if concurrency == 1 else metric(tg_req),
        "peak_throughput": metric(peaks),
        "peak_req_throughput": metric(peaks_req),
        "ttfr_ms": metric(ttfr, 1000),
        "est_ppt_ms": metric(est_ppt, 1000),
        "e2e_ttft_ms": metric(e2e_ttft, 1000),
        "ttft_ms": metric(ttft, 1000),
        "prompt_tokens_reported": sorted(set(prompt_seen)),
        "requests": sum(len(b) for b in batches),
        "errors": errors[:5],
        "error_count": len(errors),
    }
