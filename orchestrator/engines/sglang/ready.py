"""Readiness of an SGLang server, as data (engines/readiness.py waits): SGLang's own signals.
/health answers 503 while the server starts and 200 once it serves
(sglang/srt/entrypoints/http_server.py of 0.5.12, l.505-526), and the log says "The server is
fired up and ready to roll!" (l.2033) after its warm-up request. A rank's container that exits,
or the deadline, stops the server (its containers and record) and shows every node's log tail.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn

from orchestrator.engines.placed import log_tail
from orchestrator.engines.readiness import Readiness, stop_and_fail

if TYPE_CHECKING:
    from orchestrator.engines.readiness import Target
    from orchestrator.engines.sglang.serve import ServeSpec
    from orchestrator.recipe import Note
    from orchestrator.remote.transport import Transport

READINESS = Readiness("The server is fired up and ready to roll!", needs_ready_line=True,
                      poll_seconds=2.0, dead_ranks="containers")


def target(spec: ServeSpec) -> Target:
    return spec.target("SGLang", "SGLang's rank", lambda transports, note, reason: fail_and_clean(
        transports, spec, note, reason))


def fail_and_clean(transports: dict[str, Transport], spec: ServeSpec, note: Note,
                   reason: str) -> NoReturn:
    details = "\n".join(f"--- {node}: docker logs {spec.container}\n"
                        f"{log_tail(transports.get(node), spec.container)}" for node in spec.nodes)
    stop_and_fail(transports, spec.inventory, spec.name, spec.nodes, note, reason, details)
