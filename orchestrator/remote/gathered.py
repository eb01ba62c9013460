"""A node's facts as one typed record (pyinfra's facts as classes): the gatherer's JSON answer
(orchestrator/node/gather.py) parsed once, right where it arrives, into `NodeFacts`.

Steps, judges and commands read attributes (`facts.links`, `facts.command("ports")`,
`facts.container(name)`), never string lookups into the answer; a structure test keeps string
lookups on facts out of phases/ and engines/. A node that answers something malformed (a
section of the wrong shape) is refused here, naming the node and the section, instead of
surfacing later as a KeyError deep inside some step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from orchestrator.errors import SparkctlError
from orchestrator.remote.fact_records import (
    CommandResult,
    ContainerInfo,
    FileInfo,
    ImageInfo,
    LinkTable,
    NetplanFile,
    RoceTable,
    read_links,
    read_netplan,
    read_roce,
)

InfoT = TypeVar("InfoT")


@dataclass(frozen=True)
class Inspected(Generic[InfoT]):
    """One `docker inspect`: its typed answer, None when there is no such object, or why the
    inspect failed (`error`)."""

    info: InfoT | None = None
    error: str | None = None


@dataclass(frozen=True)
class SpaceEntry:
    """Free space where sparkctl writes (the `space` section every gathering answers)."""

    checked: str
    """The existing directory statvfs looked at (the path or its nearest parent)."""
    free_bytes: int | None = None
    readonly: bool = False
    error: str | None = None


@dataclass(frozen=True)
class DiskEntry:
    """Free space of a path asked for in the `disk` section."""

    free_bytes: int | None = None
    checked: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class ProbeResult:
    """One probe command (netcheck's pings, ssh, mpirun) run on the node, with its duration."""

    rc: int
    out: str = ""
    err: str = ""
    seconds: float | None = None


@dataclass(frozen=True)
class NodeFacts:
    """Everything one gathering learned about a node. Sections that were not asked for read as
    empty (or None), as the gatherer leaves them out."""

    node: str = "node"
    hostname: str = ""
    time: float | None = None
    """The node's clock (seconds since the epoch) when it answered."""
    space: dict[str, SpaceEntry] = field(default_factory=dict)
    lock: dict[str, Any] | None = None
    """The cluster lock's answer (taken or peeked), judged by core/lock.py."""
    commands: dict[str, CommandResult] = field(default_factory=dict)
    files: dict[str, FileInfo] = field(default_factory=dict)
    containers: dict[str, Inspected[ContainerInfo]] = field(default_factory=dict)
    images: dict[str, Inspected[ImageInfo]] = field(default_factory=dict)
    links: LinkTable | None = None
    roce: RoceTable = field(default_factory=lambda: RoceTable({}))
    netplan: dict[str, NetplanFile] = field(default_factory=dict)
    disk: dict[str, DiskEntry] = field(default_factory=dict)
    routes: dict[str, str | None] = field(default_factory=dict)
    """Address -> the interface the node routes it through (None: no route)."""
    resolve: dict[str, tuple[str, ...]] = field(default_factory=dict)
    python: tuple[int, ...] | None = None
    users: dict[str, bool] = field(default_factory=dict)
    probes: dict[str, ProbeResult] = field(default_factory=dict)

    # ------------------------------------------------------------ keyed reads

    def command(self, key: str) -> CommandResult | None:
        """The answer of the command requested under `key` (None when it was not asked)."""
        return self.commands.get(key)

    def output(self, key: str) -> str:
        """The standard output of the command requested under `key` ("" when not asked)."""
        found = self.commands.get(key)
        return found.out if found else ""

    def file(self, path: str) -> FileInfo | None:
        """The file fact of `path` (None when it was not asked)."""
        return self.files.get(path)

    def exists(self, path: str) -> bool:
        found = self.files.get(path)
        return bool(found and found.exists)

    def container(self, name: str, strict: bool = True) -> ContainerInfo | None:
        """`docker inspect NAME`: None when there is none; a failed inspect raises naming the
        node, unless `strict=False` reads it as absent."""
        return self._inspected(self.containers.get(name), "docker inspect", name, strict)

    def image(self, name: str, strict: bool = True) -> ImageInfo | None:
        """`docker image inspect NAME`, as `container`."""
        return self._inspected(self.images.get(name), "docker image inspect", name, strict)

    def inspect_error(self, kind: str, name: str) -> str | None:
        """Why `docker inspect` of NAME failed (kind "containers" or "images"; None: it did not)."""
        found = (self.containers if kind == "containers" else self.images).get(name)
        return found.error if found else None

    def _inspected(self, found: Inspected[InfoT] | None, what: str, name: str,
                   strict: bool) -> InfoT | None:
        if found is None:
            return None
        if found.error is not None:
            if strict:
                raise SparkctlError(f"{self.node}: `{what} {name}` failed: {found.error}")
            return None
        return found.info

    # ------------------------------------------------------------ parsing

    @classmethod
    def parse(cls, raw: Any, node: str = "node") -> NodeFacts:
        """The gatherer's JSON answer as a NodeFacts; a malformed section raises naming the node
        and the section."""
        if not isinstance(raw, dict):
            raise SparkctlError(f"{node}: the facts gatherer answered {type(raw).__name__}, "
                                "not a JSON object")
        values: dict[str, Any] = {"node": node}
        for section, (attribute, read) in _SECTIONS.items():
            if raw.get(section) is None:
                continue
            try:
                values[attribute] = read(raw[section])
            except (AttributeError, TypeError, ValueError, KeyError) as exc:
                raise SparkctlError(
                    f"{node}: the facts gatherer's `{section}` is malformed ({type(exc).__name__}: "
                    f"{exc}): {str(raw[section])[:200]!r}; is the node's sparkctl gatherer the "
                    "one this sparkctl sent?") from None
        return cls(**values)


def _mapping(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise TypeError(f"expected an object, got {type(raw).__name__}")
    return raw


def _command(raw: Any) -> CommandResult:
    raw = _mapping(raw)
    return CommandResult(int(raw.get("rc", 1)), str(raw.get("out", "")), str(raw.get("err", "")))


def _file(raw: Any) -> FileInfo:
    raw = _mapping(raw)
    return FileInfo(exists=bool(raw.get("exists")), mode=raw.get("mode"), uid=raw.get("uid"),
                    size=raw.get("size"), sha256=raw.get("sha256"), content=raw.get("content"))


def _inspect(of: Callable[[dict[str, Any]], InfoT]) -> Callable[[Any], dict[str, Inspected[InfoT]]]:
    def read(section: Any) -> dict[str, Inspected[InfoT]]:
        out: dict[str, Inspected[InfoT]] = {}
        for name, raw in _mapping(section).items():
            if raw is None:
                out[str(name)] = Inspected()
            elif "error" in _mapping(raw):
                out[str(name)] = Inspected(error=str(raw["error"]).strip())
            else:
                out[str(name)] = Inspected(of(raw))
        return out
    return read


def _space(section: Any) -> dict[str, SpaceEntry]:
    return {str(path): SpaceEntry(str(entry.get("checked", path)), entry.get("free_bytes"),
                                  bool(entry.get("readonly")), entry.get("error"))
            for path, entry in _mapping(section).items() if _mapping(entry) is not None}


def _disk(section: Any) -> dict[str, DiskEntry]:
    return {str(path): DiskEntry(entry.get("free_bytes"), entry.get("checked"), entry.get("error"))
            for path, entry in _mapping(section).items() if _mapping(entry) is not None}


def _probes(section: Any) -> dict[str, ProbeResult]:
    return {str(key): ProbeResult(int(entry.get("rc", -1)), str(entry.get("out", "")),
                                  str(entry.get("err", "")), entry.get("seconds"))
            for key, entry in _mapping(section).items() if _mapping(entry) is not None}


def _routes(section: Any) -> dict[str, str | None]:
    return {str(address): (None if dev is None else str(dev))
            for address, dev in _mapping(section).items()}


def _resolve(section: Any) -> dict[str, tuple[str, ...]]:
    return {str(host): tuple(str(a) for a in addresses or ())
            for host, addresses in _mapping(section).items()}


_SECTIONS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "hostname": ("hostname", str),
    "time": ("time", float),
    "space": ("space", _space),
    "lock": ("lock", _mapping),
    "commands": ("commands", lambda s: {str(k): _command(v) for k, v in _mapping(s).items()}),
    "files": ("files", lambda s: {str(k): _file(v) for k, v in _mapping(s).items()}),
    "containers": ("containers", _inspect(ContainerInfo.of)),
    "images": ("images", _inspect(ImageInfo.of)),
    "links": ("links", lambda s: read_links(_mapping(s))),
    "ibdev2netdev": ("roce", lambda s: read_roce(_mapping(s))),
    "netplan": ("netplan", lambda s: read_netplan(_mapping(s))),
    "disk": ("disk", _disk),
    "routes": ("routes", _routes),
    "resolve": ("resolve", _resolve),
    "python": ("python", lambda s: tuple(int(v) for v in s)),
    "users": ("users", lambda s: {str(k): bool(v) for k, v in _mapping(s).items()}),
    "probes": ("probes", _probes),
}
