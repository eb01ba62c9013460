"""The diffs of a plan, for people: a line per changed file (what changes, on which nodes), or
with --diff the full text, each distinct diff once with the nodes it applies to.

A step's diff (core/step.py Change.diff) is text made of any of: unified diffs (one per file,
from render.unified_diff or container_diff), `PATH: mode OLD -> NEW` lines, `PATH: secret content
(not shown)` lines, and free text (e.g. the address changes of network/apply). It is split here
into one section per file; free text becomes one section named after its step.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

MODE = re.compile(r"^(/\S+): mode ([0-7]+) -> ([0-7]+)$")
SECRET = re.compile(r"^(/\S+): secret content \(not shown\)$")


@dataclass(frozen=True)
class Section:
    target: str
    """The file (or container) the section is about; for free text, the step (phase/step)."""
    summary: str
    text: str


def _unified(lines: list[str], start: int) -> tuple[Section, int]:
    """The unified diff whose `---`/`+++` header starts at lines[start]; returns the index after."""
    old = lines[start][4:].strip()
    new = lines[start + 1][4:].strip()
    end = start + 2
    added = removed = 0
    while end < len(lines) and lines[end][:1] in ("@", "+", "-", " ", "\\"):
        if end + 1 < len(lines) and lines[end].startswith("--- ") and lines[end + 1].startswith("+++ "):
            break
        line = lines[end]
        if line.startswith("+"):
            added += 1
        elif line.startswith("-"):
            removed += 1
        end += 1
    if old.endswith(" (running)") and new.endswith(" (wanted)"):
        target = "container " + new[: -len(" (wanted)")]
    else:
        target = new
    if old == "/dev/null":
        summary = f"new file ({added} line{'s' * (added != 1)})"
    elif new == "/dev/null":
        summary = f"removed ({removed} line{'s' * (removed != 1)})"
        target = old.removesuffix(" (on node)")
    else:
        summary = f"changed (+{added} -{removed} lines)"
    return Section(target, summary, "\n".join(lines[start:end]) + "\n"), end


def split(diff: str, step: str) -> list[Section]:
    """The sections of one step's diff (`step` names free text: "network/apply")."""
    lines = diff.splitlines()
    sections: list[Section] = []
    free: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            section, i = _unified(lines, i)
            sections.append(section)
            continue
        mode, secret = MODE.match(line), SECRET.match(line)
        if mode:
            sections.append(Section(mode[1], f"mode {mode[2]} -> {mode[3]}", line + "\n"))
        elif secret:
            sections.append(Section(secret[1], "changed (secret content, not shown)", line + "\n"))
        elif line.strip():
            free.append(line)
        i += 1
    if free:
        count = len(free)
        sections.append(Section(step, f"{count} line{'s' * (count != 1)} of detail (--diff shows them)",
                                "\n".join(free) + "\n"))
    return sections


def _nodes(names: list[str]) -> str:
    return ", ".join(names)


def _group(items: Iterable[tuple[tuple[str, ...], str]]) -> list[tuple[tuple[str, ...], list[str]]]:
    """(key, node) pairs -> (key, nodes) in order of first appearance, each node once."""
    grouped: dict[tuple[str, ...], list[str]] = {}
    for key, node in items:
        nodes = grouped.setdefault(key, [])
        if node not in nodes:
            nodes.append(node)
    return list(grouped.items())


def step_diffs(hosts: Iterable[tuple[str, Iterable[tuple[str, str]]]]) -> list[tuple[str, Section]]:
    """(node, section) for every (step label, diff) of every node, in report order."""
    return [(node, section) for node, steps in hosts for label, diff in steps if diff
            for section in split(diff, label)]


def summary_lines(found: list[tuple[str, Section]]) -> list[str]:
    """One line per file and kind of change, naming the nodes where it applies:
    `/etc/netplan/40-sparkctl-fabric.yaml: new file (21 lines) on spark-a, spark-b`."""
    grouped = _group(((s.target, s.summary), node) for node, s in found)
    return [f"{target}: {summary} on {_nodes(nodes)}" for (target, summary), nodes in grouped]


def full_text(found: list[tuple[str, Section]]) -> list[tuple[str, str]]:
    """(header, diff) with each distinct diff once: `spark-a, spark-b: /etc/sparkctl/hostfile`."""
    grouped = _group(((s.target, s.text), node) for node, s in found)
    first: dict[str, int] = {}  # each file's diffs together, in the order files first appear
    for index, ((target, _), _) in enumerate(grouped):
        first.setdefault(target, index)
    grouped.sort(key=lambda item: first[item[0][0]])
    return [(f"{_nodes(nodes)}: {target}", text) for (target, text), nodes in grouped]
