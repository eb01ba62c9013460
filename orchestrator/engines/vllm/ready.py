"""Readiness of a vLLM server, as data (engines/readiness.py waits): /health, then /v1/models
naming the model. vllm serve exiting while it loads, or the deadline, stops the server (its
containers and record, engines/servers.py) and shows vllm serve's log and every node's Ray log
tail.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NoReturn

from orchestrator.commands import quote
from orchestrator.engines.readiness import Readiness, stop_and_fail
from orchestrator.remote.container import ContainerTransport

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
    first = transports[spec.first]
    tail = first.run(f"tail -n 30 {quote(log)} 2>/dev/null; true", sudo=True,
                     timeout=60, display="tail server.log").stdout.strip()
    parts = [f"--- {spec.first}: last lines of {log}\n{tail or '(empty)'}"]
    causes = root_causes(first, log)
    if causes:
        reason += f": {causes[-1]}"
        broken = broken_weights(first, spec) if "safetensor" in " ".join(causes).lower() else []
        if broken:
            reason += ("; broken weights file(s) in the HF cache of " + spec.first + ": "
                       + "; ".join(broken) + " (remove them; the next launch downloads them again)")
    what = "Ray" if spec.backend == "ray" else "rank"
    for name in spec.nodes:
        if name in transports:
            parts.append(f"--- {name}: {what} ({spec.container})\n"
                         + ray_log_tail(transports[name], spec.container, 8))
    stop_and_fail(transports, spec.inventory, spec.name, spec.nodes, note, reason,
                  "\n".join(parts))


PREFIX = r"^(\([^)]*\) )?([A-Z]+ [0-9-]+ [0-9:]+ \[[^]]*\] )?"
"""What vLLM puts before a line of its processes: "(Worker pid=9) ERROR 11-28 03:25:23
[multiproc_executor.py:948] " (a traceback logged line by line), or "(EngineCore pid=9) "."""
CAUSE = PREFIX + r"[A-Za-z_.]*[A-Za-z](Error|Exception): "
"""The last line of a Python traceback: the exception and its message (vLLM logs the root
cause's traceback, then its own "Engine core initialization failed" on top)."""


def root_causes(transport: Transport, log: str) -> list[str]:
    """The exceptions vllm serve's log ends its tracebacks with, oldest first, each once."""
    found = transport.run(f"grep -E {quote(CAUSE)} {quote(log)} 2>/dev/null | tail -n 20; true",
                          sudo=True, timeout=60, display="the errors in server.log").stdout
    causes: list[str] = []
    for line in found.splitlines():
        line = re.sub(PREFIX, "", line.strip())
        if line and line not in causes and not line.startswith("RuntimeError: Engine core"):
            causes.append(line)
    return causes


def broken_weights(transport: Transport, spec: ServeSpec) -> list[str]:
    """The model's safetensors files that are not whole (node/weights_check.py, in the server's
    container, where the HF cache is mounted), as "PATH: what is wrong" at the node's path."""
    from orchestrator.node import script
    from orchestrator.recipe import CONTAINER_HF_HOME

    repo = f"{CONTAINER_HF_HOME}/hub/models--{spec.recipe.model.replace('/', '--')}"
    found = ContainerTransport(transport, spec.container).run(
        ["python3", "-c", script("weights_check.py"), repo], sudo=True, timeout=120,
        display="check the weights files")
    node_cache = spec.inventory.cluster.hf_cache.rstrip("/")  # where the container's is mounted
    return [line.replace(CONTAINER_HF_HOME, node_cache, 1)
            for line in found.stdout.splitlines() if line.strip()] if found.ok else []
