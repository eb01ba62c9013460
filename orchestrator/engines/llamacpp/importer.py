"""`sparkctl recipes import` for llama-server commands (sparkrun's `llama-cpp` runtime).

`llama-server ...` parsed with the pinned llama.cpp build's option table (its aliases: -hf, -ngl, -c, -np).
sparkrun names a GGUF as `repo:QUANT` (`-hf {model}`); a sparkctl recipe names the file in the
repo, so the import derives it from llama.cpp's usual naming (`<repo without -GGUF>-<QUANT>.gguf`)
and says so: check it against the repo's file list. A local `-m` path or draft file cannot be
fetched by sparkctl and is refused; sparkrun's multi-node layer split (RPC) is `nodes`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from orchestrator.engines.llamacpp import options

if TYPE_CHECKING:
    from orchestrator.engines.import_job import ImportJob
    from orchestrator.engines.optiontable import OptionTable

ALL_LAYERS = 999  # the recipe's default: more layers than any model has


class LlamacppImporter:
    runtimes = frozenset({"llama-cpp"})
    programs = (("llama-server",),)

    def table(self) -> OptionTable:
        result: OptionTable = options.table()
        return result

    def convert(self, job: ImportJob) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        local = job.value("--model")
        if local is not None:
            job.refuse(f"command: -m {local}: a file on the node; sparkctl fetches GGUF files "
                       "from Hugging Face (use -hf REPO:QUANT or --hf-repo/--hf-file)")
        for flag in ("--spec-draft-model", "--model-url"):
            if job.value(flag) is not None:
                job.refuse(f"command: {flag}: a file or URL sparkctl cannot fetch (a draft "
                           "model is `draft: {model, gguf}` in a sparkctl recipe)")
        repo = job.value("--hf-repo") or job.foreign.model
        repo, _, quant = repo.partition(":")
        fields["model"] = repo
        gguf = job.value("--hf-file")
        if gguf is None:
            gguf = _gguf_name(repo, quant)
            job.note(f"gguf {gguf}: derived from {repo}:{quant or '(no quant)'} (llama.cpp's "
                     "usual file naming); check it against the repository's files")
        fields["gguf"] = gguf
        fields["image"] = job.image()
        layers = job.value("--gpu-layers")
        if layers is not None:
            fields["gpu_layers"] = _layers(job, layers)
        fields.update(job.wholes({"--ctx-size": "ctx_size", "--parallel": "parallel"}))
        fields.update(job.where_served(revision=None))
        job.drop("--alias", "clients name the model by its Hugging Face id")
        job.drop("--rpc", "sparkctl starts rpc-server on the other nodes and names them")
        job.drop("--metrics", "always on")
        job.drop("--api-key", "a key on a command line is visible to every process: "
                              "`launch --api-key-file`")
        if job.foreign.min_nodes > 1:
            fields["nodes"] = job.foreign.min_nodes
        fields["memory"] = job.memory(None)
        fields["serve_args"] = job.rest()
        return fields


def _gguf_name(repo: str, quant: str) -> str:
    stem = re.sub(r"[-_]GGUF$", "", repo.split("/")[-1], flags=re.IGNORECASE)
    return f"{stem}-{quant}.gguf" if quant else f"{stem}.gguf"


def _layers(job: ImportJob, raw: str) -> int:
    if raw in ("all", "auto"):
        job.note(f"-ngl {raw}: gpu_layers {ALL_LAYERS} (every layer on the GPUs)")
        return ALL_LAYERS
    try:
        return int(raw)
    except ValueError:
        job.refuse(f"command: -ngl {raw!r} is not a number of layers, 'all' or 'auto'")
