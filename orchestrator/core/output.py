"""How sparkctl prints for people: one rule for a terminal and for a pipe (docs/contracts.md).

On a terminal (stdout is a tty): rich tables sized to the window, colour.
Off a terminal (piped, redirected, CI): plain lines, no colour, no box drawing, never wrapped
(a long message stays one line, whatever $COLUMNS says). Commands that stream progress on
stderr print no table of the same steps on stdout: the stream is the record, and stdout adds only
what it did not say (each failure in full, the summary line, the notes). `--json` is not affected.
Every command renders through `console()` and `print_table()` so this rule lives here only.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

WIDE = 100_000
"""Line width off a terminal: nothing is folded or wrapped."""


_CAPTURE: list[Console] = []
"""While `captured()` runs: the console renderings print into (status --watch redraws it)."""


def on_terminal() -> bool:
    return bool(_CAPTURE) or sys.stdout.isatty()


def console() -> Console:
    """The console every human-readable rendering prints through."""
    from rich.console import Console

    if _CAPTURE:
        return _CAPTURE[-1]
    if on_terminal():
        return Console(highlight=False)
    return Console(highlight=False, color_system=None, soft_wrap=True, width=WIDE,
                   emoji=False)


def plain(markup: str) -> str:
    """The text of a rich markup string (styles dropped, escapes resolved), one line."""
    from rich.text import Text

    return "; ".join(part for part in Text.from_markup(markup).plain.splitlines() if part)


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]],
                right: Sequence[str] = ()) -> None:
    """A table: rich on a terminal; off it a title line and aligned plain columns (the last
    column is not padded unless right-aligned, so a long message is one line). Cells are rich
    markup."""
    out = console()
    if on_terminal():
        from rich.table import Table

        table = Table(title=title)
        for column in columns:
            table.add_column(column, overflow="fold",
                             justify="right" if column in right else "left")
        for row in rows:
            table.add_row(*row)
        out.print(table)
        return
    cells = [list(columns)] + [[plain(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    out.print(plain(title), markup=False)
    last = len(columns) - 1  # (a right-aligned last column is padded: numbers line up)
    for row in cells:
        padded = [cell.rjust(widths[i]) if columns[i] in right else cell.ljust(widths[i])
                  for i, cell in enumerate(row[:-1])]
        tail = row[-1].rjust(widths[last]) if columns[last] in right else row[-1]
        out.print("  ".join([*padded, tail]).rstrip(), markup=False)


@contextmanager
def captured(width: int) -> Iterator[Console]:
    """Renderings inside go to a terminal-like console in memory (colours, tables at `width`);
    its text is `.file.getvalue()` (ANSI), for a caller that draws it itself (rich Live)."""
    import io

    from rich.console import Console

    _CAPTURE.append(Console(file=io.StringIO(), force_terminal=True, width=width, highlight=False))
    try:
        yield _CAPTURE[-1]
    finally:
        _CAPTURE.pop()


@dataclass
class OutputSettings:
    """How much the running command prints: set by the CLI's -v / -q and --diff options
    (cli/verbosity.py, cli/__init__.py diff_option) and reset when the command ends, so core
    never asks the CLI library."""

    verbosity: int = 0
    full_diff: bool = False


SETTINGS = OutputSettings()


def reset_settings() -> None:
    """Back to the defaults once a command ends (several commands run in one test process)."""
    SETTINGS.verbosity, SETTINGS.full_diff = 0, False


def full_diff_requested() -> bool:
    """--diff was given to the running command: plans show every diff in full."""
    return SETTINGS.full_diff


def verbosity() -> int:
    """1 or more with -v (or SPARKCTL_VERBOSE=1), -1 or less with -q, else 0."""
    import os

    if SETTINGS.verbosity == 0 and os.environ.get("SPARKCTL_VERBOSE") == "1":
        return 1
    return SETTINGS.verbosity


def ask_yes_no(question: str) -> bool:
    """`question [y/N]: ` on stderr, the answer from stdin: y or yes agrees; anything else
    (Enter, EOF) does not."""
    sys.stderr.write(f"{question} [y/N]: ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def http_error_text(raw: bytes, limit: int = 300) -> str:
    """What a server's error answer says, as text a user reads: the message of an OpenAI-style
    `{"error": {"message": ...}}` (or `{"detail": ...}`, `{"message": ...}`), else the body
    decoded (never a Python bytes repr), cut at LIMIT characters."""
    import json

    text = raw.decode("utf-8", errors="replace").strip()
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        error = doc.get("error")
        found = (error.get("message") if isinstance(error, dict) else error) or doc.get(
            "detail") or doc.get("message")
        if found:
            text = found if isinstance(found, str) else json.dumps(found)
    text = " ".join(text.split())
    return (text[:limit] + "...") if len(text) > limit else (text or "(empty answer)")
