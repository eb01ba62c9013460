"""One server's life, whichever engine serves it: its typed record, and what a launch does
about a server of the same name that may already run (judged from facts, planning makes no
remote call).

`decide` is the one judgement every engine uses: nothing runs -> start; the same configuration
runs and answers -> no-op; the same configuration was ready and answers no more, or a rank
ended -> restart (stalled or dead); it is still loading -> wait (no second start); another
configuration -> refused, or replaced with --replace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.engines.liveness import judge, was_ready
from orchestrator.records import Server, ServerRecord, now

__all__ = ["Decision", "Running", "ServerRecord", "decide", "now", "refusal", "restart_reason",
           "running_of"]

Decision = Literal["noop", "loading", "start", "replace", "restart", "refuse"]


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


def running_of(server: Server) -> Running:
    """A server as node/servers.py listed it, for the judgement below."""
    return Running(server.record, server.alive, server.health, server.ready_log)


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
