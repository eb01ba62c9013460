"""Which layouts an engine can serve a recipe in on N nodes, and the recipe of each: the seam
`sparkctl advise` (orchestrator/advise/) predicts and measures through, whatever the engine.

An engine opts in with a `layouts` attribute on its ENGINE object (a `LayoutSupport`): the
layouts it supports, how to turn a recipe into one server of a layout, and its one decode
efficiency factor (documented where it is set, with the published figures it was fitted to).
An engine without it is advised as served today (its recipe's own layout) with a default factor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

Kind = Literal["single", "tp", "pp", "replicas"]

DEFAULT_EFFICIENCY = 0.6
"""For an engine that states none: between the fitted ones (docs/advise.md)."""


@dataclass(frozen=True)
class Layout:
    """How a model is spread over nodes: `servers` servers, each spanning tp x pp nodes."""

    kind: Kind
    tp: int = 1
    pp: int = 1
    servers: int = 1

    @property
    def nodes(self) -> int:
        return self.tp * self.pp * self.servers

    @property
    def label(self) -> str:
        if self.kind == "replicas":
            return f"replicas x{self.servers}"
        if self.kind == "single":
            return "single"
        return f"{self.kind}{self.tp if self.kind == 'tp' else self.pp}"


def standard_layouts(nodes: int, kinds: tuple[Kind, ...]) -> list[Layout]:
    """Single node, then each multi-node kind the engine supports over all `nodes`."""
    out = [Layout("single")] if "single" in kinds else []
    if nodes > 1:
        if "tp" in kinds:
            out.append(Layout("tp", tp=nodes))
        if "pp" in kinds:
            out.append(Layout("pp", pp=nodes))
        if "replicas" in kinds:
            out.append(Layout("replicas", servers=nodes))
    return out


class LayoutSupport(Protocol):
    """May also have `slots(recipe) -> int`: the requests one server decodes at once (an
    engine with a fixed number of slots; the others batch whatever arrives)."""

    efficiency: float
    """Share of the memory bandwidth (and compute) a decode step of this engine reaches."""
    published: tuple[Published, ...]
    """The published figures `efficiency` comes from (and is checked against)."""

    def layouts(self, recipe: Any, nodes: int) -> list[Layout]:
        """The layouts this engine can serve `recipe` in on `nodes` nodes (single first)."""
        ...

    def recipe_for(self, recipe: Any, layout: Layout, placement: list[str] | None) -> Any:
        """The recipe of ONE server of `layout` (a replica is a single-node server), placed on
        `placement` (inventory node names) when given; validated like any recipe."""
        ...


def support_of(engine: Any) -> LayoutSupport | None:
    from orchestrator.engines.capabilities import Advisable

    return engine.layouts if isinstance(engine, Advisable) else None


def revalidated(recipe: Any, **update: Any) -> Any:
    """The recipe with `update` applied and validated again (model_copy would skip the
    validators that refuse what the engine would refuse)."""
    from pydantic import ValidationError

    from orchestrator.errors import InputError

    data = {**recipe.model_dump(mode="json"), **update, "source": recipe.source}
    try:
        return type(recipe).model_validate(data)
    except ValidationError as exc:
        from orchestrator.engines import explain

        raise InputError(explain(recipe.source, exc)) from None


Role = Literal["fit", "held-out", "outlier"]


@dataclass(frozen=True)
class Published:
    """A published decode figure on Sparks: what an engine's efficiency is fitted to
    ("fit"), checked against ("held-out"), or shown beside its prediction only ("outlier")."""

    label: str
    model: str
    """Hugging Face id (its facts: orchestrator/advise/facts.py)."""
    layout: Layout
    concurrency: int
    tg: float
    """Decode t/s: per request at concurrency 1, aggregate above."""
    source: str
    role: Role = "fit"
    draft_len: int = 0
    draft_gb: float = 0.0
    """Per draft step (0 with draft_len: the model's own MTP head, from its facts)."""
