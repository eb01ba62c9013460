"""-v / -q for the commands that report steps (up, plan, launch, down, init): every row of the
report (what the summary's "(-v lists them)" promises) or no progress lines. The level is kept
in click's context meta and read through core/output.py verbosity() wherever a command renders.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click


def verbosity_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """-v / -q: every row of the report (the summary's "(-v lists them)") or no progress lines;
    read through core/output.py verbosity() wherever a command renders."""

    def remember(ctx: click.Context, param: click.Parameter, value: int) -> None:
        if value:
            ctx.meta["sparkctl.verbosity"] = ctx.meta.get("sparkctl.verbosity", 0) + (
                value if param.name == "verbose" else -value)

    func = click.option("--quiet", "-q", count=True, expose_value=False, callback=remember,
                        help="Print less: no progress lines, only failures and the summary.")(func)
    return click.option("--verbose", "-v", count=True, expose_value=False, callback=remember,
                        help="Print more: every step's row, also those already right.")(func)
