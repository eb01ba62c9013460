"""Readiness of a llama.cpp server, as data (engines/readiness.py waits): llama-server answers
/health 503 ("Loading model") while it loads and 200 once it serves (tools/server/server-http.cpp), logs
"model loaded" (tools/server/server.cpp), and lists the model under its --alias at /v1/models.
A llama-server that exits (a corrupt GGUF, a port taken, an rpc-server gone) or an rpc-server
container that ends, or the deadline, stops the server (every node's container and the record)
and says why with llama.cpp's own error lines (`E ...`: they name the file, the port).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NoReturn

from orchestrator.engines.placed import log_tail
from orchestrator.engines.readiness import Readiness, stop_and_fail

if TYPE_CHECKING:
    from orchestrator.engines.llamacpp.serve import ServeSpec
    from orchestrator.engines.readiness import Target
    from orchestrator.recipe import Note
    from orchestrator.remote.transport import Transport

READINESS = Readiness("llama_server: model loaded", poll_seconds=1.0, dead_ranks="containers")
ERROR_LINE = re.compile(r"^(?:\S+\s+)?\d+\.\d+\.\d+\.\d+ E (.*)$|^(?:\S+\s+)?(error: .*)$")


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


def target(spec: ServeSpec) -> Target:
    return spec.target("llama-server", "rpc-server", lambda transports, note, reason: fail_and_clean(
        transports, spec, note, reason))


BROKEN_GGUF = ("model is corrupted or incomplete", "corrupted model:", "failed to read magic",
               "failed to read header", "failed to read tensor info", "failed to read tensor data",
               "failed to read key-value pairs")
"""What llama.cpp logs for a GGUF file cut short or damaged, at the pinned version
(src/llama-model-loader.h: a tensor's data beyond the file's end; ggml/src/gguf.cpp's
gguf_init_from_reader: a part of the file it cannot read)."""


def fail_and_clean(transports: dict[str, Transport], spec: ServeSpec, note: Note,
                   reason: str) -> NoReturn:
    tails = {node: log_tail(transports.get(node), spec.container, 40) for node in spec.nodes}
    said = errors(tails.get(spec.first, ""))
    reason += (": " + "; ".join(said)) if said else ""
    broken = [node for node, tail in tails.items() if any(w in tail for w in BROKEN_GGUF)]
    if broken:  # the models phase trusts its hash cache; only a re-hash finds a cut-off file
        from orchestrator.engines import recipe_origin

        recipe = recipe_origin(spec.recipe).get("recipe_file", spec.recipe.name)
        reason += (f" (the GGUF file on {', '.join(broken)} is truncated or corrupt: `sparkctl "
                   f"launch {recipe} --verify-models` re-hashes it against the head's and "
                   "repairs it)")
    stop_and_fail(transports, spec.inventory, spec.name, spec.nodes, note, reason,
                  "\n".join(f"--- {node}: docker logs {spec.container}\n{tail}"
                            for node, tail in tails.items()))
