"""`sparkctl bench`'s inputs, refused before any measuring: bounded numbers and output paths
that can be written.

Why bounds: the client runs one thread per concurrent request, so `-c 100000` once started
16,000 threads and buried the controller; `-c 0` and `--tg 0` measure nothing. Why the paths
are checked first: a bench takes minutes, and a `--plot` or `--save` that cannot be written
must not be found only after the measuring (docs/bench.md, "Inputs").
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

BOUNDS: dict[str, tuple[int, int]] = {
    "tg": (1, 65_536),  # tokens to generate: beyond any served model's output limit
    "pp": (1, 1_048_576),  # prompt tokens: 1M, the longest context any recipe serves
    "depth": (0, 1_048_576),
    "concurrency": (1, 256),  # one client thread each; 256 = vLLM's default max_num_seqs
}
"""Inclusive (lowest, highest) of each comma-separated option."""
MAX_VALUES = 16
"""Values per option: the cells multiply, 16^4 of them would run for days."""
RUNS = click.IntRange(1, 100)
TIMEOUT = click.FloatRange(1, 86_400)


def int_list(option: str, text: str) -> list[int]:
    """`1,4,8` -> [1, 4, 8], each within BOUNDS[option]; else click.BadParameter (exit 2)
    naming the option and its limits."""
    low, high = BOUNDS[option]
    name = "-c/--concurrency" if option == "concurrency" else f"--{option}"
    expected = f"expected comma-separated integers from {low} to {high:,}"
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: {expected}", param_hint=name) from None
    if not values:
        raise click.BadParameter(f"{text!r}: {expected}", param_hint=name)
    wrong = [v for v in values if not low <= v <= high]
    if wrong:
        raise click.BadParameter(f"{wrong[0]} is out of range: {expected}", param_hint=name)
    if len(values) > MAX_VALUES:
        raise click.BadParameter(f"{len(values)} values; at most {MAX_VALUES}", param_hint=name)
    return values


def _writable_dir(path: Path) -> str | None:
    """Why files cannot be created in `path` (an existing directory or one `mkdir -p` would
    make), or None."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return None


def check_outputs(save: str | None, plot: str | None) -> None:
    """Refuse (exit 2) a --save DIR or --plot FILE (bench/plot.py) that could not be
    written, before measuring."""
    if save:
        folder = Path(save).expanduser()
        why = (f"{folder} is not a directory" if folder.exists() and not folder.is_dir()
               else _writable_dir(folder))
        if why:
            from orchestrator.errors import InputError

            raise InputError(f"--save {save}: {why}")
    if plot:
        from orchestrator.bench.plot import check_plot_path

        check_plot_path(plot)


def keep_outputs(doc: dict[str, Any], printed_json: bool, save: str | None, plot: str | None,
                 note: Callable[[str], None]) -> bool:
    """--save, then --plot, after the results were printed: True when one failed (said on
    stderr). When neither the printed output nor a saved file holds the JSON, it is kept in a
    spare file in the temporary directory: a measured result is never lost."""
    import json
    import time

    failed = kept = False
    if save:
        file = Path(save).expanduser() / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(json.dumps(doc, indent=1))
            note(f"[bench] saved {file}")
            kept = True
        except OSError as exc:
            failed = True
            note(f"[bench] could not save {file}: {exc.strerror or exc}")
    if plot:
        from orchestrator.bench.plot import plot as draw

        try:
            note(f"[bench] plot written to {', '.join(draw(doc, plot))}")
        except Exception as exc:  # matplotlib raises anything; the results are out already
            failed = True
            note(f"[bench] could not draw {plot}: {exc}")
    if failed and not printed_json and not kept:
        import tempfile

        fd, spare = tempfile.mkstemp(prefix="sparkctl-bench-", suffix=".json")
        with open(fd, "w") as out:
            out.write(json.dumps(doc, indent=1))
        note(f"[bench] the results are kept in {spare}")
    return failed
