"""After the server is started: wait until it answers, smoke-test it, or clean up after it.

Readiness is judged over HTTP on the head (through the existing SSH connection, from inside the
head container over 127.0.0.1), never by process liveness alone: /health, then /health_generate
(one real token through every rank), then /v1/models. A deadline or a dead mpirun ends the wait:
every node's log tail is shown and every rank is stopped.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from orchestrator.commands import quote
from orchestrator.engines.base import LaunchFailed, Ready
from orchestrator.engines.serverctl import node_call
from orchestrator.errors import EXIT_INTERRUPTED, SparkctlError
from orchestrator.inventory import Inventory
from orchestrator.paths import RUN_DIR
from orchestrator.remote.cluster import Cluster
from orchestrator.remote.transport import Transport

POLL_SECONDS = 3.0
PRINT_EVERY = 10.0
LOG_TAIL_LINES = 25


def _stage(status: dict[str, object]) -> str:
    if status.get("health") != 200:
        return f"loading (/health {status.get('health') or 'no answer'})"
    if status.get("health_generate") != 200:
        return f"warming up (/health_generate {status.get('health_generate') or 'no answer'})"
    return "listing models (/v1/models)"


def wait_until_ready(
    transports: dict[str, Transport], inventory: Inventory, model: str, port: int,
    timeout: float, note: Callable[[str], None],
) -> Ready:
    head = transports[inventory.head_name]
    container = inventory.container.name
    started = time.monotonic()
    deadline = started + timeout
    last_stage, last_print = "", 0.0
    try:
        while True:
            status = node_call(head, container, timeout=120, action="status", port=port, deep=True)
            elapsed = time.monotonic() - started
            if not status.get("pids", {}).get("mpirun.pid", {}).get("alive"):
                guarded = guard_stops(transports, container)
                reason = ("; ".join(guarded) if guarded
                          else f"mpirun exited after {elapsed:.0f}s; a rank died or failed")
                fail_and_clean(transports, inventory, note,
                               f"the server stopped while loading ({reason})")
            models = [m for m in status.get("models") or [] if m]
            if status.get("health_generate") == 200 and model in models:
                note(f"[{elapsed:6.1f}s] ready: /health, /health_generate and /v1/models answer")
                return Ready(elapsed, models)
            if time.monotonic() > deadline:
                fail_and_clean(transports, inventory, note,
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
            f"stopped waiting; the server keeps loading on {inventory.head_name}. Follow it with "
            "`sparkctl logs --follow` or `sparkctl status`; stop it with `sparkctl down`",
            EXIT_INTERRUPTED,
        ) from None


def guard_stops(transports: dict[str, Transport], container: str) -> list[str]:
    """What the memory guard recorded on any node (it stopped the server there), one a line."""
    from orchestrator.phases.memory import describe_stop, stop_record

    def one(transport: Transport) -> str:
        try:
            record = stop_record(node_call(transport, container, timeout=60, action="status"))
        except (SparkctlError, ValueError, KeyError):
            return ""
        return describe_stop(record) if record else ""

    return [text for text in Cluster(transports).values(lambda _, t: one(t)).values() if text]


def log_tails(transports: dict[str, Transport], lines: int = LOG_TAIL_LINES) -> dict[str, str]:
    """The end of every server log on every node (server.log on the head, rank-N.log each)."""
    command = (f"cd {quote(RUN_DIR)} 2>/dev/null && for f in server.log rank-*.log; do "
               f'[ -f "$f" ] && {{ echo "==> $f <=="; tail -n {lines} "$f"; }}; done; true')

    def one(transport: Transport) -> str:
        try:
            result = transport.run(command, sudo=True, timeout=60, display="tail server logs")
            return result.stdout.strip() or "(no server logs)"
        except SparkctlError as exc:
            return f"(could not read the logs: {exc})"

    return Cluster(transports).values(lambda _, transport: one(transport))


def stop_everywhere(transports: dict[str, Transport], container: str) -> dict[str, str]:
    """Stop every process sparkctl recorded, on every node; returns what was left per node."""
    def one(transport: Transport) -> str:
        try:
            answer = node_call(transport, container, timeout=120, action="stop")
        except SparkctlError as exc:
            return f"could not stop: {exc}"
        return f"still running: {answer['left']}" if answer.get("left") else ""

    return Cluster(transports).values(lambda _, transport: one(transport))


def fail_and_clean(transports: dict[str, Transport], inventory: Inventory,
                   note: Callable[[str], None], reason: str) -> None:
    tails = log_tails(transports)
    note(f"{reason}; stopping every rank")
    left = stop_everywhere(transports, inventory.container.name)
    parts = [f"--- {name}: last lines of {RUN_DIR}/*.log\n{tail}" for name, tail in tails.items()]
    problems = [f"{name}: {text}" for name, text in left.items() if text]
    stopped = ("every rank was stopped" if not problems else "NOT everything stopped: "
               + "; ".join(problems) + " (run `sparkctl down`)")
    raise LaunchFailed(f"{reason}; {stopped} (log tails below)", "\n".join(parts))
