"""`sparkctl status --watch [SECONDS]`: the status again every SECONDS.

On a terminal the picture is redrawn in place (rich Live over what `status` renders, captured
through core/output.py); off a terminal each look is printed after a time line; with --json
each look is one JSON object per line. Ctrl-C ends the watch (exit 0: watching has no outcome).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable


def watch_status(look: Callable[[], int], seconds: float, as_json: bool) -> int:
    from orchestrator.core.output import captured, console, on_terminal

    try:
        if as_json or not on_terminal():
            while True:
                if not as_json:
                    console().print(f"--- {time.strftime('%H:%M:%S')} (every {seconds:g}s, "
                                    "Ctrl-C ends)", markup=False)
                look()
                sys.stdout.flush()
                time.sleep(seconds)
        from rich.live import Live
        from rich.text import Text

        screen = console()
        with Live(Text("sparkctl status: looking..."), console=screen, auto_refresh=False,
                  transient=False) as live:
            while True:
                with captured(screen.width) as buffer:
                    look()
                stamp = time.strftime("%H:%M:%S")
                text = Text.from_ansi(buffer.file.getvalue())  # type: ignore[attr-defined]
                text.append(f"\n{stamp}: every {seconds:g}s, Ctrl-C ends", style="dim")
                live.update(text, refresh=True)
                time.sleep(seconds)
    except KeyboardInterrupt:
        return 0
