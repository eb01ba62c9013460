"""One server's life, whichever engine serves it: its typed record, and what a launch does
about a server of the same name that may already run (judged from facts, planning makes no
remote call).

`decide` is the one judgement every engine uses: nothing runs -> start; the same configuration
runs and answers -> no-op; the same configuration was ready and answers no more, or a rank
ended -> restart (stalled or dead); it is still loading -> wait (no second start); another
configuration -> refused, or replaced with --replace.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, Literal

from orchestrator.engines import DEFAULT_ENGINE
from orchestrator.engines.liveness import judge, was_ready
from orchestrator.recipe import DEFAULT_HOST

Decision = Literal["noop", "loading", "start", "replace", "restart", "refuse"]


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
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        extra = data.pop("extra")
        return {**extra, **{k: v for k, v in data.items() if v is not None}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerRecord:
        """A record as found on a node, older ones included (TensorRT-LLM's had no name, no
        engine and no nodes)."""
        known = {f.name for f in fields(cls)} - {"extra"}
        given = {k: v for k, v in data.items() if k in known and v is not None}
        given.setdefault("engine", DEFAULT_ENGINE)
        given.setdefault("recipe", str(data.get("name") or "?"))
        given.setdefault("name", given["recipe"])
        given.setdefault("model", "?")
        given.setdefault("port", 0)
        given.setdefault("nodes", [])
        given.setdefault("config_hash", "")
        given.setdefault("started", "?")
        return cls(**given, extra={k: v for k, v in data.items() if k not in known})


@dataclass(frozen=True)
class Running:
    """What the serving node says about the server (orchestrator/node/serverctl.py status)."""

    record: ServerRecord | None
    alive: bool
    """Its main process (mpirun, vllm serve, the container) lives."""
    health: Any = None
    ready_log: bool = False

    @classmethod
    def from_status(cls, status: dict[str, Any], main: str) -> Running:
        server = status.get("server")
        return cls(ServerRecord.from_dict(server) if isinstance(server, dict) else None,
                   bool((status.get("pids") or {}).get(main, {}).get("alive")),
                   status.get("health"), bool(status.get("ready_log")))

    @property
    def ready(self) -> str | None:
        return was_ready(self.record.to_dict() if self.record else None, self.ready_log)


def decide(running: Running, digest: str, replace: bool, dead: tuple[str, ...] = ()) -> Decision:
    """What a launch wanting configuration DIGEST does about this server (any engine)."""
    if not running.alive:
        return "start"
    if running.record is not None and running.record.config_hash == digest:
        # alive, but a rank is gone or it was ready and answers no more: it never recovers
        if judge(running.health, running.ready, dead).restart:
            return "restart"
        return "noop" if running.health == 200 else "loading"
    return "replace" if replace else "refuse"


def restart_reason(running: Running, dead: tuple[str, ...] = ()) -> str:
    """Why the same server is restarted, for the plan and the report."""
    if dead:
        return "dead: rank ended (" + ", ".join(dead) + ")"
    return f"stalled: ready at {running.ready}, /health now {running.health or 'no answer'}"


def refusal(running: Running, wanted: str) -> str:
    r = running.record
    what = (f"{r.recipe} ({r.model}, engine {r.engine}, started {r.started})" if r else "?")
    return (f"the cluster already serves recipe {what}; launching {wanted} would replace it: "
            "pass --replace, or stop it first with `sparkctl down`")
