"""`bench --sweep KEY=V1,V2,...`: relaunch the server with each value, measure, restore.

Pure orchestration over two callables, so it is tested with fakes: `relaunch(recipe_file)`
(the real one runs `sparkctl launch FILE --replace --yes`) and `measure(value)` (one bench run).
The original recipe is relaunched at the end, also after a failure or Ctrl-C.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from orchestrator.bench.run import figure, spec_summary
from orchestrator.errors import InputError
from orchestrator.records import ServerRecord


def parse_sweep(text: str) -> tuple[str, list[Any]]:
    """"speculative.max_draft_len=1,2,4" -> ("speculative.max_draft_len", [1, 2, 4])."""
    key, sep, raw = text.partition("=")
    values = [yaml.safe_load(v.strip()) for v in raw.split(",") if v.strip()]
    if not sep or not key.strip() or not values:
        raise InputError(f"--sweep {text!r}: expected KEY=V1,V2,... (e.g. "
                         "speculative.max_draft_len=1,2,3,4)")
    return key.strip(), values


def resolve_key(data: dict[str, Any], key: str) -> list[str]:
    """A dotted path into the recipe; a bare name that is not top-level is looked up in the
    nested mappings (it must be unique there)."""
    path = key.split(".")
    node: Any = data
    for i, part in enumerate(path):
        if not isinstance(node, dict) or part not in node:
            break
        if i == len(path) - 1:
            return path
        node = node[part]
    if len(path) == 1:
        found = [[outer, key] for outer, inner in data.items()
                 if isinstance(inner, dict) and key in inner]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise InputError(f"--sweep {key}: ambiguous, say which: "
                             + ", ".join(".".join(f) for f in found))
    raise InputError(f"--sweep {key}: the recipe has no such key")


def with_value(data: dict[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(data)
    node = out
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return out


def write_variants(recipe_data: dict[str, Any], key: str, values: list[Any], folder: Path,
                   validate: Callable[[Path], Any]) -> tuple[str, list[Path]]:
    """One recipe file per value, each validated before anything is relaunched."""
    path = resolve_key(recipe_data, key)
    files = []
    for value in values:
        file = folder / f"{recipe_data['name']}-{'.'.join(path)}-{value}.yml"
        file.write_text(yaml.safe_dump(with_value(recipe_data, path, value), sort_keys=False))
        validate(file)
        files.append(file)
    return ".".join(path), files


def run_sweep(values: list[Any], files: list[Path], relaunch: Callable[[Path | str], None],
              measure: Callable[[Any], dict[str, Any]], original: Path | str,
              note: Callable[[str], None]) -> dict[str, Any]:
    """Measure each value; always put the original recipe back. A Ctrl-C is re-raised after
    the restore (the caller exits 130), with what was measured in the exception's `partial`."""
    runs: list[dict[str, Any]] = []
    error: str | None = None
    interrupted = False
    try:
        for value, file in zip(values, files, strict=True):
            note(f"[bench] sweep: relaunching with {value} ({len(runs) + 1}/{len(values)})")
            relaunch(file)
            doc = measure(value)
            doc["value"] = value
            runs.append(doc)
            if doc.get("interrupted"):
                interrupted = True
                break
    except KeyboardInterrupt:
        interrupted = True
    except Exception as exc:
        error = str(exc)
        note(f"[bench] sweep failed: {error}")
    restored, restore_error = True, None
    note(f"[bench] sweep: restoring the original recipe ({original})")
    try:
        relaunch(original)
    except (Exception, KeyboardInterrupt) as exc:
        restored, restore_error = False, str(exc) or type(exc).__name__
        note(f"[bench] could not restore {original}: {restore_error}")
    result = {"runs": runs, "best": best_value(runs), "restored": restored,
              "restore_error": restore_error, "error": error, "interrupted": interrupted}
    return result


def score(doc: dict[str, Any]) -> float | None:
    """What "best" means: the mean generation throughput over the run's cells at its lowest
    concurrency (speculative decoding is about single-stream speed; the table shows the rest)."""
    cells = doc.get("cells") or []
    if not cells:
        return None
    lowest = min(c["concurrency"] for c in cells)
    found = [figure(c, "tg_throughput") for c in cells if c["concurrency"] == lowest]
    values = [v for v in found if v is not None]
    return sum(values) / len(values) if values else None


def best_value(runs: list[dict[str, Any]]) -> Any:
    scored = [(score(r), r["value"]) for r in runs if score(r) is not None]
    return max(scored, key=lambda s: s[0])[1] if scored else None  # type: ignore[arg-type,return-value]


def sweep_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per value: tg throughput per concurrency (aggregate), peak, acceptance."""
    rows = []
    for doc in runs:
        by_c: dict[int, list[float]] = {}
        for cell in doc.get("cells", []):
            value = figure(cell, "tg_throughput")
            if value is not None:
                by_c.setdefault(cell["concurrency"], []).append(value)
        spec = spec_summary(doc) or {}
        rows.append({"value": doc["value"], "score": score(doc),
                     "tg_by_concurrency": {c: sum(v) / len(v) for c, v in sorted(by_c.items())},
                     "acceptance_rate": spec.get("acceptance_rate"),
                     "acceptance_length": spec.get("acceptance_length")})
    return rows


def placed_args(server: ServerRecord | None) -> list[str]:
    """--name, --nodes and --port of the measured server: the sweep relaunches (and restores)
    exactly that server, not the recipe's default name, nodes and port."""
    if server is None:
        return []
    args = ["--name", server.name]
    if server.nodes:
        args += ["--nodes", ",".join(server.nodes)]
    return args + (["--port", str(server.port)] if server.port else [])
