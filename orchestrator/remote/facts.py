"""Facts: what sparkctl needs to know about a node, asked in one round trip, read as types.

A fact is a small class (pyinfra's idea): `request()` is its part of the one JSON request the
node-side gatherer (orchestrator/node/gather.py) answers, `read(facts)` its typed value from the
node's answer, parsed once into a `NodeFacts` (remote/gathered.py) by `gather_facts`. A phase
asks for facts; the executor merges every phase's requests into one per node and sends them
together. Merging is exact, never a guess: two facts that ask for the same command key with
different commands are a bug and raise, instead of one silently winning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.commands import python_script_cmd
from orchestrator.errors import SparkctlError
from orchestrator.node import script
from orchestrator.remote.fact_records import CommandResult as CommandResult
from orchestrator.remote.fact_records import FileInfo as FileInfo
from orchestrator.remote.gathered import NodeFacts
from orchestrator.remote.transport import Transport

Request = dict[str, Any]


def gather_script() -> str:
    """The gatherer as the node gets it: one program, the lock's part in front (its file's
    imports are for running it alone)."""
    return script("gather_lock.py") + "\n" + script("gather.py")


def gather_facts(transport: Transport, request: Request, timeout: float = 120.0) -> NodeFacts:
    """Run the node-side gatherer once and return its answer, parsed into a NodeFacts (a
    malformed answer raises, naming the node and the section)."""
    result = transport.run(
        python_script_cmd(request), stdin=gather_script(), sudo=True, timeout=timeout,
        display="python3 - <facts gatherer>",
    ).check()
    try:
        facts = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise SparkctlError(
            f"{transport.node}: the facts gatherer printed no JSON (is python3 installed on the "
            f"node?): {result.stdout[-200:]!r} {result.stderr[-300:]!r}"
        ) from None
    return NodeFacts.parse(facts, transport.node)


# The gatherer's sections and how two requests for one section combine.
_KEYED = ("commands", "gates")  # key -> command (or its gate): one key, one meaning
_FLAGS = ("files",)  # path -> want content: asking for content wins over not asking
_LISTS = ("containers", "images", "disk", "routes", "resolve", "users")
_SWITCHES = ("netplan", "links", "ibdev2netdev", "python", "lock_peek")
_MAX = ("timeout", "lock_stale_seconds")


class FactConflict(SparkctlError):
    """Two facts asked for different things under one name (a bug in sparkctl, not input)."""


def merge_requests(requests: list[Request]) -> Request:
    """One request that answers every request in `requests`, section by section."""
    merged: Request = {}
    for request in requests:
        for section, value in request.items():
            if section not in merged:
                merged[section] = _copy(value)
            else:
                merged[section] = _merge(section, merged[section], value)
    return merged


def _copy(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _merge(section: str, old: Any, new: Any) -> Any:
    if section in _KEYED:
        for key, command in new.items():
            if key in old and old[key] != command:
                raise FactConflict(f"facts: two requests name command {key!r} differently:\n"
                                   f"  {old[key]}\n  {command}")
            old[key] = command
        return old
    if section in _FLAGS:
        return {**old, **{path: bool(old.get(path)) or bool(want) for path, want in new.items()}}
    if section in _LISTS:
        return old + [item for item in new if item not in old]
    if section in _SWITCHES:
        return bool(old) or bool(new)
    if section in _MAX:
        return max(old, new)
    if old != new:
        raise FactConflict(f"facts: two requests ask {section!r} differently: {old!r} / {new!r}")
    return old


# ------------------------------------------------------------------ typed facts

@dataclass(frozen=True)
class ImageGate:
    """Run a fact's command only while IMAGE is present (or absent) on the node, else answer
    OTHERWISE (exit 0) without running it: the gatherer inspects each image once per gathering,
    for the `images` fact and every command gated on it, where each command asked docker again
    (a no-change `up` and every launch ask two such commands of one image)."""

    image: str
    run_while: str  # "present" or "absent"; an inspect that fails counts as absent
    otherwise: str

    def request(self) -> dict[str, str]:
        return {"image": self.image, "run_while": self.run_while, "otherwise": self.otherwise}


@dataclass(frozen=True)
class Command:
    """The output of one shell command run on the node (as root), when its gate lets it run."""

    key: str
    command: str
    gate: ImageGate | None = None

    def request(self) -> Request:
        if self.gate is None:
            return {"commands": {self.key: self.command}}
        return {"commands": {self.key: self.command}, "gates": {self.key: self.gate.request()},
                "images": [self.gate.image]}

    def read(self, facts: NodeFacts) -> CommandResult | None:
        return facts.command(self.key)


@dataclass(frozen=True)
class File:
    """A file's mode, owner, size and sha256 (and its text when `content`)."""

    path: str
    content: bool = False

    def request(self) -> Request:
        return {"files": {self.path: self.content}}

    def read(self, facts: NodeFacts) -> FileInfo | None:
        return facts.file(self.path)


class Fact(Protocol):
    """Anything that asks the gatherer for something (remote/node_facts.py has more)."""

    def request(self) -> Request: ...


def request_of(*facts: Fact) -> Request:
    """The request that asks for all of `facts`."""
    return merge_requests([fact.request() for fact in facts])
