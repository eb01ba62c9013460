"""Managed files: render, compare by sha256 on the node, write all changed files at once.

One step writes every changed file of its phase in one remote command (a JSON list on stdin,
written atomically by the node-side ledger script, orchestrator/node/ledger.py), so a cold run
costs one round trip for files, and an unchanged file costs none beyond the phase's facts.

The ledger is the one rule for every file sparkctl writes, restores or removes on a node: it
records the sha256 of what sparkctl wrote (and what stood there before), and a file whose
content on disk is not exactly that is never overwritten, restored over or removed: it is left
alone and the report says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.core.disks import describe_os_error
from orchestrator.core.step import Change, NodeContext, Outcome, Step, Unchanged
from orchestrator.errors import SparkctlError
from orchestrator.paths import LEDGER
from orchestrator.remote.fact_records import FileInfo
from orchestrator.remote.transport import Result
from orchestrator.render import sha256, unified_diff


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
    """Write the JSON list of {path, mode, content} on stdin through the ledger."""
    return ledger_cmd("write")


def ledger_cmd(mode: str, *args: str) -> str:
    from orchestrator.commands import join
    from orchestrator.node import script

    return "python3 -c " + _quote(script("ledger.py")) + " " + join([mode, *args])


def undo_files_cmd(paths: list[str]) -> str:
    """Remove these files only where they are still what sparkctl wrote (the ledger's undo:
    someone else's file, or one changed since, is left alone and reported)."""
    return f"printf '%s' {_quote(json.dumps(paths))} | {ledger_cmd('undo')}"


def ledger_answer(result: Result, node: str, what: str) -> dict[str, Any]:
    """The ledger script's JSON answer; a full disk or read-only filesystem named with node,
    path and free space; any other failure as the command's own error."""
    answer: dict[str, Any] = {}
    for line in reversed(result.stdout.strip().splitlines()):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            answer = value
            break
    if answer.get("error"):
        raise SparkctlError(f"{node}: {what}: " + describe_os_error(answer))
    if not answer:
        result.check()
    return answer


def check_written(result: Result, node: str, what: str) -> list[str]:
    """Raise when a file was left alone (not sparkctl's); return the paths written."""
    answer = ledger_answer(result, node, what)
    left = answer.get("left") or []
    if left:
        raise SparkctlError(
            f"{node}: {what}: " + "; ".join(str(e.get("reason")) for e in left)
            + ". sparkctl never overwrites a file it did not write: move it away "
            "(or put back what sparkctl wrote) and run the command again"
        )
    return list(answer.get("written") or [])


def _quote(text: str) -> str:
    from orchestrator.commands import quote

    return quote(text)


def ledger_entries(ctx: NodeContext) -> dict[str, Any]:
    """The node's ledger of files sparkctl wrote (path -> {sha256, before})."""
    try:
        data = json.loads((ledger.content if (ledger := ctx.facts.file(LEDGER)) else None) or "{}")
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def ownership(ctx: NodeContext, path: str) -> str:
    """ours | changed | unrecorded | absent, as orchestrator/node/ledger.py decides it."""
    fact = ctx.facts.file(path)
    if fact is None or not fact.exists:
        return "absent"
    entry = ledger_entries(ctx).get(path)
    if entry is None:
        return "unrecorded"
    return "ours" if entry.get("sha256") == fact.sha256 else "changed"


class ManagedFiles(Step):
    """Keep a set of files on a node exactly as rendered (content and mode)."""

    def __init__(self, name: str, render: Callable[[NodeContext], list[FileSpec]]) -> None:
        self.name = name
        self.render = render

    def check(self, ctx: NodeContext) -> Outcome:
        changed: list[FileSpec] = []
        diffs: list[str] = []
        for spec in self.render(ctx):
            fact = ctx.facts.file(spec.path) or FileInfo(exists=False)
            same_content = fact.sha256 == sha256(spec.content)
            same_mode = fact.mode == spec.mode
            if fact.exists and same_content and same_mode:
                continue
            changed.append(spec)
            if spec.secret:
                diffs.append(f"{spec.path}: secret content (not shown)\n")
            elif not same_content:
                diffs.append(unified_diff(spec.path, fact.content, spec.content))
            else:
                diffs.append(f"{spec.path}: mode {fact.mode or 0:o} -> {spec.mode:o}\n")
        if not changed:
            return Unchanged("files up to date")
        names = ", ".join(spec.path.rsplit("/", 1)[-1] for spec in changed)
        return Change(f"write {names}", diff="".join(diffs), payload=changed)

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        specs: list[FileSpec] = change.payload
        payload = json.dumps(
            [{"path": s.path, "mode": f"{s.mode:o}", "content": s.content} for s in specs]
        )
        result = ctx.run(write_files_cmd(), stdin=payload, sudo=True, display="write managed files")
        check_written(result, ctx.node.name, self.name)
        return None
