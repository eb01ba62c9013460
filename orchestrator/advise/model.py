"""Decode speed from first principles (pure): a decode step reads every active weight once
(split by tensor parallelism), the KV cache of every request in the batch, and verifies the
drafted tokens; multi-node layouts add collectives over the fabric. One efficiency factor per
engine scales what the memory and compute reach. docs/advise.md explains every term and the
published figures the constants come from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.advise.facts import ModelFacts
from orchestrator.engines.layouts import Layout

SPARK_BANDWIDTH_GBS = 273.0
"""NVIDIA's DGX Spark spec sheet: 128 GB LPDDR5x, 273 GB/s."""
SPARK_PREFILL_TFLOPS = 80.0
"""Dense compute a step reaches on one Spark: the seed blog's ~1,500 t/s pp2048 with the 27B
dense Qwen3.6 is 2 x 27e9 x 1,500 = 81 TFLOPS."""
FABRIC_LATENCY_US = 60.0
"""One small all-reduce over the Sparks' fabric: 54-64 us for 48 KB across 4 Sparks (b12x
PR#295). netcheck's measured round trip replaces it (advise --netcheck)."""
FABRIC_GBS = 23.7
"""NCCL all_gather bus bandwidth between two Sparks (NVIDIA's NCCL playbook; 23.74 GB/s in
playbooks PR#103); netcheck's nccl-busbw or iperf3 figure replaces it."""
COLLECTIVE_SOFTWARE_US = 90.0
"""What each collective of a decode step costs above the fabric's latency (launch, host
synchronisation): what the two-Spark figures imply next to the single-node ones, shared by
every engine (docs/advise.md, "Fitting")."""
DRAFT_ACCEPT = 0.7
"""Chance each drafted token is accepted given the earlier ones were (MTP / Eagle heads:
60-70 % reported; acceptance lengths 2.8-3.7 at 3-5 drafts, REFERENCE.md section 6)."""


@dataclass(frozen=True)
class Hardware:
    bandwidth_gbs: float = SPARK_BANDWIDTH_GBS
    tflops: float = SPARK_PREFILL_TFLOPS
    fabric_latency_us: float = FABRIC_LATENCY_US
    fabric_gbs: float = FABRIC_GBS
    sources: tuple[str, ...] = ("memory bandwidth 273 GB/s (Spark spec sheet)",
                                "fabric 60 us per collective, 23.7 GB/s (published)")


@dataclass(frozen=True)
class Drafting:
    """Speculative decoding: `draft_len` tokens proposed per step, each draft step reading
    `draft_gb`; `acceptance` = tokens per step (1 + accepted drafts), modelled when not given."""

    draft_len: int
    draft_gb: float
    acceptance: float | None = None

    @property
    def tokens_per_step(self) -> float:
        if self.acceptance is not None:
            return self.acceptance
        a = DRAFT_ACCEPT
        return (1 - a ** (self.draft_len + 1)) / (1 - a)


@dataclass
class Step:
    """One decode step of one server at `batch` requests: seconds and the arithmetic."""

    batch: float
    seconds: float
    tokens_per_request: float
    lines: list[str] = field(default_factory=list)

    @property
    def per_request(self) -> float:
        return self.tokens_per_request / self.seconds

    @property
    def aggregate(self) -> float:
        return self.per_request * self.batch


def weights_read_gb(facts: ModelFacts, batch: float) -> float:
    """GB of weights one step reads (whole model): MoE steps with several requests touch more
    distinct experts, E x (1 - (1 - k/E)^batch) instead of k."""
    total = facts.active_params_b * facts.bytes_per_param
    if not facts.experts:
        return total
    e, k = facts.experts, facts.experts_per_token
    touched = e * (1 - (1 - k / e) ** max(batch, 1.0))
    return total * (1 - facts.expert_share) + total * facts.expert_share * touched / k


def step(facts: ModelFacts, layout: Layout, hw: Hardware, efficiency: float, batch: float,
         drafting: Drafting | None, context: int) -> Step:
    """One server of `layout` at `batch` concurrent requests."""
    split = layout.tp * layout.pp
    verify = 1 + (drafting.draft_len if drafting else 0)
    weights = weights_read_gb(facts, batch * verify)
    draft = drafting.draft_len * drafting.draft_gb if drafting else 0.0
    kv = batch * context * facts.kv_bytes_per_token / 1e9
    node_gb = (weights + draft + kv) / split
    # pipeline stages run one after the other for a token: every stage's read is on the path
    path_gb = node_gb * layout.pp
    memory = path_gb / hw.bandwidth_gbs
    flops = 2 * facts.active_params_b * 1e9 * batch * verify
    compute = flops / (hw.tflops * 1e12 * layout.tp)
    busy = (memory + compute) / efficiency
    message = batch * verify * facts.hidden * 2  # BF16 activations of every token in the step
    per_call = (hw.fabric_latency_us + COLLECTIVE_SOFTWARE_US) * 1e-6 + message / (hw.fabric_gbs * 1e9)
    calls = 2 * facts.layers if layout.tp > 1 else 0
    calls += layout.pp - 1  # one activation hand-over between consecutive stages
    fabric = calls * per_call
    seconds = busy + fabric
    tokens = drafting.tokens_per_step if drafting else 1.0
    lines = [
        f"batch {batch:g}: read {weights:.2f} GB weights"
        + (f" + {draft:.2f} GB drafting ({drafting.draft_len} x {drafting.draft_gb:g})" if drafting else "")
        + f" + {kv:.2f} GB KV ({batch:g} x {context} tokens x {facts.kv_bytes_per_token / 1e3:.0f} KB)"
        + (f", / {split} nodes = {node_gb:.2f} GB per node" if split > 1 else "")
        + (f", x {layout.pp} stages in turn" if layout.pp > 1 else "")
        + f" / {hw.bandwidth_gbs:g} GB/s = {memory * 1e3:.1f} ms",
        f"  compute {flops / 1e12:.2f} TFLOP / ({hw.tflops:g} TFLOPS x {layout.tp}) = "
        f"{compute * 1e3:.1f} ms; ({memory * 1e3:.1f} + {compute * 1e3:.1f}) / efficiency "
        f"{efficiency:g} = {busy * 1e3:.1f} ms",
    ]
    if calls:
        lines.append(f"  fabric {calls} collectives x ({hw.fabric_latency_us:g} + "
                     f"{COLLECTIVE_SOFTWARE_US:g} us + {message / 1e3:.0f} KB / "
                     f"{hw.fabric_gbs:g} GB/s) = {fabric * 1e3:.1f} ms")
    lines.append(f"  step {seconds * 1e3:.1f} ms x {tokens:.2f} token(s) per step -> "
                 f"{tokens / seconds:.1f} t/s per request, {batch * tokens / seconds:.1f} t/s "
                 "aggregate")
    return Step(batch, seconds, tokens, lines)


@dataclass
class Prediction:
    tg_c1: float
    tg_aggregate: float
    concurrency: int
    lines: list[str]


def predict(facts: ModelFacts, layout: Layout, hw: Hardware, efficiency: float,
            concurrency: int, drafting: Drafting | None = None, context: int = 2048,
            slots: int | None = None) -> Prediction:
    """Decode t/s of one request alone, and the aggregate at `concurrency` requests spread
    evenly over the layout's servers (replicas each take their share). A server with `slots`
    decodes at most that many at once; the rest wait their turn (llama.cpp's -np)."""
    one = step(facts, layout, hw, efficiency, 1, drafting, context)
    share = concurrency / layout.servers
    batch = min(share, slots) if slots else share
    many = step(facts, layout, hw, efficiency, batch, drafting, context)
    aggregate = many.aggregate * layout.servers
    lines = ["one request:", *one.lines, f"{concurrency} requests"
             + (f" ({share:g} on each of {layout.servers} servers)" if layout.servers > 1 else "")
             + (f", {batch:g} at a time ({slots} slot(s) per server)" if batch < share else "")
             + ":", *many.lines]
    if layout.servers > 1:
        lines.append(f"  x {layout.servers} servers = {aggregate:.1f} t/s aggregate")
    return Prediction(one.per_request, aggregate, concurrency, lines)
