"""`sparkctl recipes import` for SGLang commands (sparkrun's `sglang` runtime).

`python3 -m sglang.launch_server ...` (or `sglang serve ...`) parsed with SGLang 0.5.12's option
table (aliases such as --tp-size, unique abbreviations such as --speculative-algo, as its argparse
accepts them). The flags sparkctl sets from typed fields (engines/sglang/recipe.py
RESERVED_FLAGS) become those fields; its multi-node flags (--nnodes, --node-rank,
--dist-init-addr) are dropped with a note: sparkctl sets them for each node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.engines.sglang import options

if TYPE_CHECKING:
    from orchestrator.engines.import_job import ImportJob
    from orchestrator.engines.optiontable import OptionTable

_SPECULATIVE = {"--speculative-algorithm": "algorithm", "--speculative-num-steps": "num_steps",
                "--speculative-eagle-topk": "eagle_topk",
                "--speculative-num-draft-tokens": "num_draft_tokens",
                "--speculative-draft-model-path": "draft_model"}


class SglangImporter:
    runtimes = frozenset({"sglang"})
    programs = (("python3", "-m", "sglang.launch_server"), ("sglang", "serve"))


    def table(self) -> OptionTable:
        result: OptionTable = options.table()
        return result

    def convert(self, job: ImportJob) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        model = job.value("--model-path")
        if model and model != job.foreign.model:
            fields["model"] = model
        fields["image"] = job.image()
        fields.update(job.wholes({"--tensor-parallel-size": "tp_size",
                                  "--pipeline-parallel-size": "pp_size"}))
        if job.switch("--trust-remote-code"):
            fields["trust_remote_code"] = True
        speculative: dict[str, Any] = {}
        for flag, key in _SPECULATIVE.items():
            value = job.value(flag) if key in ("algorithm", "draft_model") else job.whole(flag)
            if value is not None:
                speculative[key] = value
        if speculative:
            fields["speculative"] = speculative
        fields.update(job.where_served())
        for flag in ("--nnodes", "--node-rank", "--dist-init-addr"):
            job.drop(flag, "sparkctl sets SGLang's multi-node flags for each node")
        fields["memory"] = job.memory(job.fraction("--mem-fraction-static"))
        fields["serve_args"] = job.rest()
        return fields

