"""Templates from templates/ (shipped in the wheel as orchestrator/templates) and from each
engine's own folder (orchestrator/engines/NAME/templates/).

StrictUndefined: a missing value is a bug, never an empty string in a config file.
Every managed file starts with a header naming sparkctl, so users know who wrote it.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jinja2

MANAGED_HEADER = "# Managed by sparkctl: edits here are overwritten by its next run (up, launch)."


def templates_dir() -> Path:
    """Installed: orchestrator/templates in the wheel; from a checkout: ./templates."""
    installed = Path(__file__).parent / "templates"
    if installed.is_dir():
        return installed
    return Path(__file__).parent.parent / "templates"


@cache
def environment() -> jinja2.Environment:
    # imported here: a run that renders nothing (a no-change `up` compares hashes of what
    # the nodes hold) does not pay jinja2's import (~20 ms)
    import jinja2

    return jinja2.Environment(
        # shared templates by their path under templates/; an engine's as "NAME/templates/FILE"
        loader=jinja2.FileSystemLoader([str(templates_dir()), str(Path(__file__).parent / "engines")]),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render(template: str, **values: Any) -> str:
    return environment().get_template(template).render(header=MANAGED_HEADER, **values)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def unified_diff(path: str, old: str | None, new: str) -> str:
    import difflib  # only when something differs

    lines = difflib.unified_diff(
        (old or "").splitlines(keepends=True), new.splitlines(keepends=True),
        fromfile=f"{path} (on node)" if old is not None else "/dev/null", tofile=path,
    )
    return "".join(lines)
