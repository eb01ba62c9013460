"""A saved bench result (`bench --save`, `--json`, `--format json`) read back for `bench compare`
and `bench plot`: checked for the shape every reader relies on before anything reads it.

Why a check here and not in each reader: the table, the ratios and the plots index cells by
depth/pp/tg/concurrency and do arithmetic on each figure's mean; a file edited by hand, cut off
or produced by something else (a key missing, a string where a number goes, nesting a thousand
levels deep) must end in one clear error naming the file and the key (exit 2), never a
traceback halfway through a table.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from orchestrator.errors import InputError

MAX_BYTES = 64 * 1024 * 1024
"""A run of 16^4 cells with every node's state is a few MB; anything far beyond is not ours."""
CELL_KEYS = ("depth", "pp", "tg", "concurrency")
SPEC_COUNTS = ("draft_tokens", "accepted_tokens", "drafts")
SPEC_MEANS = ("acceptance_rate", "acceptance_length")
FIGURE_SUFFIXES = ("_throughput", "_ms")


class _Bad(Exception):
    """One defect of the document: where (a dotted key path) and what was expected there."""

    def __init__(self, where: str, expected: str) -> None:
        super().__init__(f"{where}: expected {expected}")


def _number(value: Any, where: str, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _Bad(where, "a finite number")
    if positive and value <= 0:
        raise _Bad(where, "a number above 0")
    return float(value)


def _whole(value: Any, where: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _Bad(where, f"a whole number of at least {low}")
    return value


def _mapping(value: Any, where: str, optional: bool = False) -> dict[str, Any]:
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        raise _Bad(where, "a mapping" + (" or null" if optional else ""))
    return value


def _figures(value: Any, where: str) -> None:
    """Each measured figure (a name ending in _throughput or _ms) is null or {mean, std, ...}
    of finite numbers: the table divides and the plot draws them."""
    for name, figure in _mapping(value, where, optional=True).items():
        if not str(name).endswith(FIGURE_SUFFIXES) or figure is None:
            continue
        figure = _mapping(figure, f"{where}.{name}", optional=True)
        if figure:
            _number(figure.get("mean"), f"{where}.{name}.mean")
            _number(figure.get("std"), f"{where}.{name}.std")


def _spec(value: Any, where: str) -> None:
    spec = _mapping(value, where, optional=True)
    if spec and all(key in spec for key in SPEC_COUNTS):
        for key in SPEC_COUNTS:
            _number(spec[key], f"{where}.{key}", positive=key != "accepted_tokens")
        return
    for key in SPEC_MEANS:
        if spec.get(key) is not None:
            _number(spec[key], f"{where}.{key}")


def _run(doc: Any, where: str) -> None:
    doc = _mapping(doc, where or "the file")
    prefix = f"{where}." if where else ""
    cells = doc.get("cells")
    if not isinstance(cells, list):
        raise _Bad(f"{prefix}cells", "a list of measured cells")
    for index, cell in enumerate(cells):
        at = f"{prefix}cells[{index}]"
        cell = _mapping(cell, at)
        for key in CELL_KEYS:
            _whole(cell.get(key), f"{at}.{key}", low=1 if key == "concurrency" else 0)
        _figures(cell.get("figures"), f"{at}.figures")
        _spec(cell.get("spec_decoding"), f"{at}.spec_decoding")
        for node, state in _mapping(cell.get("nodes"), f"{at}.nodes", optional=True).items():
            _mapping(state, f"{at}.nodes.{node}")
    settings = _mapping(doc.get("settings"), f"{prefix}settings", optional=True)
    for key in ("tg", "pp", "depth"):
        if key in settings:
            if not isinstance(settings[key], list) or not settings[key]:
                raise _Bad(f"{prefix}settings.{key}", "a non-empty list of whole numbers")
            for index, item in enumerate(settings[key]):
                _whole(item, f"{prefix}settings.{key}[{index}]")
    _mapping(doc.get("server"), f"{prefix}server", optional=True)
    for node, state in _mapping(doc.get("nodes_before"), f"{prefix}nodes_before", optional=True).items():
        _mapping(state, f"{prefix}nodes_before.{node}")
    if doc.get("latency_ms") is not None:
        _number(doc["latency_ms"], f"{prefix}latency_ms")


def _sweep(doc: dict[str, Any]) -> None:
    sweep = _mapping(doc.get("sweep"), "sweep")
    if not isinstance(sweep.get("key"), str) or not sweep["key"]:
        raise _Bad("sweep.key", "the swept recipe key (text)")
    runs = sweep.get("runs")
    if not isinstance(runs, list):
        raise _Bad("sweep.runs", "a list of runs")
    for index, run in enumerate(runs):
        _run(run, f"sweep.runs[{index}]")
        if "value" not in run or isinstance(run["value"], dict | list):
            raise _Bad(f"sweep.runs[{index}].value", "the swept value (a number or text)")


def check_saved(doc: Any) -> None:
    """Raise _Bad for the first key whose value no reader could use."""
    if not isinstance(doc, dict) or ("cells" not in doc and "sweep" not in doc):
        raise _Bad("the file", "a `sparkctl bench` result (a mapping with cells, or a sweep)")
    if "sweep" in doc:
        _sweep(doc)
    else:
        _run(doc, "")


def load_saved(path: str) -> dict[str, Any]:
    """A saved result (bench --save, --json, --format json): a run or a sweep, checked."""
    file = Path(path)
    try:
        if file.stat().st_size > MAX_BYTES:
            raise InputError(f"{path}: {file.stat().st_size:,} bytes, not a bench result "
                             f"(at most {MAX_BYTES // 2**20} MB)")
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise InputError(f"{path}: not JSON (a bench result is): {why}") from None
    if not isinstance(doc, dict) or ("cells" not in doc and "sweep" not in doc):
        raise InputError(f"{path}: not a `sparkctl bench` result (no cells)")
    try:
        check_saved(doc)
    except _Bad as exc:
        raise InputError(f"{path}: not a `sparkctl bench` result as saved: {exc}") from None
    except RecursionError:
        raise InputError(f"{path}: not a `sparkctl bench` result: nested too deeply") from None
    return doc
