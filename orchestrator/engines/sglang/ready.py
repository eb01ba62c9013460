"""Readiness of an SGLang server, on its first node: SGLang's own signals, with progress and a
deadline. /health answers 503 while the server starts and 200 once it serves
(sglang/srt/entrypoints/http_server.py of 0.5.12, l.505-526), and the log says "The server is
fired up and ready to roll!" (l.2033). A rank's container that exits, or the deadline, stops the
server (its containers and record) and shows every node's log tail.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from orchestrator.commands import docker_cmd, quote
from orchestrator.engines.base import LaunchFailed, Note, Ready
from orchestrator.engines.placed import log_tail, parse_poll, probe_cmd, running_cmd
from orchestrator.errors import EXIT_INTERRUPTED, SparkctlError

if TYPE_CHECKING:
    from orchestrator.engines.sglang.serve import ServeSpec
    from orchestrator.remote.transport import Transport

READY_LINE = "The server is fired up and ready to roll!"
POLL_SECONDS = 2.0
def poll_cmd(container: str, port: int, host: str = "127.0.0.1", key_file: str | None = None) -> str:
    fired = quote(READY_LINE.replace("!", "[!]"))
    return (f"echo \"running=$({running_cmd(container)})\"; "
            f"echo \"fired=$({docker_cmd('logs', container)} 2>&1 | grep -c {fired})\"; "
            + probe_cmd(port, host, key_file))


def fail_and_clean(transports: dict[str, Transport], spec: ServeSpec, note: Note, reason: str) -> None:
    from orchestrator.engines.servers import stop_server

    parts = [f"--- {node}: docker logs {spec.container}\n{log_tail(transports.get(node), spec.container)}"
             for node in spec.nodes]
    note(f"{reason}; stopping {spec.name}")
    left = ""
    try:
        stop_server(transports, spec.inventory, {"name": spec.name, "nodes": spec.nodes})
    except SparkctlError as exc:
        left = f" (could not stop it: {exc})"
    raise LaunchFailed(f"{reason}; {spec.name} stopped{left} (log tails below)", "\n".join(parts))


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
                               display=f"{spec.container}: /health, its log")
            state = parse_poll(result.stdout)
            elapsed = time.monotonic() - started
            dead = [n for n in spec.nodes[1:] if n in transports and "true" not in
                    transports[n].run(running_cmd(spec.container), sudo=True, timeout=60,
                                      display=f"{spec.container} running?").stdout]
            if not state.get("running") or dead:
                where = ", ".join(dead) if dead else spec.first
                fail_and_clean(transports, spec, note, f"SGLang exited on {where} while loading "
                               f"(after {elapsed:.0f}s)")
            models = [m for m in state.get("models") or [] if m]
            if state.get("health") == 200 and state.get("fired") and spec.recipe.model in models:
                note(f"[{elapsed:6.1f}s] ready: /health 200 and \"{READY_LINE}\"")
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
