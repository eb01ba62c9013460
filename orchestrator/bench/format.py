"""bench results as the community pastes them: llama-benchy's markdown table, and CSV.

llama-benchy's layout: `| model | test | t/s | ttfr (ms) | est_ppt (ms) | e2e_ttft (ms) |`,
one prefill row (`pp2048`, `pp2048 @ d4096`) and one generation row (`tg32`, `tg32 @ d4096`)
per depth, every value `mean ± std` over the runs; the latency columns are empty on tg rows. A
concurrency above 1 is added to the test name (`tg32 @ d4096 c4`): llama-benchy's own rows are
single-request. Pure functions over a result document (bench/run.py's schema).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import Any

HEADER = ("model", "test", "t/s", "ttfr (ms)", "est_ppt (ms)", "e2e_ttft (ms)")
LATENCIES = ("ttfr_ms", "est_ppt_ms", "e2e_ttft_ms")


@dataclass(frozen=True)
class Row:
    """One table row: which test, at which depth and concurrency, and its figures
    (name -> {"mean", "std", ...} or None when not measured)."""

    test: str
    depth: int
    concurrency: int
    kind: str
    """"pp" or "tg"."""
    speed: dict[str, Any] | None
    latencies: tuple[dict[str, Any] | None, ...]
    why: str = ""
    """Why `speed` is empty (said under the table, never a blank cell without a reason)."""


def unmeasured(figures: dict[str, Any], kind: str) -> str:
    """Why a cell's pp or tg speed has no value."""
    if figures.get("error_count") and figures.get("error_count") == figures.get("requests"):
        return "every request failed"
    if kind == "pp":
        return ("the first token came back within the latency measured through the forward, "
                "so no prefill time was left to divide the prompt by (a longer --pp or --depth "
                "measures it)")
    return "no request produced two tokens or more (a larger --tg measures it)"


def test_name(kind: str, tokens: int, depth: int, concurrency: int) -> str:
    return f"{kind}{tokens}" + (f" @ d{depth}" if depth else "") + (
        f" c{concurrency}" if concurrency > 1 else "")


def rows(doc: dict[str, Any]) -> list[Row]:
    """pp then tg rows per depth (and concurrency), in the run's order; every depth."""
    cells = doc.get("cells") or []
    out: list[Row] = []
    seen: set[tuple[str, int, int, int]] = set()
    for cell in cells:
        figures = cell.get("figures") or {}
        depth, c = cell["depth"], cell["concurrency"]
        pp_key = ("pp", cell["pp"], depth, c)
        if pp_key not in seen:  # the first cell of a (pp, depth, c) gives the prefill row
            seen.add(pp_key)
            out.append(Row(test_name("pp", cell["pp"], depth, c), depth, c, "pp",
                           figures.get("pp_throughput"),
                           tuple(figures.get(k) for k in LATENCIES),
                           "" if figures.get("pp_throughput") else unmeasured(figures, "pp")))
        tg_key = ("tg", cell["tg"], depth, c)
        if tg_key not in seen:
            seen.add(tg_key)
            out.append(Row(test_name("tg", cell["tg"], depth, c), depth, c, "tg",
                           figures.get("tg_throughput"), (None, None, None),
                           "" if figures.get("tg_throughput") else unmeasured(figures, "tg")))
    # llama-benchy groups by depth: pp rows and tg rows of one depth together
    order = {depth: i for i, depth in enumerate(dict.fromkeys(r.depth for r in out))}
    return sorted(out, key=lambda r: (order[r.depth], r.concurrency, r.kind != "pp"))


def pm(value: dict[str, Any] | None) -> str:
    """`mean ± std` with two decimals, as llama-benchy prints; empty when not measured."""
    if not value:
        return ""
    return f"{value['mean']:.2f} ± {value['std']:.2f}"


def model_name(doc: dict[str, Any]) -> str:
    return str((doc.get("server") or {}).get("model") or "?")


def markdown(doc: dict[str, Any]) -> str:
    """The llama-benchy table, then one line saying what was measured and when."""
    model = model_name(doc)
    lines = ["| " + " | ".join(HEADER) + " |",
             "|:" + "-" * 5 + "|" + "|".join(["-" * 5 + ":"] * (len(HEADER) - 1)) + "|"]
    blanks: dict[str, list[str]] = {}
    for row in rows(doc):
        speed = pm(row.speed) or ("n/a" if row.why else "")
        lines.append("| " + " | ".join([model, row.test, speed,
                                        *(pm(v) for v in row.latencies)]) + " |")
        if row.why:
            blanks.setdefault(row.why, []).append(row.test)
    server = doc.get("server") or {}
    settings = doc.get("settings") or {}
    notes = [f"n/a ({', '.join(tests)}): {why}" for why, tests in blanks.items()]
    lines += ["", *notes, *([""] if notes else []),
              f"sparkctl bench: recipe {server.get('recipe', '?')}, engine "
              f"{server.get('engine', '?')}, {settings.get('runs', '?')} run(s) per test, "
              f"{doc.get('started', '?')}"]
    if doc.get("interrupted"):
        lines.append("INTERRUPTED: partial results")
    return "\n".join(lines) + "\n"


CSV_FIGURES = ("t_s", "ttfr_ms", "est_ppt_ms", "e2e_ttft_ms")


def csv_text(doc: dict[str, Any]) -> str:
    """One line per markdown row: mean, std, p50, p90 of every column (empty when unknown)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    stats = ("mean", "std", "p50", "p90")
    writer.writerow(["model", "test", "kind", "depth", "concurrency",
                     *(f"{f}_{s}" for f in CSV_FIGURES for s in stats)])
    for row in rows(doc):
        values: list[str] = []
        for figure in (row.speed, *row.latencies):
            values += ["" if not figure or figure.get(s) is None else f"{figure[s]:.4f}"
                       for s in stats]
        writer.writerow([model_name(doc), row.test, row.kind, row.depth, row.concurrency, *values])
    return buffer.getvalue()


def sweep_markdown(sweep: dict[str, Any]) -> str:
    """A sweep: one llama-benchy table per value, each under a heading naming it."""
    parts = [f"### {sweep['key']} = {run.get('value')}\n\n{markdown(run)}" for run in sweep["runs"]]
    return "\n".join(parts) if parts else "(no value was measured)\n"


def sweep_csv(sweep: dict[str, Any]) -> str:
    out = ""
    for index, run in enumerate(sweep["runs"]):
        text = csv_text(run).splitlines(keepends=True)
        key = sweep["key"]
        header, body = text[0], text[1:]
        if index == 0:
            out += f"{key}," + header
        out += "".join(f"{run.get('value')},{line}" for line in body)
    return out
