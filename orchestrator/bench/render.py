"""Showing bench results: the owners' table (rich), a sweep table, two runs compared (plots:
bench_plot.py; llama-benchy's markdown and CSV: bench_format.py)."""

from __future__ import annotations

from typing import Any

from orchestrator.bench.run import figure, find, peak, spec_summary
from orchestrator.bench.sweep import sweep_rows


def num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _concurrencies(doc: dict[str, Any]) -> list[int]:
    return sorted({c["concurrency"] for c in doc.get("cells", [])})


def gen_cell(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "-"
    total, per = figure(cell, "tg_throughput"), figure(cell, "tg_req_throughput")
    if cell["concurrency"] == 1:
        return num(total)
    return f"{num(total)} ({num(per)}/req)"


def pp_cell(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "-"
    return f"{num(figure(cell, 'pp_throughput'), 0)} t/s, TTFT {num(figure(cell, 'ttft_ms'), 0)} ms"


def result_rows(doc: dict[str, Any]) -> list[list[str]]:
    """Rows of the owners' table: tgN (depth 0), ppN @ depth D, peak, acceptance."""
    s = doc["settings"]
    conc = _concurrencies(doc)
    pp0, depth0, tg0 = s["pp"][0], s["depth"][0], s["tg"][0]
    rows = []
    for tg in s["tg"]:
        rows.append([f"tg{tg} (t/s)" + (f" @ d{depth0}" if depth0 else "")]
                    + [gen_cell(find(doc, depth0, pp0, tg, c)) for c in conc])
    for pp in s["pp"]:
        for depth in s["depth"]:
            rows.append([f"pp{pp}, depth {depth:,}"] + [pp_cell(find(doc, depth, pp, tg0, c))
                                                        for c in conc])
    peaks = []
    for c in conc:
        found = [figure(cell, "peak_throughput") for cell in doc["cells"] if cell["concurrency"] == c]
        values = [v for v in found if v is not None]
        peaks.append(num(max(values)) if values else "-")
    rows.append(["peak (t/s)", *peaks])
    spec_row = ["spec. decoding: acceptance rate / length"]
    for c in conc:
        rates = [cell["spec_decoding"] for cell in doc["cells"]
                 if cell["concurrency"] == c and cell.get("spec_decoding")]
        if rates:
            part = {"cells": [{"spec_decoding": r, "concurrency": c} for r in rates]}
            summary = spec_summary(part) or {}
            spec_row.append(f"{num(summary.get('acceptance_rate'), 2)} / "
                            f"{num(summary.get('acceptance_length'), 2)}")
        else:
            spec_row.append("-")
    rows.append(spec_row)
    return rows


def header_lines(doc: dict[str, Any]) -> list[str]:
    server = doc.get("server") or {}
    lines = [f"{server.get('model', '?')} - recipe {server.get('recipe', '?')} "
             f"(config {server.get('config_hash', '?')}), engine {server.get('engine', '?')}",
             f"image {server.get('image', '?')} @ {server.get('image_digest') or '?'}"]
    s = doc["settings"]
    lines.append(f"{s['runs']} run(s) per cell{', after a warmup' if s['warmup'] else ''}; "
                 f"latency {num(doc.get('latency_ms'))} ms subtracted from TTFT")
    value, at = peak(doc)
    if value is not None:
        lines.append(f"peak burst: {num(value)} t/s at c{at}")
    notes = {c.get("spec_note") for c in doc.get("cells", []) if c.get("spec_note")}
    lines += [f"speculative decoding: {n}" for n in sorted(notes)]
    if doc.get("interrupted"):
        lines.append("INTERRUPTED: partial results")
    return lines


def node_rows(doc: dict[str, Any]) -> list[list[str]]:
    cells = doc.get("cells") or []
    state = (cells[-1].get("nodes") if cells else None) or doc.get("nodes_before") or {}
    rows = []
    for node, s in state.items():
        if "error" in s:
            rows.append([node, s["error"], "", "", ""])
            continue
        rows.append([node, f"{num(s.get('sm_clock_mhz'), 0)} MHz", f"{num(s.get('temperature_c'), 0)} C",
                     f"{num(s.get('power_w'))} W",
                     f"{num(s.get('memory_used_gb'))} / {num(s.get('memory_total_gb'))} GB"])
    return rows


def render(doc: dict[str, Any]) -> None:
    from orchestrator.core.output import console, print_table

    out = console()
    for line in header_lines(doc):
        out.print(line, markup=False)
    concurrencies = [f"c{c}" for c in _concurrencies(doc)]
    print_table("sparkctl bench", ["config", *concurrencies], result_rows(doc), right=concurrencies)
    print_table("nodes after the last cell", ["node", "GPU clock", "temp", "power", "memory used"],
                node_rows(doc))


def render_sweep(result: dict[str, Any]) -> None:
    from orchestrator.core.output import console, print_table

    rows = sweep_rows(result["runs"])
    conc = sorted({c for r in rows for c in r["tg_by_concurrency"]})
    numbers = [f"tg c{c} (t/s)" for c in conc] + ["acceptance rate", "acceptance length"]
    table = []
    for row in rows:
        mark = " *best*" if row["value"] == result["best"] else ""
        table.append([f"{row['value']}{mark}", *[num(row["tg_by_concurrency"].get(c)) for c in conc],
                      num(row["acceptance_rate"], 2), num(row["acceptance_length"], 2)])
    print_table(f"sparkctl bench --sweep {result['key']}", [result["key"].split(".")[-1], *numbers],
                table, right=numbers)
    console().print(f"best: {result['best']} (highest generation throughput at the lowest "
                    f"concurrency); original recipe restored: {result['restored']}", markup=False)


COMPARED = (("tg_throughput", "t/s", True), ("tg_req_throughput", "t/s/req", True),
            ("peak_throughput", "peak t/s", True), ("pp_throughput", "pp t/s", True),
            ("ttft_ms", "TTFT ms", False))


def compare_rows(a: dict[str, Any], b: dict[str, Any]) -> list[list[str]]:
    """Cells present in both runs: each figure A, B and B/A (higher is better except TTFT)."""
    rows = []
    for cell in a.get("cells", []):
        other = find(b, cell["depth"], cell["pp"], cell["tg"], cell["concurrency"])
        if other is None:
            continue
        name = f"pp{cell['pp']} tg{cell['tg']} d{cell['depth']} c{cell['concurrency']}"
        for key, title, _ in COMPARED:
            va, vb = figure(cell, key), figure(other, key)
            if va is None and vb is None:
                continue
            ratio = f"{vb / va:.2f}x" if va and vb is not None else "-"
            rows.append([name, title, num(va), num(vb), ratio])
    sa, sb = spec_summary(a) or {}, spec_summary(b) or {}
    for key in ("acceptance_rate", "acceptance_length"):
        va, vb = sa.get(key), sb.get(key)
        if va is not None or vb is not None:
            ratio = f"{vb / va:.2f}x" if va and vb is not None else "-"
            rows.append(["whole run", key.replace("_", " "), num(va, 2), num(vb, 2), ratio])
    return rows


def render_compare(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str]) -> None:
    from orchestrator.core.output import console, print_table

    out = console()
    for tag, doc in zip("AB", (a, b), strict=True):
        server = doc.get("server") or {}
        out.print(f"{tag}: {names['AB'.index(tag)]}: {server.get('recipe')} "
                  f"config {server.get('config_hash')}, started {doc.get('started')}", markup=False)
    print_table("sparkctl bench compare (B/A)", ["cell", "figure", "A", "B", "B/A"],
                compare_rows(a, b), right=["A", "B", "B/A"])
