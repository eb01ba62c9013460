"""Which vLLM images ship Ray, and so which multi-node executor a launch uses.

vLLM dropped Ray from its dependencies (0.19.1, ai-dynamo/dynamo#8515; gpustack#5430: the official
image has none from v0.18), and NVIDIA's current vLLM image has no `ray` CLI either
(NVIDIA/dgx-spark-playbooks#109): `ray start` in it exits 127 "ray: command not found". vLLM's own
multi-node needs no Ray: `--distributed-executor-backend mp --nnodes N --node-rank R --master-addr
HEAD --master-port P` on every node, `--headless` on all but rank 0.

The executor is chosen when the plan is made (no remote call): the recipe's `executor:` when it
forces one, else Ray for an image known to ship it (KNOWN, each with its source), else vLLM's own
multi-node. What an image really holds is then probed once per image ID (`command -v ray` in a
throw-away container) and recorded on the node beside the Open MPI record; a plan that needs Ray
on an image without it stops there, before any container or server changes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from orchestrator.commands import docker_cmd
from orchestrator.core.step import Change, NodeContext, Outcome, Step, Unchanged
from orchestrator.errors import EXIT_BAD_INPUT, SparkctlError
from orchestrator.phases import image_records
from orchestrator.remote.gathered import NodeFacts

FACT_KEY = "vllm_image_record"
RAY_IMAGE = "nvcr.io/nvidia/vllm:26.03-py3"  # a pullable image known to ship Ray (KNOWN)


@dataclass(frozen=True)
class KnownImage:
    vllm: str
    ray: bool
    source: str


KNOWN = {
    "nvcr.io/nvidia/vllm:26.10-py3": KnownImage(
        "0.31.0", False, "NVIDIA's vLLM release notes 26.10; no `ray` in NVIDIA's current image: "
        "NVIDIA/dgx-spark-playbooks#109, vllm-project/vllm#33445"),
    "vllm/vllm-openai:v0.31.0": KnownImage(
        "0.31.0", False, "vLLM's image ships no Ray from v0.18 on (gpustack/gpustack#5430); "
        "v0.27.1 exits 127 'ray: command not found' (ainode#84)"),
    "nvcr.io/nvidia/vllm:26.04-py3": KnownImage(
        "0.19.0", True, "NVIDIA/dgx-spark-playbooks#75 (2026-05-13): 'NGC vLLM image supports Ray'"),
    RAY_IMAGE: KnownImage(
        "0.17.1", True, "mark-ramsey-ri/vllm-dgx-spark#3: vLLM 0.17.1+nv26.03 serving with "
        "distributed_executor_backend ray on DGX Sparks"),
}


def known(image: str) -> KnownImage | None:
    return KNOWN.get(image)


def executor_for(executor: str, image: str) -> str:
    """"ray" or "mp": the recipe's forced choice, else Ray where the image is known to have it."""
    if executor in ("ray", "mp"):
        return executor
    found = known(image)
    return "ray" if found and found.ray else "mp"


def no_ray_message(image: str, why: str) -> str:
    return (f"executor: ray, but {image} ships no Ray ({why}): `ray start` would exit 127 "
            f"'ray: command not found' on every node. Use `executor: mp` (vLLM's own multi-node: "
            f"--nnodes/--node-rank/--headless, no Ray) or an image that has Ray (e.g. {RAY_IMAGE})")


# ---------------------------------------------------------------- the probe, once per image ID
def record_path(image: str) -> str:
    return image_records.record_path(image, "vllm")


def record_fact(image: str) -> dict[str, str]:
    """The facts `commands` entry that reads the record (empty output when there is none)."""
    return image_records.record_fact(FACT_KEY, record_path(image))


def recorded(facts: NodeFacts, image_id: str | None) -> dict[str, Any] | None:
    record = image_records.read_record(facts, FACT_KEY)
    if record is None or "ray" not in record:
        return None
    return record if image_id and record.get("image_id") == image_id else None


def detect_and_record_cmd(image: str, image_id: str) -> str:
    """`command -v ray` (and Ray's version) in a throw-away container, then the record."""
    probe = docker_cmd("run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c",
                       "command -v ray >/dev/null 2>&1 && { ray --version 2>/dev/null || "
                       "echo 'ray, version ?'; } || echo no-ray")
    return image_records.detect_and_record_cmd(probe, "ray", image, image_id, record_path(image))


def _image_id(ctx: NodeContext, image: str) -> str | None:
    return image_records.image_id_now(ctx, image)


class RayInImage(Step):
    """Whether the image ships Ray, probed once per image ID and recorded on the node; a plan
    that needs Ray on an image without it stops here, before any container changes (exit 2)."""

    name = "ray-in-image"

    def __init__(self, image: str, executor: str) -> None:
        self.image, self.executor = image, executor

    def _judge(self, ctx: NodeContext, record: dict[str, Any]) -> str:
        ray = record.get("ray")
        if self.executor == "ray" and not ray:
            raise SparkctlError(f"{ctx.node.name}: " + no_ray_message(
                self.image, "probed: no `ray` on its PATH") + _what_changed(ctx, self.image),
                EXIT_BAD_INPUT)
        found = f"Ray {ray}" if ray else "no Ray"
        return f"{found} in {self.image}: vLLM's {'Ray' if self.executor == 'ray' else 'own (mp)'} " \
               "multi-node"

    def check(self, ctx: NodeContext) -> Outcome:
        image_id = _image_id(ctx, self.image)
        record = recorded(ctx.facts, image_id)
        if record:
            return Unchanged(self._judge(ctx, record) + " (recorded)")
        if self.executor == "ray" and image_id:
            # Ray forced (or chosen) and the image on the node: look inside it now, in the plan,
            # so that an image without Ray is refused before anything else changes; the probe's
            # throw-away container (--rm, no network) and its record change nothing that runs
            return Unchanged(self._probe(ctx, image_id) + " (probed in the plan)")
        return Change(f"detect whether {self.image} ships Ray: docker run --rm {self.image} "
                      "command -v ray")

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        image_id = _image_id(ctx, self.image)
        if not image_id:
            raise SparkctlError(f"{ctx.node.name}: {self.image} has no image ID on the node "
                                "(pull failed?)")
        return self._probe(ctx, image_id)

    def _probe(self, ctx: NodeContext, image_id: str) -> str:
        result = ctx.run(detect_and_record_cmd(self.image, image_id), sudo=True, timeout=180,
                         display=f"docker run --rm {self.image} command -v ray")
        try:
            record = json.loads(result.stdout.strip().splitlines()[-1]) if result.ok else None
        except (ValueError, IndexError):
            record = None
        if not isinstance(record, dict):
            raise SparkctlError(f"{ctx.node.name}: probing {self.image} for Ray failed (exit "
                                f"{result.exit_status}):\n{result.stderr.strip()[-800:]}")
        return self._judge(ctx, record)


def _what_changed(ctx: NodeContext, image: str) -> str:
    """What a refusal leaves behind: the image pulled in this run (needed to look inside it),
    or nothing at all; never a container created or replaced. (Pulled by any phase of this
    run: launch's model-image phase pulls it first, for the models' commands.)"""
    if ctx.node.name in ctx.shared.image_facts:
        return (f". sparkctl pulled {image} on {ctx.node.name} to look inside it: that pull is "
                "the only change made; no container was created, stopped or replaced")
    return ". Nothing was changed"
