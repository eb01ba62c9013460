"""Predictions against the published figures every engine's efficiency comes from (each engine
lists its own in its layouts module): `sparkctl advise --published` prints them with the error
of each, and tests/unit/test_advise.py holds them to 35 % (40 % for held-out figures)."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.advise.facts import FACTS
from orchestrator.advise.model import Drafting, Hardware, predict
from orchestrator.engines.layouts import Published, support_of

TOLERANCE = {"fit": 0.35, "held-out": 0.40}
"""How far a prediction may be from a figure it was fitted to, or one it has not seen."""


@dataclass
class Row:
    engine: str
    figure: Published
    predicted: float
    lines: list[str]

    @property
    def error(self) -> float:
        return self.predicted / self.figure.tg - 1

    @property
    def within(self) -> bool | None:
        limit = TOLERANCE.get(self.figure.role)
        return None if limit is None else abs(self.error) <= limit


def evaluate(hardware: Hardware | None = None) -> list[Row]:
    from orchestrator.engines import REGISTRY, get_engine

    hardware = hardware or Hardware()
    rows = []
    for name in sorted(REGISTRY):
        engine = get_engine(name)
        support = support_of(engine)
        for figure in getattr(support, "published", ()):
            facts = FACTS[figure.model]
            drafting = (Drafting(figure.draft_len, figure.draft_gb or facts.mtp_gb)
                        if figure.draft_len else None)
            prediction = predict(facts, figure.layout, hardware, support.efficiency,  # type: ignore[union-attr]
                                 figure.concurrency, drafting)
            value = prediction.tg_c1 if figure.concurrency == 1 else prediction.tg_aggregate
            rows.append(Row(engine.title, figure, value, prediction.lines))
    return rows


def render(rows: list[Row]) -> list[str]:
    out = [f"{'engine':13} {'figure':52} {'c':>2} {'published':>9} {'predicted':>9} "
           f"{'error':>7}  role"]
    for row in rows:
        f = row.figure
        mark = {True: "", False: "  OUT OF TOLERANCE", None: "  (not fitted)"}[row.within]
        out.append(f"{row.engine:13} {f.label[:52]:52} {f.concurrency:>2} {f.tg:>9.1f} "
                   f"{row.predicted:>9.1f} {row.error:>+7.0%}  {f.role}{mark}")
    out += [f"  {r.figure.label}: {r.figure.source}" for r in rows]
    return out
