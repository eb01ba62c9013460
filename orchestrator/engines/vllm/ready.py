"""Readiness of a vLLM server, on its first node: /health, then /v1/models naming the model, with
progress and a deadline. vllm serve exiting while it loads, or the deadline, stops the server
(its containers and record, engines/servers.py) and shows vllm serve's log and every node's Ray
log tail.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from orchestrator.commands import quote
from orchestrator.engines.base import LaunchFailed, Note, Ready
from orchestrator.errors import EXIT_INTERRUPTED, SparkctlError

if TYPE_CHECKING:
    from orchestrator.engines.vllm.serve import ServeSpec
    from orchestrator.remote.transport import Transport

POLL_SECONDS = 3.0


def running(status: dict[str, object]) -> bool:
    from orchestrator.engines.vllm.serve import MAIN

    pids = status.get("pids") or {}
    return bool(isinstance(pids, dict) and (pids.get(MAIN) or {}).get("alive"))


def wait_until_ready(transports: dict[str, Transport], spec: ServeSpec, timeout: float,
                     note: Note) -> Ready:
    first = transports[spec.first]
    started = time.monotonic()
    deadline = started + timeout
    last = ""
    try:
        while True:
            current = spec.status(first, deep=True)
            elapsed = time.monotonic() - started
            if not running(current):
                fail_and_clean(transports, spec, note,
                               f"vllm serve of {spec.name} exited while loading (after {elapsed:.0f}s)")
            models = [m for m in current.get("models") or [] if m]
            if current.get("health") == 200 and spec.recipe.model in models:
                note(f"[{elapsed:6.1f}s] ready: /health and /v1/models answer")
                return Ready(elapsed, models)
            if time.monotonic() > deadline:
                fail_and_clean(transports, spec, note,
                               f"vllm serve of {spec.name} was not ready within {timeout:.0f}s "
                               "(--timeout)")
            stage = f"loading (/health {current.get('health') or 'no answer'})"
            if stage != last:
                note(f"[{elapsed:6.1f}s] {spec.name} on {spec.first}: {stage}; deadline in "
                     f"{deadline - time.monotonic():.0f}s")
                last = stage
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        raise SparkctlError(
            f"stopped waiting; vLLM ({spec.name}) keeps loading on {spec.first}. Follow it with "
            f"`sparkctl logs --server {spec.name}` or `sparkctl status`; stop it with `sparkctl "
            f"down --server {spec.name}`", EXIT_INTERRUPTED) from None


def fail_and_clean(transports: dict[str, Transport], spec: ServeSpec, note: Note,
                   reason: str) -> None:
    from orchestrator.engines.servers import stop_server
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
    note(f"{reason}; stopping {spec.name}")
    left = ""
    try:
        stop_server(transports, spec.inventory, {"name": spec.name, "nodes": spec.nodes})
    except SparkctlError as exc:
        left = f" (could not stop it: {exc})"
    raise LaunchFailed(f"{reason}; {spec.name} stopped{left} (log tails below)", "\n".join(parts))


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
    container, where the HF cache is mounted), as "PATH: what is wrong"."""
    from orchestrator.commands import docker_exec_cmd
    from orchestrator.engines.base import CONTAINER_HF_HOME
    from orchestrator.node import script

    repo = f"{CONTAINER_HF_HOME}/hub/models--{spec.recipe.model.replace('/', '--')}"
    command = docker_exec_cmd(spec.container, ["python3", "-c", script("weights_check.py"), repo])
    found = transport.run(command, sudo=True, timeout=120, display="check the weights files")
    node_cache = spec.inventory.cluster.hf_cache.rstrip("/")  # where the container's is mounted
    return [line.replace(CONTAINER_HF_HOME, node_cache, 1)
            for line in found.stdout.splitlines() if line.strip()] if found.ok else []
