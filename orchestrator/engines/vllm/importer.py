"""`sparkctl recipes import` for vLLM commands: sparkrun's vLLM runtimes and eugr's recipes.

`vllm serve MODEL ...` parsed with vLLM 0.31.0's option table (aliases such as -tp, `--no-`
forms, underscores, unique abbreviations, as vLLM's FlexibleArgumentParser accepts them). The
flags sparkctl sets from typed fields (engines/vllm/recipe.py RESERVED_FLAGS) become those
fields; vLLM's own multi-node flags (--nnodes, --node-rank, --master-addr, --headless) are
dropped with a note: sparkctl sets them for each node. Everything else is `serve_args`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.engines.vllm import options

if TYPE_CHECKING:
    from orchestrator.engines.import_job import ImportJob
    from orchestrator.engines.optiontable import OptionTable


class VllmImporter:
    # sparkrun resolves `vllm` to vllm-distributed or vllm-ray; eugr-vllm is its eugr runtime
    runtimes = frozenset({"vllm", "vllm-distributed", "vllm-ray", "eugr-vllm"})
    programs = (("vllm", "serve"), ("python3", "-m", "vllm.entrypoints.openai.api_server"))


    def table(self) -> OptionTable:
        result: OptionTable = options.table()
        return result

    def convert(self, job: ImportJob) -> dict[str, Any]:
        from orchestrator.engines.vllm.images import known

        fields: dict[str, Any] = {}
        model = job.value("--model") or next(iter(job.positionals()), None)
        if model and model != job.foreign.model:
            if job.foreign.model:
                job.note(f"model: the command serves {model} (the recipe's `model` says "
                         f"{job.foreign.model}): the command's is kept")
            fields["model"] = model
        fields["image"] = job.image()
        fields.update(job.wholes({"--tensor-parallel-size": "tensor_parallel_size",
                                  "--pipeline-parallel-size": "pipeline_parallel_size"}))
        backend = job.value("--distributed-executor-backend")
        ray_image = known(fields["image"])
        if backend in ("ray", "mp"):
            if backend == "ray" and ray_image is not None and not ray_image.ray:
                job.note(f"--distributed-executor-backend ray: {fields['image']} ships no Ray, "
                         "so the server uses vLLM's own multi-node (executor auto -> mp)")
            else:
                fields["executor"] = backend
        elif backend is not None:
            job.note(f"--distributed-executor-backend {backend}: sparkctl picks ray or mp "
                     "(executor: auto)")
        fields.update(job.where_served())
        for flag in ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless"):
            job.drop(flag, "sparkctl sets vLLM's multi-node flags for each node")
        fields["memory"] = job.memory(job.fraction("--gpu-memory-utilization"))
        fields["serve_args"] = job.rest()
        return fields

