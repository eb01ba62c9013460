"""Readiness of an SGLang server, on its first node: SGLang's own signals, with progress and a
deadline. /health answers 503 while the server starts and 200 once it serves
(sglang/srt/entrypoints/http_server.py of 0.5.12, l.505-526), and the log says "The server is
fired up and ready to roll!" (l.2033). A rank's container that exits, or the deadline, stops the
server (its containers and record) and shows every node's log tail.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import TYPE_CHECKING, Any

from orchestrator.commands import docker_cmd, join, quote
from orchestrator.core.step import Change, NodeContext, Step
from orchestrator.engines.base import LaunchFailed, Note, Ready
from orchestrator.errors import EXIT_INTERRUPTED, SparkctlError

if TYPE_CHECKING:
    from orchestrator.engines.sglang.serve import ServeSpec
    from orchestrator.remote.transport import Transport

READY_LINE = "The server is fired up and ready to roll!"
POLL_SECONDS = 2.0
PROBE = r"""
import json, sys, urllib.error, urllib.request
port, host, key_file = int(sys.argv[1]), sys.argv[2], sys.argv[3]
headers = {"Content-Type": "application/json"}
if key_file:  # the server's API key, read here as root (never on a command line)
    with open(key_file) as f:
        headers["Authorization"] = "Bearer " + f.read().strip()
def get(path, body=None, timeout=5):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request("http://%s:%d%s" % (host, port, path), data=data,
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")[:20000]
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")[:2000]
    except Exception as e:
        return 0, str(e)[:300]
out = {}
if len(sys.argv) > 4:
    started = __import__("time").time()
    out["code"], out["body"] = get("/v1/chat/completions", json.loads(sys.argv[4]), 300)
    out["seconds"] = __import__("time").time() - started
else:
    out["health"] = get("/health")[0]
    if out["health"] == 200:
        code, body = get("/v1/models")
        out["models"] = [m.get("id") for m in json.loads(body).get("data", [])] if code == 200 else []
print(json.dumps(out))
"""


def running_cmd(container: str) -> str:
    return f"{docker_cmd('inspect', '-f', '{{.State.Running}}', container)} 2>/dev/null || echo gone"


def probe_cmd(port: int, host: str, key_file: str | None, body: dict[str, Any] | None = None) -> str:
    """PROBE on the serving node: HOST:PORT as the server binds it, with the server's key (its
    node file, read by the probe) when it has one."""
    from orchestrator.engines.apikey import probe_host

    words = [str(port), probe_host(host), key_file or ""]
    if body is not None:
        words.append(json.dumps(body))
    return f"python3 -c {quote(PROBE)} {join(words)}"


def poll_cmd(container: str, port: int, host: str = "127.0.0.1", key_file: str | None = None) -> str:
    fired = quote(READY_LINE.replace("!", "[!]"))
    return (f"echo \"running=$({running_cmd(container)})\"; "
            f"echo \"fired=$({docker_cmd('logs', container)} 2>&1 | grep -c {fired})\"; "
            + probe_cmd(port, host, key_file))


def parse_poll(out: str) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for line in out.splitlines():
        if line.startswith("running="):
            state["running"] = line.partition("=")[2].strip() == "true"
        elif line.startswith("fired="):
            state["fired"] = line.partition("=")[2].strip() not in ("", "0")
        elif line.startswith("{"):
            with contextlib.suppress(ValueError):
                state.update(json.loads(line))
    return state


def log_tail(transport: Transport | None, container: str, lines: int = 25) -> str:
    if transport is None:
        return "(node unreachable)"
    try:
        result = transport.run(f"{docker_cmd('logs', '--tail', lines, container)} 2>&1; true",
                               sudo=True, timeout=60, display=f"docker logs {container}")
        return result.stdout.strip() or "(empty)"
    except SparkctlError as exc:
        return f"(could not read its log: {exc})"


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


class Smoke(Step):
    """One real chat completion on the server's first node."""

    name = "smoke-test"
    kind = "verify"
    scope = "head"

    def __init__(self, spec: ServeSpec) -> None:
        self.spec = spec

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        body = {"model": self.spec.recipe.model, "max_tokens": 8,
                "messages": [{"role": "user", "content": "Say hello."}]}
        command = probe_cmd(self.spec.recipe.port, self.spec.host, self.spec.key_file, body)
        result = ctx.transports[self.spec.first].run(command, sudo=True, timeout=360,
                                                     display="one chat completion")
        answer = parse_poll(result.stdout)
        if answer.get("code") != 200:
            raise SparkctlError(f"{self.spec.first}: the chat completion failed (HTTP "
                                f"{answer.get('code')}): {str(answer.get('body'))[:300]}")
        usage = (json.loads(answer["body"]).get("usage") or {})
        return (f"chat completion on {self.spec.first}: {usage.get('completion_tokens', '?')} "
                f"tokens in {answer.get('seconds', 0):.2f}s")
