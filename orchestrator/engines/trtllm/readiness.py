"""Readiness of a TensorRT-LLM server, as data (engines/readiness.py waits), and the clean-up
after one that never comes.

Readiness is judged over HTTP on the server's first node (through the existing SSH connection,
from inside its `up` container over 127.0.0.1), never by process liveness alone: /health, then
/health_generate (one real token through every rank), then /v1/models. A deadline or a dead
mpirun ends the wait: each of the server's nodes shows its log tail and every rank is stopped
(the server's own directory only: other servers keep running).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from orchestrator.commands import quote
from orchestrator.engines.base import LaunchFailed
from orchestrator.engines.readiness import Readiness
from orchestrator.engines.serverctl import node_call
from orchestrator.errors import SparkctlError
from orchestrator.remote.cluster import Cluster
from orchestrator.remote.transport import Transport

if TYPE_CHECKING:
    from orchestrator.engines.readiness import Target
    from orchestrator.engines.trtllm.serve import LaunchSpec

LOG_TAIL_LINES = 25
READINESS = Readiness("Application startup complete.",  # uvicorn's, under trtllm-serve
                      paths=("/health", "/health_generate"), poll_seconds=3.0,
                      dead_ranks="launcher")
"""/health, /health_generate (one real token through every rank), then /v1/models; a rank that
dies ends mpirun, so mpirun's pid file in the `up` container is the dead-rank check."""


def target(spec: LaunchSpec) -> Target:
    from orchestrator.engines.trtllm.serve import MAIN, OURS

    def own(transports: dict[str, Transport]) -> dict[str, Transport]:
        return {name: t for name, t in transports.items() if name in spec.nodes}

    return spec.target("mpirun", "a rank", lambda transports, note, reason: fail_and_clean(
        own(transports), spec, note, reason), run_dir=spec.run_dir, main=MAIN, ours=OURS,
        why_dead=lambda transports: guard_stops(own(transports), spec))


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
                   note: Callable[[str], None], reason: str) -> NoReturn:
    tails = log_tails(transports, spec.run_dir)
    note(f"{reason}; stopping every rank")
    left = stop_everywhere(transports, spec)
    parts = [f"--- {name}: last lines of {spec.run_dir}/*.log\n{tail}"
             for name, tail in tails.items()]
    problems = [f"{name}: {text}" for name, text in left.items() if text]
    stopped = ("every rank was stopped" if not problems else "NOT everything stopped: "
               + "; ".join(problems) + " (run `sparkctl down`)")
    raise LaunchFailed(f"{reason}; {stopped} (log tails below)", "\n".join(parts))
