"""Server control from the controller, for every engine whose server runs as a process inside
a container (TensorRT-LLM's mpirun in the `up` container, vLLM's `vllm serve` in its Ray head):
the commands that run orchestrator/node/serverctl.py there, and one real chat completion.

Shared here (not in one engine's folder) so that engines never import each other.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from orchestrator.engines import DEFAULT_ENGINE, process_words, ready_lines
from orchestrator.errors import SparkctlError
from orchestrator.node import script
from orchestrator.paths import RUN_DIR
from orchestrator.remote.container import ContainerCommands, ContainerTransport

if TYPE_CHECKING:
    from orchestrator.phases.teardown import EngineParts
    from orchestrator.remote.transport import Transport

NODE_SCRIPT = script("serverctl.py")
"""Runs inside a container (python3, stdlib). Actions: status (pids, the record, HTTP probes),
stop (what the pid files name, with descendants), started (record the server once the detached
launcher wrote its pid), chat (one completion, for the smoke test)."""




SMOKE_TOKENS = 1
"""The smoke test's reply length: one real chat completion through the loaded model (template,
prompt processing through every layer, one token sampled) proves it generates; every further
token adds only decode time to every launch."""
SMOKE_PROMPT = "Hi"
"""The smoke test's prompt: the shortest message still goes through the chat template, and the
prefill of the first request after a start is what a CPU-bound server pays most for."""


def smoke_body(model: str) -> dict[str, Any]:
    """The smoke test's chat completion request."""
    return {"model": model, "max_tokens": SMOKE_TOKENS,
            "messages": [{"role": "user", "content": SMOKE_PROMPT}]}


def pid_wrapper(pid_file: str, log: str) -> str:
    """The `bash -c` body that starts a server process (its argv in "$@") with its pid in
    PID_FILE and its output in LOG: what serverctl's status and stop read. Both paths are shell
    words as given (a rank's may hold "$r")."""
    return f'echo $$ > {pid_file}; exec "$@" > {log} 2>&1'


def down_parts() -> EngineParts:
    """What `down` (phases/teardown.py) needs from the engines: their fixed server containers
    and how a server's recorded processes are stopped in a container."""
    from orchestrator.engines import server_containers
    from orchestrator.phases.teardown import EngineParts

    return EngineParts(sorted(server_containers("")), lambda container, ours, grace: node_cmd(
        container, action="stop", grace=grace, ours=ours))


def node_argv(**args: Any) -> list[str]:
    """`python3 -c <serverctl> JSON` (status also gets every engine's ready line: a server that
    logged it and answers no more is stalled, not loading). Without "ours", the engines'
    process words; "run" defaults to RUN_DIR (the older single record)."""
    if args.get("action") == "status":
        args["ready_lines"] = ready_lines()
        args["default_engine"] = DEFAULT_ENGINE
    if not args.get("ours"):
        args["ours"] = process_words()
    payload = json.dumps({"run": RUN_DIR, **args}, sort_keys=True)
    return ["python3", "-c", NODE_SCRIPT, payload]


def node_cmd(container: str, **args: Any) -> str:
    """`docker exec CONTAINER python3 -c <serverctl> JSON` (see node_argv)."""
    return ContainerCommands(container).exec_cmd(node_argv(**args))


def node_call(transport: Transport, container: str, timeout: float = 120, **args: Any) -> dict[str, Any]:
    inside = ContainerTransport(transport, container)
    result = inside.run(node_argv(**args), timeout=timeout,
                        display=inside.shown(f"python3 -c <sparkctl {args['action']}>"))
    result.check()
    return dict(json.loads(result.stdout))


def smoke_test(head: Transport, container: str, model: str, port: int,
               prompt: str = "Paris is great because", max_tokens: int = SMOKE_TOKENS,
               run: str | None = None) -> str:
    """One real chat completion on the serving node; returns a one-line summary. RUN: the
    server's own directory (its record says where it binds and its key), default RUN_DIR."""
    request = {"model": model, "messages": [{"role": "user", "content": prompt}],
               "max_tokens": max_tokens}
    where = {"run": run} if run else {}
    answer = node_call(head, container, timeout=180, action="chat", port=port, request=request,
                       **where)
    if answer.get("code") != 200:
        raise SparkctlError(f"{head.node}: the smoke-test chat completion failed: HTTP "
                            f"{answer.get('code')}: {str(answer.get('body'))[:300]}")
    body = json.loads(answer["body"])
    text = body["choices"][0]["message"]["content"] or ""
    tokens = (body.get("usage") or {}).get("completion_tokens", 0)
    rate = tokens / max(float(answer.get("seconds") or 0), 1e-3)
    return f"{tokens} tokens in {answer.get('seconds', 0):.2f}s ({rate:.1f} tok/s): {text.strip()[:80]!r}"
