"""bench plots a person would rather look at (matplotlib, written to a file).

One generation panel per depth (concurrency on a categorical axis: c1, c4, c8 are runs, not
points on a line between them), a prefill panel and a TTFT panel (by depth), error bars of one
standard deviation over the runs, model / engine / recipe / date in the title. A value that was
not measured is left out, never drawn as 0. Several runs (a saved run and another, `bench
compare --plot`, `bench plot A.json B.json`) share the panels, one colour each.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from orchestrator.bench.sweep import sweep_rows
from orchestrator.errors import InputError

Run = tuple[str, dict[str, Any]]
"""(legend label, result document)."""


def check_plot_path(path: str) -> None:
    """Refuse an unwritable plot path before minutes of measuring (exit 2)."""
    target = Path(path).expanduser()
    if target.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise InputError(f"--plot {path}: name a .png, .svg or .pdf file")
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise InputError(f"--plot {path}: is a directory")
    if not folder.is_dir():
        raise InputError(f"--plot {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise InputError(f"--plot {path}: not writable by this user")


def describe(doc: dict[str, Any]) -> str:
    server = doc.get("server") or {}
    date = str(doc.get("started") or "")[:16].replace("T", " ")
    parts = [server.get("model"), server.get("engine"),
             f"recipe {server['recipe']}" if server.get("recipe") else None, date or None]
    return " / ".join(str(p) for p in parts if p)


def _value(cell: dict[str, Any], name: str) -> tuple[float, float] | None:
    figure = (cell.get("figures") or {}).get(name)
    return (float(figure["mean"]), float(figure["std"])) if figure else None


Series = tuple[list[Any], list[float], list[float]]


def _series(doc: dict[str, Any], name: str, keep: Any, x_of: Any) -> Series:
    """(x, mean, std) of figure `name` over the cells `keep` accepts; unmeasured cells left out."""
    xs: list[Any] = []
    means: list[float] = []
    stds: list[float] = []
    for cell in doc.get("cells") or []:
        found = _value(cell, name) if keep(cell) else None
        if found is not None:
            xs.append(x_of(cell))
            means.append(found[0])
            stds.append(found[1])
    return xs, means, stds


def _categorical(ax: Any, labels: list[str]) -> dict[str, int]:
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlim(-0.6, len(labels) - 0.4)
    return {label: i for i, label in enumerate(labels)}


def plot_runs(runs: list[Run], path: str, title: str | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs = [doc for _, doc in runs]
    depths = sorted({c["depth"] for d in docs for c in d.get("cells") or []}) or [0]
    concs = [f"c{c}" for c in sorted({c["concurrency"] for d in docs for c in d.get("cells") or []})]
    panels = len(depths) + 2
    cols = 2 if panels == 4 else min(panels, 3)
    rows = (panels + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.2 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    width = 0.8 / max(1, len(runs))
    for k, (label, doc) in enumerate(runs):
        colour = colours[k % len(colours)]
        tgs = sorted({c["tg"] for c in doc.get("cells") or []})
        for ax, depth in zip(flat, depths, strict=False):
            slots = _categorical(ax, concs)
            for j, tg in enumerate(tgs):
                xs, ys, es = _series(doc, "tg_throughput",
                                     lambda c, d=depth, t=tg: c["depth"] == d and c["tg"] == t,
                                     lambda c, s=slots: s[f"c{c['concurrency']}"])
                offset = (k - (len(runs) - 1) / 2) * width * 0.5 + j * 0.04
                ax.errorbar([x + offset for x in xs], ys, yerr=es, marker="o", capsize=3,
                            color=colour, alpha=1.0 - 0.3 * j,
                            label=f"{label} tg{tg}" if label else f"tg{tg}")
            ax.set_title(f"generation at depth {depth:,}")
            ax.set_xlabel("concurrent requests")
            ax.set_ylabel("generation tokens/s (all requests)")
        depth_slots = [f"d{d:,}" for d in depths]
        for ax, name, ylabel in ((flat[len(depths)], "pp_throughput", "prefill tokens/s"),
                                 (flat[len(depths) + 1], "e2e_ttft_ms", "time to first token (ms)")):
            slots = _categorical(ax, depth_slots)
            for i, conc in enumerate(concs):
                xs, ys, es = _series(doc, name, lambda c, n=conc: f"c{c['concurrency']}" == n,
                                     lambda c, s=slots: s[f"d{c['depth']:,}"])
                if not xs:
                    continue
                bar = 0.8 / (len(runs) * len(concs))  # every run's every concurrency in a slot
                shift = -0.4 + bar * (k * len(concs) + i + 0.5)
                ax.bar([x + shift for x in xs], ys, yerr=es, capsize=3, width=bar, color=colour,
                       alpha=1.0 - 0.5 * i / max(1, len(concs)),
                       label=f"{label} {conc}".strip())
            ax.set_title(ylabel.split(" (")[0] + " by context depth")
            ax.set_xlabel("context depth (tokens)")
            ax.set_ylabel(ylabel)
    for ax in flat[:panels]:
        ax.grid(True, axis="y", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    for ax in flat[panels:]:
        ax.set_visible(False)
    fig.suptitle(title or " vs ".join(dict.fromkeys(describe(d) for d in docs)), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_sweep(doc: dict[str, Any], path: str) -> None:
    """A sweep: the panels of every value, then throughput and acceptance length per value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = doc["sweep"]
    runs = sweep["runs"]
    plot_runs([(f"{sweep['key']}={r['value']}", r) for r in runs], path,
              title=f"sweep of {sweep['key']}: " + (describe(runs[0]) if runs else ""))
    base = Path(path)
    second = str(base.with_name(base.stem + "-sweep" + base.suffix))
    rows = sweep_rows(runs)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    labels = [str(r["value"]) for r in rows]
    slots = _categorical(ax, labels)
    scored = [(slots[str(r["value"])], r["score"]) for r in rows if r["score"] is not None]
    ax.bar([x for x, _ in scored], [y for _, y in scored], color="tab:blue", alpha=0.7)
    ax.set_xlabel(sweep["key"])
    ax.set_ylabel("generation tokens/s at the lowest concurrency")
    known = [(slots[str(r["value"])], r["acceptance_length"]) for r in rows
             if r["acceptance_length"] is not None]
    if known:  # an engine that reports no acceptance gets no line, not a line at 0
        twin = ax.twinx()
        twin.plot([x for x, _ in known], [y for _, y in known], color="tab:red", marker="o")
        twin.set_ylabel("acceptance length", color="tab:red")
    ax.set_title(f"vs {sweep['key']} (best {sweep['best']})")
    fig.tight_layout()
    fig.savefig(second, dpi=100)
    plt.close(fig)


def plot(doc: dict[str, Any], path: str) -> list[str]:
    """The plot(s) of one result document (a run or a sweep); returns the files written."""
    if "sweep" in doc:
        plot_sweep(doc, path)
        base = Path(path)
        return [path, str(base.with_name(base.stem + "-sweep" + base.suffix))]
    plot_runs([("", doc)], path)
    return [path]
