"""Every server as a node listed it, read once into typed records: what its server.json says
(ServerRecord, written by every engine's launch) and what the node saw (Server: alive, /health,
its processes). Shared vocabulary: engines write and judge them, phases (the gateway's
replicas), the judges and cli/ read them.

node/servers.py prints each node's records with its observations; `read_server` turns one into
a `Server`, refusing a malformed record with the node, the server and the key named (a record is
written by sparkctl: a wrong type there is a damaged file, never something to guess about).
Every reader (placement, status, chat, down, the gateway) then uses attributes, never string
lookups (a structure test bans them in phases/ and engines/).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from orchestrator.errors import SparkctlError
from orchestrator.recipe import DEFAULT_HOST


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class ServerRecord:
    """What every engine records about a server it started (server.json): status, chat, tunnel,
    down, bench and a relaunch read it. Engine-specific figures go in `extra` (written flat,
    next to the common fields, so older readers keep finding them)."""

    name: str
    engine: str
    recipe: str
    model: str
    port: int
    nodes: list[str]
    """The serving nodes in rank order; the first is where it answers."""
    config_hash: str
    host: str = DEFAULT_HOST
    ranks: int = 1
    """Processes (or containers) that make the server: tp x pp."""
    started: str = field(default_factory=now)
    ready_at: str | None = None
    persistent: bool = False
    guard_min_available_gb: float | None = None
    """The memory guard's threshold on every serving node (None: no guard)."""
    memory_gb: float | None = None
    """The per-node memory estimate (what placing another server on these nodes counts)."""
    container: str | None = None
    tp_size: int | None = None
    dist_port: int | None = None
    """The port ranks meet on (SGLang's), taken on every node of a multi-node server."""
    listen_ports: list[int] | None = None
    """Every other port it binds (vLLM's Ray ports)."""
    main: str | None = None
    """Its main process's pid file, for processes in a shared container (TensorRT-LLM's mpirun)."""
    ours: list[str] | None = None
    """Words of its processes' command lines (a pid file naming anything else is not its)."""
    pid_file: str | None = None
    """A process started in its own container by `docker exec` (vLLM's vllm serve)."""
    api_key_file: str | None = None
    """Its API key's file on its nodes (never the key)."""
    recipe_file: str | None = None
    """The recipe file it was launched from (None: a built-in recipe)."""
    migrated_from: str | None = None
    """The earlier single record this one was converted from (node/servers.py's migration)."""
    port_guard: str | None = None
    """The firewall chain that keeps its ports to the fabric (phases/port_guards.py)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        extra = data.pop("extra")
        return {**extra, **{k: v for k, v in data.items() if v is not None}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerRecord:
        """A record as found on a node (read_record checks its fields first)."""
        known = {f.name for f in fields(cls)} - {"extra"}
        given = {k: v for k, v in data.items() if k in known and v is not None}
        given.setdefault("engine", "?")
        given.setdefault("name", str(data.get("recipe") or "?"))
        given.setdefault("recipe", given["name"])
        given.setdefault("model", "?")
        given.setdefault("port", 0)
        given.setdefault("nodes", [])
        given.setdefault("config_hash", "")
        given.setdefault("started", "?")
        return cls(**given, extra={k: v for k, v in data.items() if k not in known})


class RecordError(SparkctlError):
    """A server record that cannot be read as one (a damaged server.json)."""


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _words(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(w, str) for w in value)


def _ports(value: Any) -> bool:
    return isinstance(value, list) and all(_whole(p) for p in value)


KINDS: dict[str, tuple[Any, str]] = {
    "name": (lambda v: isinstance(v, str) and v != "", "a non-empty name"),
    "engine": (lambda v: isinstance(v, str), "an engine name"),
    "recipe": (lambda v: isinstance(v, str), "a recipe name"),
    "model": (lambda v: isinstance(v, str), "a model id"),
    "port": (_whole, "a port number"),
    "nodes": (_words, "a list of node names"),
    "config_hash": (lambda v: isinstance(v, str), "a digest"),
    "host": (lambda v: isinstance(v, str), "an address"),
    "ranks": (_whole, "a whole number"),
    "started": (lambda v: isinstance(v, str), "a time"),
    "ready_at": (lambda v: isinstance(v, str), "a time"),
    "persistent": (lambda v: isinstance(v, bool), "true or false"),
    "guard_min_available_gb": (_number, "a number of GB"),
    "memory_gb": (_number, "a number of GB"),
    "container": (lambda v: isinstance(v, str), "a container name"),
    "tp_size": (_whole, "a whole number"),
    "dist_port": (_whole, "a port number"),
    "listen_ports": (_ports, "a list of port numbers"),
    "main": (lambda v: isinstance(v, str), "a pid file name"),
    "ours": (_words, "a list of words"),
    "pid_file": (lambda v: isinstance(v, str), "a path"),
    "api_key_file": (lambda v: isinstance(v, str), "a path"),
    "recipe_file": (lambda v: isinstance(v, str), "a path"),
    "migrated_from": (lambda v: isinstance(v, str), "a path"),
    "port_guard": (lambda v: isinstance(v, str), "a firewall chain's name"),
}
"""What each field of a record must be (None: not recorded)."""


@dataclass(frozen=True)
class ProcessUse:
    """One node's processes of a server (what status shows: the process, its memory)."""

    node: str
    process: str
    rss_mb: float

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "process": self.process, "rss_mb": self.rss_mb}


@dataclass(frozen=True)
class Server:
    """One server found on a node: its record and what the node saw."""

    record: ServerRecord
    node: str
    """The node that holds its record (its first node)."""
    alive: bool = False
    health: int | None = None
    """/health's HTTP code on its node (0: no answer; None: not asked)."""
    ready_log: bool = False
    """Its engine logged that it served (tells stalled from loading)."""
    keyless: int | None = None
    """What /v1/models answered without its API key (401/403: the key is enforced)."""
    memguard: dict[str, Any] | None = None
    """The memory guard's stop record (node/memguard.py), if a guard stopped it."""
    processes: tuple[ProcessUse, ...] = ()
    ended: tuple[str, ...] = ()
    """Its processes that ended (a rank, mpirun), named with their node."""
    dead_nodes: tuple[str, ...] = ()
    """Nodes where its part (a container, a rank) no longer runs."""

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def engine(self) -> str:
        return self.record.engine

    @property
    def nodes(self) -> list[str]:
        return self.record.nodes or [self.node]

    @property
    def migrated(self) -> bool:
        """Launched by an earlier sparkctl as the cluster's single server (node/servers.py's
        one-time migration converted its record)."""
        return self.record.migrated_from is not None

    def to_dict(self) -> dict[str, Any]:
        """The record and what was seen, flat (status's servers list, `--json`)."""
        return {**self.record.to_dict(), "node": self.node, "alive": self.alive,
                "health": self.health, "ready_log": self.ready_log, "keyless": self.keyless,
                "memguard": self.memguard, "legacy": self.migrated,
                "processes": [p.to_dict() for p in self.processes],
                **({"ended": list(self.ended)} if self.ended else {}),
                **({"dead_nodes": list(self.dead_nodes)} if self.dead_nodes else {})}


SEEN = ("alive", "health", "ready_log", "keyless", "memguard")
"""What node/servers.py adds to a record (not part of server.json)."""


def read_record(data: dict[str, Any], where: str) -> ServerRecord:
    """A record as written (server.json), its fields checked: RecordError names WHERE (node
    and server) and the key."""
    known = {f.name for f in fields(ServerRecord)} - {"extra"}
    for key, value in data.items():
        if key in known and value is not None:
            valid, what = KINDS.get(key, (lambda v: True, ""))
            if not valid(value):
                raise RecordError(
                    f"{where}: key {key!r} is {value!r}, not {what}: the record was damaged; "
                    "`sparkctl down --server NAME` removes it (then launch again)")
    for key in ("name", "engine", "nodes", "port"):
        if data.get(key) is None:
            raise RecordError(f"{where}: key {key!r} is missing: the record was damaged; "
                              "`sparkctl down --server NAME` removes it (then launch again)")
    return ServerRecord.from_dict({k: v for k, v in data.items() if k not in SEEN})


def read_server(data: Any, node: str) -> Server:
    """One entry of node/servers.py's answer on NODE."""
    if not isinstance(data, dict):
        raise RecordError(f"{node}: a server record is {type(data).__name__}, not an object")
    where = f"{node}: server {data.get('name', '?')}"
    record = read_record(data, where)
    health, keyless = data.get("health"), data.get("keyless")
    return Server(record, node, alive=bool(data.get("alive")),
                  health=health if _whole(health) else None,
                  ready_log=bool(data.get("ready_log")),
                  keyless=keyless if _whole(keyless) else None,
                  memguard=data.get("memguard") if isinstance(data.get("memguard"), dict) else None)


@dataclass(frozen=True)
class Member:
    """A named server's part on one node (node/servers.py's "members"): its container or its
    processes there."""

    running: bool
    process: str = ""
    rss_kb: int = 0
    ended: tuple[str, ...] = ()
    memguard: dict[str, Any] | None = None

    @classmethod
    def read(cls, data: Any) -> Member | None:
        if not isinstance(data, dict):
            return None
        ended = data.get("ended")
        guard = data.get("memguard")
        rss: Any = data.get("rss_kb")
        return cls(bool(data.get("running")), str(data.get("process") or ""),
                   int(rss) if _whole(rss) else 0,
                   tuple(str(e) for e in ended) if isinstance(ended, list) else (),
                   guard if isinstance(guard, dict) else None)


@dataclass
class NodeAnswer:
    """node/servers.py's answer on one node: its servers' records and its members by server."""

    servers: list[Server] = field(default_factory=list)
    members: dict[str, Member] | None = None
    """None when the answer has none (no verdict on that node then)."""
