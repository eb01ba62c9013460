"""Whether a launched server is loading, serving, stalled or dead, for every engine (pure).

A server that never answered yet is loading ("starting"); one that was ready once and no longer
answers is not loading: it is *stalled* (an engine that lost a rank or its fabric link answers
/health 503 and never comes back). A rank process that ended makes the server *dead*, whatever
/health says. "Was ready" comes from the server record's `ready_at` (written by `launch` when its
readiness check passes, see `mark_ready`) or from the engine's own ready line in its log
(`Engine.readiness.ready_line`, which the node scripts get as an argument).
`status` reports these verdicts and `launch` of the same recipe restarts a stalled or dead server
instead of calling it "already running" or waiting out its deadline.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from orchestrator.commands import quote

if TYPE_CHECKING:
    from orchestrator.remote.transport import Transport

READY_KEY = "ready_at"


@dataclass(frozen=True)
class Verdict:
    state: str  # healthy | starting | stalled | dead | unhealthy | down
    problem: str = ""

    @property
    def restart(self) -> bool:
        """`launch` of the same configuration restarts the server rather than keeping it."""
        return self.state in ("stalled", "dead")


def was_ready(record: dict[str, Any] | None, ready_log: bool = False) -> str | None:
    """When the server was known ready: its record's ready_at, "its log" from the ready line."""
    if isinstance(record, dict) and record.get(READY_KEY):
        return str(record[READY_KEY])
    return "(its log says so)" if ready_log else None


def judge(health: Any, ready: str | None, dead: list[str] | tuple[str, ...] = (),
          second: tuple[str, Any] | None = None, port: Any = None,
          main_alive: bool | None = None) -> Verdict:
    """The server's state from /health (an HTTP code, or the error text), when it was ready
    (None: never yet), the rank processes that ended ("rank-1 on spark-b (pid 9)"), the
    engine's second probe (path, answer) when /health is 200, and whether its main process
    (mpirun, vllm serve) lives (None: not known)."""
    if main_alive is False:
        return Verdict("down", f"the server's main process ended (port {port}: {health}); "
                               "`sparkctl logs` shows why; `sparkctl launch` starts it again")
    if dead:
        return Verdict("dead", f"rank process ended: {', '.join(dead)}; the server cannot serve "
                               "again: `sparkctl launch` of the same recipe restarts it "
                               "(`sparkctl logs` shows why it ended)")
    second_ok = second is None or second[1] == 200
    if health == 200 and second_ok:
        return Verdict("healthy")
    if ready:
        return Verdict("stalled", f"server stalled: it was ready ({ready}) and now "
                                  f"{_answer(health, second, port)}: it lost a rank or its "
                                  "fabric link and will not recover by itself; `sparkctl "
                                  "launch` of the same recipe restarts it")
    if health == 503:
        return Verdict("starting", "server is still loading (/health answers 503)")
    if health == 200 and second is not None:
        return Verdict("unhealthy", f"server answers /health but not {second[0]} ({second[1]}): "
                                    "a rank may have died; see `sparkctl logs`")
    reason = health if health is not None else "no answer"
    return Verdict("down", f"server not answering on port {port} ({reason}): crashed? see "
                           "`sparkctl logs`")


def _answer(health: Any, second: tuple[str, Any] | None, port: Any) -> str:
    if health == 200 and second is not None:
        return f"answers {second[0]} {second[1]}"
    if isinstance(health, int) and health:
        return f"answers /health {health}"
    return f"does not answer on port {port} ({health or 'no answer'})"


def dead_ranks(pids_by_node: dict[str, dict[str, Any]]) -> list[str]:
    """Rank pid files (rank-N.pid) whose process ended, per node: "rank-1 on spark-b (pid 9)"."""
    out = []
    for node, pids in sorted(pids_by_node.items()):
        for name, info in sorted((pids or {}).items()):
            if name.startswith("rank-") and isinstance(info, dict) and not info.get("alive"):
                out.append(f"{name.removesuffix('.pid')} on {node} (pid {info.get('pid')})")
    return out


def ready_now() -> str:
    """A server record's ready_at for a server ready now."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def mark_ready_cmd(record_path: str, when: str | None = None) -> str:
    """The node command that adds ready_at to a server record (kept if already there); the
    readiness wait of node/probe.py sets it itself once ready where it can (engines/readiness.py)."""
    from orchestrator.node import script

    return "python3 -c " + " ".join(quote(a) for a in (script("probe.py"), "--mark", record_path,
                                                        when or ready_now()))


def mark_ready(transport: Transport, record_path: str) -> str | None:
    """Record that the server is ready (launch's readiness passed); None, or why it could not."""
    from orchestrator.errors import SparkctlError

    try:
        result = transport.run(mark_ready_cmd(record_path), sudo=True, timeout=60,
                               display=f"record ready_at in {record_path}")
    except SparkctlError as exc:
        return f"could not record ready_at in {record_path}: {exc}"
    if not result.ok:
        return f"could not record ready_at in {record_path}: {result.stderr.strip()[-200:]}"
    return None
