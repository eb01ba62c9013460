"""The text of `sparkctl advise`: one row per layout (fit, predicted, measured), the pick, and
with --explain the arithmetic behind every prediction."""

from __future__ import annotations

from orchestrator.advise.advice import Advice, LayoutAdvice


def _tg(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _row(a: LayoutAdvice, measured: bool) -> str:
    gb = f"{a.per_node_gb:.0f}" if a.per_node_gb >= 1 else f"{a.per_node_gb:.2g}"  # a lab model
    fit = f"{a.verdict} ({gb} GB weights/node)"
    row = (f"{a.layout.label:13} {a.layout.nodes:>5} {fit:36} {a.predicted.tg_c1:>8.1f} "
           f"{a.predicted.tg_aggregate:>9.1f}")
    if measured:
        m = a.measured
        row += ("   not measured" if m is None else f"   {m.error[:40]}" if m.error else
                f" {_tg(m.tg_c1):>9} {_tg(m.tg_aggregate):>10}")
    return row


def lines(advice: Advice, explain: bool = False) -> list[str]:
    c = advice.concurrency
    measured = any(a.measured is not None for a in advice.layouts)
    facts = advice.facts
    out = [f"{advice.recipe.name}: {advice.recipe.model} with {advice.engine.title} on "
           f"{advice.nodes} node(s); goal {advice.goal} "
           f"({'tg at 1 request' if advice.goal == 'latency' else f'aggregate tg at {c} requests'})",
           f"model: {facts.active_params_b:g}B read per token x {facts.bytes_per_param:g} B/param"
           + (f" ({facts.note})" if facts.note else "")
           + (f"; drafting {advice.drafting.draft_len} tokens per step, acceptance length "
              f"{advice.drafting.tokens_per_step:.2f}" if advice.drafting else ""),
           f"hardware: {'; '.join(advice.hardware.sources)}; engine efficiency "
           f"{advice.efficiency:g}", ""]
    head = f"{'layout':13} {'nodes':>5} {'memory':36} {'pred c1':>8} {f'pred c{c}':>9}"
    if measured:
        head += f" {'meas c1':>9} {f'meas c{c}':>10}"
    out.append(head)
    out += [_row(a, measured) for a in advice.layouts]
    out.append("")
    if advice.pick is None:
        out.append(f"pick: none: {advice.reason}")
    else:
        out.append(f"pick: {advice.pick.layout.label} for {advice.goal} ({advice.confidence} "
                   f"confidence: {advice.reason})")
    out += [f"note: {n}" for n in advice.notes]
    if explain:
        for a in advice.layouts:
            out += ["", f"== {a.layout.label}: memory {a.memory}", *a.predicted.lines]
    return out
