"""Facts: what sparkctl needs to know about a node, asked in one round trip, read as types.

A fact is a small class (pyinfra's idea): `request()` is its part of the one JSON request the
node-side gatherer (orchestrator/node/gather.py) answers, `read(answer)` turns the gatherer's
JSON into a typed value. A phase asks for facts; the executor merges every phase's requests into
one per node and sends them together. Merging is exact, never a guess: two facts that ask for
the same command key with different commands are a bug and raise, instead of one silently
winning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.commands import python_script_cmd
from orchestrator.errors import SparkctlError
from orchestrator.node import script
from orchestrator.remote.transport import Transport

Request = dict[str, Any]


def gather_script() -> str:
    return script("gather.py")


def gather_facts(transport: Transport, request: Request, timeout: float = 120.0) -> dict[str, Any]:
    """Run the node-side gatherer once and return its JSON answer."""
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
    if not isinstance(facts, dict):
        raise SparkctlError(f"{transport.node}: the facts gatherer answered {type(facts).__name__}")
    return facts


# The gatherer's sections and how two requests for one section combine.
_KEYED = ("commands",)  # key -> command: the same key must mean the same command
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
class CommandResult:
    rc: int
    out: str
    err: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


@dataclass(frozen=True)
class FileInfo:
    exists: bool
    mode: int | None = None
    uid: int | None = None
    size: int | None = None
    sha256: str | None = None
    content: str | None = None


@dataclass(frozen=True)
class Command:
    """The output of one shell command run on the node (as root)."""

    key: str
    command: str

    def request(self) -> Request:
        return {"commands": {self.key: self.command}}

    def read(self, answer: dict[str, Any]) -> CommandResult | None:
        raw = (answer.get("commands") or {}).get(self.key)
        if raw is None:
            return None
        return CommandResult(int(raw.get("rc", 1)), str(raw.get("out", "")), str(raw.get("err", "")))


@dataclass(frozen=True)
class File:
    """A file's mode, owner, size and sha256 (and its text when `content`)."""

    path: str
    content: bool = False

    def request(self) -> Request:
        return {"files": {self.path: self.content}}

    def read(self, answer: dict[str, Any]) -> FileInfo | None:
        raw = (answer.get("files") or {}).get(self.path)
        if raw is None:
            return None
        return FileInfo(exists=bool(raw.get("exists")), mode=raw.get("mode"), uid=raw.get("uid"),
                        size=raw.get("size"), sha256=raw.get("sha256"), content=raw.get("content"))


@dataclass(frozen=True)
class DockerObject:
    """`docker inspect` of a container (kind "containers") or an image ("images"): the
    inspect document, None when it does not exist; an error is raised, naming the node."""

    kind: str
    name: str

    def request(self) -> Request:
        return {self.kind: [self.name]}

    def read(self, answer: dict[str, Any], node: str = "node") -> dict[str, Any] | None:
        raw = (answer.get(self.kind) or {}).get(self.name)
        if isinstance(raw, dict) and "error" in raw:
            what = "docker image inspect" if self.kind == "images" else "docker inspect"
            raise SparkctlError(f"{node}: `{what} {self.name}` failed: {str(raw['error']).strip()}")
        return raw if isinstance(raw, dict) else None


class Fact(Protocol):
    """Anything that asks the gatherer for something (remote/node_facts.py has more)."""

    def request(self) -> Request: ...


def request_of(*facts: Fact) -> Request:
    """The request that asks for all of `facts`."""
    return merge_requests([fact.request() for fact in facts])
