"""The lab's performance model: how fast a simulated Spark serves a model (stdlib only).

Every parameter lives here, with where it comes from; docs/lab-engine.md ("Performance model")
explains the formulas. The simulated trtllm-serve paces its iterations by `step_seconds` and
`prefill_seconds` at wall-clock rate (no time scaling), so `sparkctl bench` measures something
whose expected value is known: `decode_rate()`.

Decode is memory-bound: one step reads every active weight once (split by tensor parallelism),
plus one all-reduce per attention and per MLP block over the link, plus a fixed overhead.
Batching makes a step longer sub-linearly (power law fitted to owners' measurements).
Speculative decoding: the draft proposes k tokens; position i is accepted with probability
p_i = ACCEPT_FIRST * ACCEPT_DECAY**(i-1) given the ones before it were; verifying k tokens and
drafting them lengthen the step, so long drafts give diminishing, then negative, returns.
Prefill is compute-bound: 2 * active parameters FLOPs per token plus causal attention.
"""
from __future__ import annotations

from dataclasses import dataclass

# ---------------------------------------------------------------- hardware (per Spark)
SPARK_BANDWIDTH_GBS = 273.0
"""NVIDIA DGX Spark spec sheet: 128 GB LPDDR5x unified memory, 273 GB/s."""
BANDWIDTH_EFFICIENCY = 0.80
"""Share of peak bandwidth a decode step's weight reads reach (memory-bound kernels typically
reach 75-85 % of the spec sheet figure)."""
PREFILL_TFLOPS = 60.0
"""Effective dense compute in prefill, per Spark. Fitted: owners measure ~1,500 t/s for pp2048
on one Spark with a ~20B-active model, i.e. 2 * 20e9 * 1500 = 60 TFLOPS."""
LINK_GBS = 25.0
"""ConnectX-7 between two Sparks: 200 Gb/s = 25 GB/s."""
ALLREDUCE_LATENCY_US = 20.0
"""One small-message NCCL all-reduce over RoCE between two nodes (order of magnitude)."""
STEP_OVERHEAD_MS = 2.0
"""Per iteration: scheduling, sampling, kernel launches (CUDA graphs keep this small)."""
BATCH_EXPONENT = 0.34
"""A step with b sequences takes b**BATCH_EXPONENT times as long as one with 1 sequence.
Fitted to the owners' table (one Spark, c1/c4/c8 = 22.6/54.3/95.3 t/s aggregate: 4**0.66 = 2.5,
8**0.66 = 3.9 against the measured 2.4 and 4.2)."""

# ---------------------------------------------------------------- speculative decoding
ACCEPT_FIRST = 0.80
"""Acceptance probability of the first draft position (Eagle3 heads: 0.7-0.85 on chat data)."""
ACCEPT_DECAY = 0.85
"""Each later position's conditional acceptance is the previous one's times this."""
VERIFY_COST = 0.05
"""Extra target-step time per drafted token verified (k+1 query tokens per sequence)."""
DRAFT_COST = 0.08
"""One draft token as a share of a target step (an Eagle3 head is ~1 decoder layer plus the
LM head, against 36-94 target layers)."""
ACCEPT_SEQUENCE = 0.6180339887498949
"""Acceptance draws use the golden-ratio low-discrepancy sequence u_n = frac(offset + n * this),
so a short run's acceptance converges to its expectation (a benchmark can check the model)."""


@dataclass(frozen=True)
class ModelSpec:
    active_params_b: float
    """Parameters read per token, in billions (MoE: the active ones)."""
    bytes_per_param: float
    """NVFP4: 4 bits + one FP8 scale per 16 values = 0.5625 bytes; MXFP4 ~0.53; BF16 2."""
    layers: int
    hidden: int
    attn_dim: int
    """Query heads x head dim (attention FLOPs in prefill)."""


MODELS = {
    # Qwen3-235B-A22B config.json: 94 layers, hidden 4096, 64 q heads x 128; 22B active.
    "nvidia/Qwen3-235B-A22B-FP4": ModelSpec(22.0, 0.5625, 94, 4096, 8192),
    # gpt-oss-120b model card: 5.1B active, MXFP4 experts (attention BF16: ~0.6 overall),
    # 36 layers, hidden 2880, 64 q heads x 64.
    "openai/gpt-oss-120b": ModelSpec(5.1, 0.6, 36, 2880, 4096),
    # Llama 3.3 70B: dense, 80 layers, hidden 8192, 64 q heads x 128.
    "nvidia/Llama-3.3-70B-Instruct-FP4": ModelSpec(70.0, 0.5625, 80, 8192, 8192),
    # Llama 3.1 8B: dense, 32 layers, hidden 4096, 32 q heads x 128.
    "nvidia/Llama-3.1-8B-Instruct-FP4": ModelSpec(8.0, 0.5625, 32, 4096, 4096),
}
DEFAULT_MODEL = ModelSpec(8.0, 2.0, 32, 4096, 4096)
"""Any other model: an 8B dense BF16 model."""


def spec_of(model: str) -> ModelSpec:
    return MODELS.get(model, DEFAULT_MODEL)


def allreduce_seconds(spec: ModelSpec, tp: int, tokens: int) -> float:
    """Two all-reduces per layer (after attention, after the MLP) of tokens x hidden BF16."""
    if tp <= 1:
        return 0.0
    per_call = ALLREDUCE_LATENCY_US * 1e-6 + tokens * spec.hidden * 2 / (LINK_GBS * 1e9)
    return 2 * spec.layers * per_call


def step_seconds(spec: ModelSpec, tp: int = 1, batch: int = 1, draft_len: int = 0) -> float:
    """One decode iteration for `batch` sequences, each drafting `draft_len` tokens."""
    read = spec.active_params_b * 1e9 * spec.bytes_per_param / tp
    base = read / (SPARK_BANDWIDTH_GBS * 1e9 * BANDWIDTH_EFFICIENCY) + STEP_OVERHEAD_MS / 1000
    base *= max(batch, 1) ** BATCH_EXPONENT
    base *= 1 + (VERIFY_COST + DRAFT_COST) * draft_len
    return base + allreduce_seconds(spec, tp, max(batch, 1) * (draft_len + 1))


def position_accept(i: int) -> float:
    """P(position i accepted | positions 1..i-1 accepted), i from 1."""
    return ACCEPT_FIRST * ACCEPT_DECAY ** (i - 1)


def survival(draft_len: int) -> list[float]:
    """P(at least i draft tokens accepted), i = 1..draft_len."""
    out, p = [], 1.0
    for i in range(1, draft_len + 1):
        p *= position_accept(i)
        out.append(p)
    return out


def expected_accepted(draft_len: int) -> float:
    return sum(survival(draft_len))


def accepted_draw(draft_len: int, u: float) -> int:
    """Accepted draft tokens for a uniform draw u in [0, 1) (inverse CDF)."""
    return sum(1 for p in survival(draft_len) if u < p)


def decode_rate(model: str, tp: int = 1, draft_len: int = 0, batch: int = 1) -> float:
    """Expected tokens/s of ONE request in a batch of `batch` (multiply by batch: aggregate)."""
    spec = spec_of(model)
    return (1 + expected_accepted(draft_len)) / step_seconds(spec, tp, batch, draft_len)


def prefill_seconds(spec: ModelSpec, tp: int, tokens: int) -> float:
    """A context of `tokens` tokens: linear FLOPs + causal attention, split by tp, + all-reduces."""
    linear = 2 * spec.active_params_b * 1e9 * tokens
    attention = 4 * spec.layers * spec.attn_dim * tokens * tokens / 2
    compute = (linear + attention) / (PREFILL_TFLOPS * 1e12 * tp)
    return compute + allreduce_seconds(spec, tp, tokens)
