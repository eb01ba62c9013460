"""Readiness of a llama.cpp server, on its first node: llama-server answers /health 503
("Loading model") while it loads and 200 once it serves (tools/server/server-http.cpp), logs
"model loaded" (tools/server/server.cpp), and lists the model under its --alias at /v1/models.
A llama-server that exits (a corrupt GGUF, a port taken, an rpc-server gone) or an rpc-server
container that ends, or the deadline, stops the server (every node's container and the record)
and says why with llama.cpp's own error lines (`E ...`: they name the file, the port).
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from orchestrator.engines.base import LaunchFailed, Note, Ready
from orchestrator.engines.placed import log_tail, parse_poll, probe_cmd, running_cmd
from orchestrator.errors import EXIT_INTERRUPTED, SparkctlError

if TYPE_CHECKING:
    from orchestrator.engines.llamacpp.serve import ServeSpec
    from orchestrator.remote.transport import Transport

READY_LINE = "llama_server: model loaded"
POLL_SECONDS = 1.0
ERROR_LINE = re.compile(r"^(?:\S+\s+)?\d+\.\d+\.\d+\.\d+ E (.*)$|^(?:\S+\s+)?(error: .*)$")


def poll_cmd(container: str, port: int, host: str = "127.0.0.1", key_file: str | None = None) -> str:
    return f"echo \"running=$({running_cmd(container)})\"; " + probe_cmd(port, host, key_file)


def errors(log: str, limit: int = 3) -> list[str]:
    """llama.cpp's error lines (level E), most telling first: those naming a file or a port,
    then the others in log order."""
    found: list[str] = []
    for line in log.splitlines():
        match = ERROR_LINE.match(line.strip())
        text = " ".join((match.group(1) or match.group(2)).split()) if match else ""
        if text and text not in found and "common_fit_params" not in text:
            found.append(text)
    # the lines that name the file or the port first (a log's streams may interleave)
    return sorted(found, key=lambda text: not ("/" in text or "port" in text))[:limit]


BROKEN_GGUF = ("model is corrupted or incomplete", "corrupted model:", "failed to read magic",
               "failed to read header", "failed to read tensor info", "failed to read tensor data",
               "failed to read key-value pairs")
"""What llama.cpp logs for a GGUF file cut short or damaged, at the pinned version
(src/llama-model-loader.h: a tensor's data beyond the file's end; ggml/src/gguf.cpp's
gguf_init_from_reader: a part of the file it cannot read)."""


def fail_and_clean(transports: dict[str, Transport], spec: ServeSpec, note: Note, reason: str) -> None:
    from orchestrator.engines.servers import stop_server

    tails = {node: log_tail(transports.get(node), spec.container, 40) for node in spec.nodes}
    said = errors(tails.get(spec.first, ""))
    if said:
        reason += ": " + "; ".join(said)
    broken = [node for node, tail in tails.items() if any(w in tail for w in BROKEN_GGUF)]
    if broken:  # the models phase trusts its hash cache; only a re-hash finds a cut-off file
        from orchestrator.engines import recipe_origin

        recipe = recipe_origin(spec.recipe).get("recipe_file", spec.recipe.name)
        reason += (f" (the GGUF file on {', '.join(broken)} is truncated or corrupt: `sparkctl "
                   f"launch {recipe} --verify-models` re-hashes it against the head's and "
                   "repairs it)")
    note(f"{reason}; stopping {spec.name}")
    left = ""
    try:
        stop_server(transports, spec.inventory, {"name": spec.name, "nodes": spec.nodes})
    except SparkctlError as exc:
        left = f" (could not stop it: {exc})"
    raise LaunchFailed(f"{reason}; {spec.name} stopped{left} (log tails below)",
                       "\n".join(f"--- {node}: docker logs {spec.container}\n{tail}"
                                 for node, tail in tails.items()))


def wait_until_ready(transports: dict[str, Transport], spec: ServeSpec, timeout: float,
                     note: Note) -> Ready:
    first = transports[spec.first]
    started = time.monotonic()
    deadline = started + timeout
    last = ""
    try:
        while True:
            result = first.run(poll_cmd(spec.container, spec.recipe.port, spec.host,
                                        spec.key_file), sudo=True, timeout=120,
                               display=f"{spec.container}: /health")
            state = parse_poll(result.stdout)
            elapsed = time.monotonic() - started
            if not state.get("running"):
                fail_and_clean(transports, spec, note, f"llama-server exited on {spec.first} "
                               f"while loading (after {elapsed:.0f}s)")
            dead = [n for n in spec.nodes[1:] if n in transports and "true" not in
                    transports[n].run(running_cmd(spec.container), sudo=True, timeout=60,
                                      display=f"{spec.container} running?").stdout]
            if dead:
                fail_and_clean(transports, spec, note, f"rpc-server exited on {', '.join(dead)} "
                               f"while {spec.first} loaded (after {elapsed:.0f}s)")
            models = [m for m in state.get("models") or [] if m]
            if state.get("health") == 200 and spec.recipe.model in models:
                note(f"[{elapsed:6.1f}s] ready: /health 200, {spec.recipe.model} listed")
                return Ready(elapsed, models)
            if time.monotonic() > deadline:
                fail_and_clean(transports, spec, note,
                               f"{spec.name} was not ready within {timeout:.0f}s (--timeout)")
            stage = f"loading (/health {state.get('health') or 'no answer'})"
            if stage != last:
                note(f"[{elapsed:6.1f}s] {spec.name} on {spec.first}: {stage}; deadline in "
                     f"{deadline - time.monotonic():.0f}s")
                last = stage
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        raise SparkctlError(
            f"stopped waiting; {spec.name} keeps loading on {spec.first}. Follow it with "
            f"`sparkctl logs --server {spec.name}`; stop it with `sparkctl down --server "
            f"{spec.name}`", EXIT_INTERRUPTED) from None
