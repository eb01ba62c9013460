"""-v / -q for the commands that report steps (up, plan, launch, down, init): every row of the
report (what the summary's "(-v lists them)" promises) or no progress lines. The level is kept
in core/output.py's SETTINGS for the running command and read through verbosity() wherever a
command renders.
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
            from orchestrator.core import output  # (on use: `--help` imports only click)

            output.SETTINGS.verbosity += value if param.name == "verbose" else -value
            ctx.call_on_close(output.reset_settings)

    func = click.option("--quiet", "-q", count=True, expose_value=False, callback=remember,
                        help="Print less: no progress lines, only failures and the summary.")(func)
    return click.option("--verbose", "-v", count=True, expose_value=False, callback=remember,
                        help="Print more: every step's row, also those already right.")(func)
