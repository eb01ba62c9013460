"""`sparkctl advise`, the pure part: every layout the recipe's engine supports on N nodes, its
memory fit per node (the engine's own estimate) and its predicted decode speed, then the pick
for the goal and how sure it is. No cluster access.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from orchestrator.advise.facts import ModelFacts
from orchestrator.advise.model import Drafting, Hardware, Prediction, predict
from orchestrator.engines.layouts import DEFAULT_EFFICIENCY, Layout, support_of

Goal = Literal["latency", "throughput"]
CLOSE = 0.03
"""Predictions within 3 % are a tie: the layout with fewer nodes wins (the others stay free)."""


@dataclass
class Measured:
    tg_c1: float | None
    tg_aggregate: float | None
    error: str | None = None


@dataclass
class LayoutAdvice:
    layout: Layout
    recipe: Any
    """One server's recipe (replicas: each replica's, placed at launch)."""
    fits: bool
    verdict: str
    per_node_gb: float
    """Weights (and draft) per node: what the layout changes; `memory` has the rest."""
    memory: str
    predicted: Prediction
    measured: Measured | None = None

    def value(self, goal: Goal, measured: bool = False) -> float | None:
        if measured:
            if self.measured is None or self.measured.error:
                return None
            return self.measured.tg_c1 if goal == "latency" else self.measured.tg_aggregate
        return self.predicted.tg_c1 if goal == "latency" else self.predicted.tg_aggregate

    def ratio(self, goal: Goal = "latency") -> float | None:
        """Measured / predicted (for the goal's figure), once measured."""
        measured = self.value(goal, measured=True)
        predicted = self.predicted.tg_c1 if goal == "latency" else self.predicted.tg_aggregate
        return None if measured is None or not predicted else measured / predicted

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "layout": self.layout.label, "kind": self.layout.kind, "nodes": self.layout.nodes,
            "servers": self.layout.servers, "tp": self.layout.tp, "pp": self.layout.pp,
            "fits": self.fits, "memory": {"verdict": self.verdict, "weights_per_node_gb": self.per_node_gb,
                                          "explanation": self.memory},
            "predicted": {"tg_c1": round(self.predicted.tg_c1, 2),
                          "tg_aggregate": round(self.predicted.tg_aggregate, 2),
                          "concurrency": self.predicted.concurrency},
        }
        if self.measured is not None:
            out["measured"] = {"tg_c1": _round(self.measured.tg_c1),
                               "tg_aggregate": _round(self.measured.tg_aggregate),
                               "concurrency": self.predicted.concurrency,
                               "error": self.measured.error}
        return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


@dataclass
class Advice:
    recipe: Any
    engine: Any
    nodes: int
    goal: Goal
    concurrency: int
    context: int
    facts: ModelFacts
    efficiency: float
    hardware: Hardware
    drafting: Drafting | None
    layouts: list[LayoutAdvice]
    pick: LayoutAdvice | None = None
    confidence: str = "low"
    reason: str = ""
    notes: list[str] = field(default_factory=list)
    measured: bool = False

    def choose(self, measured: bool = False) -> None:
        """The best fitting layout for the goal (predicted, or measured after --measure)."""
        self.measured = measured
        scored = [(v, a) for a in self.layouts if a.fits
                  and (v := a.value(self.goal, measured)) is not None]
        if not scored:
            self.pick, self.confidence = None, "none"
            self.reason = ("no layout " + ("was measured" if measured else "fits in memory")
                           + f" on {self.nodes} node(s)")
            return
        best = max(v for v, _ in scored)
        close = [a for v, a in scored if v >= best * (1 - CLOSE)]
        self.pick = min(close, key=lambda a: a.layout.nodes)
        others = sorted((v for v, a in scored if a is not self.pick), reverse=True)
        what = "tg at one request" if self.goal == "latency" else \
            f"aggregate tg at {self.concurrency} requests"
        mine = self.pick.value(self.goal, measured) or 0.0
        basis = "measured" if measured else "predicted"
        if not others:
            self.confidence = "high"
            self.reason = f"the only layout that {'was measured' if measured else 'fits'}"
            return
        ratio = mine / others[0] if others[0] else math.inf
        self.confidence = "high" if ratio >= 1.5 else "medium" if ratio >= 1.15 else "low"
        if measured:
            self.confidence = "high" if ratio >= 1.15 else "medium" if ratio >= 1.03 else "low"
        elif self.efficiency_assumed and self.confidence == "high":
            self.confidence = "medium"
        self.reason = f"{basis} {what}: {mine:.1f} t/s, {ratio:.2f}x the next best"

    @property
    def efficiency_assumed(self) -> bool:
        return support_of(self.engine) is None

    def to_json(self) -> dict[str, Any]:
        return {
            "command": "advise", "ok": self.pick is not None, "recipe": self.recipe.name,
            "engine": self.engine.name, "model": self.recipe.model, "nodes": self.nodes,
            "goal": self.goal, "concurrency": self.concurrency, "context": self.context,
            "efficiency": self.efficiency, "model_facts": self.facts.note,
            "hardware": {"bandwidth_gbs": self.hardware.bandwidth_gbs,
                         "fabric_latency_us": self.hardware.fabric_latency_us,
                         "fabric_gbs": self.hardware.fabric_gbs,
                         "sources": list(self.hardware.sources)},
            "acceptance_length": round(self.drafting.tokens_per_step, 2) if self.drafting else None,
            "layouts": [a.to_json() for a in self.layouts],
            "pick": self.pick.layout.label if self.pick else None, "basis":
                "measured" if self.measured else "predicted",
            "confidence": self.confidence, "reason": self.reason, "notes": self.notes,
        }


def drafting_of(recipe: Any, facts: ModelFacts, acceptance: float | None) -> Drafting | None:
    if not recipe.draft_tokens:
        return None
    draft_gb = recipe.memory.draft_gb or facts.mtp_gb
    return Drafting(recipe.draft_tokens, draft_gb, acceptance)


def kv_fit(estimate: Any, facts: Any, layout: Any, context: int) -> tuple[bool, Any, str]:
    """The engine's memory verdict, unless the KV cache of one request of --context tokens
    (split over a server's nodes) exceeds what the engine leaves for the KV cache on a node:
    then no request of that length can be served, whatever the weights (a 10M-token context
    "fitted" before: only the weights were weighed). More requests than fit at once queue,
    which the predicted aggregate, not the fit, accounts for."""
    needed = context * facts.kv_bytes_per_token / 1e9 / (layout.tp * layout.pp)
    if not estimate.fits or needed <= estimate.kv_cache_gb:
        return estimate.fits, estimate.verdict, estimate.explanation
    return False, "does not fit", (
        f"{estimate.explanation}; but one request of {context:,} tokens of context needs "
        f"{needed:,.1f} GB of KV cache per node, more than the {estimate.kv_cache_gb:g} GB the "
        "engine leaves for it: does not fit at this --context")


def advise(recipe: Any, engine: Any, nodes: int, goal: Goal = "latency", concurrency: int = 4,
           hardware: Hardware | None = None, acceptance: float | None = None,
           context: int = 2048) -> Advice:
    """Raises ModelUnreadable when nothing says the model's architecture (no guess)."""
    from orchestrator.advise.modelsource import model_facts

    hardware = hardware or Hardware()
    facts = model_facts(recipe.model, recipe.revision, getattr(recipe, "gguf", None))
    support = support_of(engine)
    efficiency = support.efficiency if support else DEFAULT_EFFICIENCY
    drafting = drafting_of(recipe, facts, acceptance)
    notes = []
    if support is None:
        notes.append(f"{engine.title} states no layouts or efficiency for advise: only the "
                     f"recipe's own layout, efficiency {DEFAULT_EFFICIENCY:g} assumed")
        own = recipe.node_count
        layouts = [Layout("single") if own == 1 else Layout("tp", tp=own)]
    else:
        layouts = support.layouts(recipe, nodes)
    advice = Advice(recipe, engine, nodes, goal, concurrency, context, facts, efficiency,
                    hardware, drafting, [], notes=notes)
    for layout in layouts:
        one = support.recipe_for(recipe, layout, None) if support else recipe
        estimate = engine.estimate_memory(one)
        slots = support.slots(one) if support and hasattr(support, "slots") else None
        prediction = predict(facts, layout, hardware, efficiency, concurrency, drafting, context,
                             slots)
        fits, verdict, explanation = kv_fit(estimate, facts, layout, context)
        advice.layouts.append(LayoutAdvice(layout, one, fits, verdict,
                                           round(estimate.weights_gb + estimate.draft_gb, 2),
                                           explanation, prediction))
    if any(a.layout.kind == "replicas" for a in advice.layouts):
        advice.notes.append("replicas: one server per node; until a gateway spreads requests, "
                            "clients pick a server (sparkctl chat --server NAME)")
    advice.choose()
    return advice
