"""vLLM servers, named and placed: each server has its own containers `sparkctl-vllm-<name>` on
its own nodes (the first of --nodes or the recipe's `placement`, else the head, is its Ray head or
mp master), its own ports (engines/vllm/ports.py) and its own record (RUN_DIR/servers/<name>/
server.json on its first node), so several run at once. Where the image ships Ray (or the recipe
says `executor: ray`) the containers run a Ray node (the first node's bound to its fabric address,
the others joining it over the fabric) and vLLM uses `--distributed-executor-backend ray`; else
vLLM's own multi-node (`mp`: --nnodes/--node-rank/--master-addr/--master-port, the other nodes'
containers run their `--headless` rank). engines/vllm/images.py decides, multinode.py builds the
phase, check.py judges the server against the others (and takes over a server launched by the
single-server version), serve.py starts `vllm serve`, ready.py waits for it.

`up` adds nothing; `launch` fetches the models (shared phase), starts the server's containers
(the memory guard first on each), waits until Ray reports every node, then starts vLLM;
readiness is /health, /v1/models and one real chat completion.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """ENGINE, built on first use: importing this package (e.g. for its settings or recipes,
    engines/__init__.py) builds nothing, so a command imports only the engines it uses."""
    if name == "ENGINE":
        from orchestrator.engines.vllm.engine import ENGINE

        return ENGINE
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
