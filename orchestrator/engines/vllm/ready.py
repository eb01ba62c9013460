"""Readiness of a vLLM server, as data (engines/readiness.py waits): /health, then /v1/models
naming the model. vllm serve exiting while it loads, or the deadline, stops the server (its
containers and record, engines/servers.py) and shows vllm serve's log and every node's Ray log
tail.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

from orchestrator.commands import quote
from orchestrator.engines.readiness import Readiness, stop_and_fail

if TYPE_CHECKING:
    from orchestrator.engines.readiness import Target
    from orchestrator.engines.vllm.serve import ServeSpec
    from orchestrator.recipe import Note
    from orchestrator.remote.transport import Transport

READINESS = Readiness("Application startup complete.",  # uvicorn's, under vllm serve
                      paths=("/health",), poll_seconds=3.0, dead_ranks="launcher")
"""/health, then /v1/models naming the model (no /health_generate); a rank that dies takes
`vllm serve` down, so its pid file in the first node's container is the dead-rank check."""


def target(spec: ServeSpec) -> Target:
    from orchestrator.engines.vllm.serve import MAIN, OURS

    return spec.target(f"vllm serve of {spec.name}", "Ray" if spec.backend == "ray" else "rank",
                       lambda transports, note, reason: fail_and_clean(transports, spec, note,
                                                                       reason),
                       run_dir=spec.directory, main=MAIN, ours=tuple(OURS))


def fail_and_clean(transports: dict[str, Transport], spec: ServeSpec, note: Note,
                   reason: str) -> NoReturn:
    from orchestrator.engines.vllm.ray import ray_log_tail

    log = f"{spec.directory}/server.log"
    tail = transports[spec.first].run(f"tail -n 30 {quote(log)} 2>/dev/null; true", sudo=True,
                                      timeout=60, display="tail server.log").stdout.strip()
    parts = [f"--- {spec.first}: last lines of {log}\n{tail or '(empty)'}"]
    what = "Ray" if spec.backend == "ray" else "rank"
    for name in spec.nodes:
        if name in transports:
            parts.append(f"--- {name}: {what} ({spec.container})\n"
                         + ray_log_tail(transports[name], spec.container, 8))
    stop_and_fail(transports, spec.inventory, spec.name, spec.nodes, note, reason,
                  "\n".join(parts))
