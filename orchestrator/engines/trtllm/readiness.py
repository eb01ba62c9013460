"""After the server is started: wait until it answers, smoke-test it, or clean up after it.

Readiness is judged over HTTP on the server's first node (through the existing SSH connection,
from inside its `up` container over 127.0.0.1), never by process liveness alone: /health, then
/health_generate (one real token through every rank), then /v1/models. A deadline or a dead
mpirun ends the wait: each of the server's nodes shows its log tail and every rank is stopped
(the server's own directory only: other servers keep running).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator.commands import quote
from orchestrator.engines.base import LaunchFailed, Ready
from orchestrator.engines.serverctl import node_call
from orchestrator.errors import EXIT_INTERRUPTED, SparkctlError
from orchestrator.remote.cluster import Cluster
from orchestrator.remote.transport import Transport

if TYPE_CHECKING:
    from orchestrator.engines.trtllm.serve import LaunchSpec

POLL_SECONDS = 3.0
PRINT_EVERY = 10.0
LOG_TAIL_LINES = 25


def _stage(status: dict[str, object]) -> str:
    if status.get("health") != 200:
        return f"loading (/health {status.get('health') or 'no answer'})"
    if status.get("health_generate") != 200:
        return f"warming up (/health_generate {status.get('health_generate') or 'no answer'})"
    return "listing models (/v1/models)"


def wait_until_ready(transports: dict[str, Transport], spec: LaunchSpec, timeout: float,
                     note: Callable[[str], None]) -> Ready:
    from orchestrator.engines.trtllm.serve import MAIN

    transports = {name: t for name, t in transports.items() if name in spec.serving}
    first = transports[spec.first]
    model, port = spec.recipe.model, spec.recipe.port
    started = time.monotonic()
    deadline = started + timeout
    last_stage, last_print = "", 0.0
    try:
        while True:
            status = node_call(first, spec.container, timeout=120, action="status", port=port,
                               deep=True, run=spec.run_dir)
            elapsed = time.monotonic() - started
            if not status.get("pids", {}).get(MAIN, {}).get("alive"):
                guarded = guard_stops(transports, spec)
                reason = ("; ".join(guarded) if guarded
                          else f"mpirun exited after {elapsed:.0f}s; a rank died or failed")
                fail_and_clean(transports, spec, note,
                               f"the server stopped while loading ({reason})")
            models = [m for m in status.get("models") or [] if m]
            if status.get("health_generate") == 200 and model in models:
                note(f"[{elapsed:6.1f}s] ready: /health, /health_generate and /v1/models answer")
                return Ready(elapsed, models)
            if time.monotonic() > deadline:
                fail_and_clean(transports, spec, note,
                               f"the server was not ready within {timeout:.0f}s (--timeout); last "
                               f"state: {_stage(status)}")
            stage = _stage(status)
            if stage != last_stage or time.monotonic() - last_print > PRINT_EVERY:
                left = deadline - time.monotonic()
                note(f"[{elapsed:6.1f}s] {stage}; deadline in {left:.0f}s")
                last_stage, last_print = stage, time.monotonic()
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        raise SparkctlError(
            f"stopped waiting; {spec.name} keeps loading on {spec.first}. Follow it with "
            f"`sparkctl logs --server {spec.name} --follow` or `sparkctl status`; stop it with "
            f"`sparkctl down --server {spec.name}`",
            EXIT_INTERRUPTED,
        ) from None


def guard_stops(transports: dict[str, Transport], spec: LaunchSpec) -> list[str]:
    """What the memory guard recorded on any node (it stopped the server there), one a line."""
    from orchestrator.phases.memory import describe_stop, stop_record

    def one(transport: Transport) -> str:
        try:
            record = stop_record(node_call(transport, spec.container, timeout=60,
                                           action="status", run=spec.run_dir))
        except (SparkctlError, ValueError, KeyError):
            return ""
        return describe_stop(record) if record else ""

    return [text for text in Cluster(transports).values(lambda _, t: one(t)).values() if text]


def log_tails(transports: dict[str, Transport], directory: str,
              lines: int = LOG_TAIL_LINES) -> dict[str, str]:
    """The end of the server's logs on each of its nodes (server.log on the first, rank-N.log
    each)."""
    command = (f"cd {quote(directory)} 2>/dev/null && for f in server.log rank-*.log; do "
               f'[ -f "$f" ] && {{ echo "==> $f <=="; tail -n {lines} "$f"; }}; done; true')

    def one(transport: Transport) -> str:
        try:
            result = transport.run(command, sudo=True, timeout=60, display="tail server logs")
            return result.stdout.strip() or "(no server logs)"
        except SparkctlError as exc:
            return f"(could not read the logs: {exc})"

    return Cluster(transports).values(lambda _, transport: one(transport))


def stop_everywhere(transports: dict[str, Transport], spec: LaunchSpec) -> dict[str, str]:
    """Stop every process of the server, on each of its nodes; returns what was left per node."""
    def one(transport: Transport) -> str:
        try:
            answer = node_call(transport, spec.container, timeout=120, action="stop",
                               run=spec.run_dir)
        except SparkctlError as exc:
            return f"could not stop: {exc}"
        return f"still running: {answer['left']}" if answer.get("left") else ""

    return Cluster(transports).values(lambda _, transport: one(transport))


def fail_and_clean(transports: dict[str, Transport], spec: LaunchSpec,
                   note: Callable[[str], None], reason: str) -> None:
    tails = log_tails(transports, spec.run_dir)
    note(f"{reason}; stopping every rank")
    left = stop_everywhere(transports, spec)
    parts = [f"--- {name}: last lines of {spec.run_dir}/*.log\n{tail}"
             for name, tail in tails.items()]
    problems = [f"{name}: {text}" for name, text in left.items() if text]
    stopped = ("every rank was stopped" if not problems else "NOT everything stopped: "
               + "; ".join(problems) + " (run `sparkctl down`)")
    raise LaunchFailed(f"{reason}; {stopped} (log tails below)", "\n".join(parts))
