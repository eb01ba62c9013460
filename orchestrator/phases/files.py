"""Managed files: render, compare by sha256 on the node, write all changed files at once.

One step writes every changed file of its phase in one remote command (a JSON list on stdin,
written atomically by a tiny node-side script), so a cold run costs one round trip for files,
and an unchanged file costs none beyond the phase's facts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.core.step import Change, NodeContext, Outcome, Step, Unchanged
from orchestrator.render import sha256, unified_diff

WRITER = r"""
import json, os, sys
for entry in json.load(sys.stdin):
    path, mode = entry["path"], int(entry["mode"], 8)
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    tmp = path + ".sparkctl-tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(entry["content"])
    os.chmod(tmp, mode)
    os.rename(tmp, path)
"""


@dataclass(frozen=True)
class FileSpec:
    path: str
    mode: int
    content: str
    secret: bool = False
    """Secret files are never diffed into reports."""


def files_request(paths: list[str]) -> dict[str, bool]:
    """The facts request for these files: content too, so diffs can be shown."""
    return dict.fromkeys(paths, True)


def write_files_cmd() -> str:
    return "python3 -c " + _quote(WRITER)


def _quote(text: str) -> str:
    from orchestrator.commands import quote

    return quote(text)


class ManagedFiles(Step):
    """Keep a set of files on a node exactly as rendered (content and mode)."""

    def __init__(self, name: str, render: Callable[[NodeContext], list[FileSpec]]) -> None:
        self.name = name
        self.render = render

    def check(self, ctx: NodeContext) -> Outcome:
        changed: list[FileSpec] = []
        diffs: list[str] = []
        for spec in self.render(ctx):
            fact = ctx.facts.get("files", {}).get(spec.path, {})
            same_content = fact.get("sha256") == sha256(spec.content)
            same_mode = fact.get("mode") == spec.mode
            if fact.get("exists") and same_content and same_mode:
                continue
            changed.append(spec)
            if spec.secret:
                diffs.append(f"{spec.path}: secret content (not shown)")
            elif not same_content:
                diffs.append(unified_diff(spec.path, fact.get("content"), spec.content))
            else:
                diffs.append(f"{spec.path}: mode {fact.get('mode', 0):o} -> {spec.mode:o}\n")
        if not changed:
            return Unchanged("files up to date")
        names = ", ".join(spec.path.rsplit("/", 1)[-1] for spec in changed)
        return Change(f"write {names}", diff="".join(diffs), payload=changed)

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        specs: list[FileSpec] = change.payload
        payload = json.dumps(
            [{"path": s.path, "mode": f"{s.mode:o}", "content": s.content} for s in specs]
        )
        ctx.run(write_files_cmd(), stdin=payload, sudo=True, display="write managed files").check()
        return None
