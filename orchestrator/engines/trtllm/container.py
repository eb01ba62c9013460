"""TensorRT-LLM's container on every node (up): its own sshd (MPI's way in), the fabric's
NCCL/UCX settings and the launcher's MPI names for the image's Open MPI (4: ORTE, 5: PRRTE,
detected once per image ID), started and kept current by the shared container steps.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from orchestrator.commands import quote
from orchestrator.core.step import Change, NodeContext, Outcome, Phase, Step, Unchanged
from orchestrator.engines.trtllm.mpi_env import (
    detect_and_record_cmd,
    guess_major_from_tag,
    mpi_environment,
    record_fact,
    recorded,
)
from orchestrator.errors import SparkctlError
from orchestrator.inventory import Inventory, Node
from orchestrator.paths import CONFIG_DIR, RUN_DIR
from orchestrator.phases import image_records
from orchestrator.phases.container import (
    INFINIBAND,
    RESTART_POLICY,
    Container,
    ContainerSpec,
    managed_labels,
    node_hf_cache,
    roce_devices,
    run_container_cmd,
    spec_facts,
)
from orchestrator.phases.container import fabric_env as nccl_env
from orchestrator.phases.image_share import image_steps
from orchestrator.phases.registry import with_probe
from orchestrator.phases.ssh_keys import (
    HOST_PUB,
    entrypoint_content,
    fabric_addresses,
    sshd_config_content,
)
from orchestrator.recipe import CONTAINER_HF_HOME
from orchestrator.remote.node_facts import has_infiniband
from orchestrator.render import sha256


def facts(inventory: Inventory, node: Node) -> dict[str, Any]:
    request = spec_facts([inventory.container.image], [inventory.container.name],
                         inventory.cluster.user)
    request["commands"].update(record_fact(inventory.container.image))
    return with_probe(request, inventory.container.image)


def fabric_env(inventory: Inventory, roce_devices: list[str], mpi_major: int = 4) -> dict[str, str]:
    """NCCL/UCX from the inventory, the launcher's MPI names for the image's Open MPI."""
    return {
        **nccl_env(inventory, roce_devices),
        **mpi_environment(mpi_major, list(inventory.fabric.interfaces), inventory.topology),
        "CPATH": "/usr/local/cuda/include",
        "TRITON_PTXAS_PATH": "/usr/local/cuda/bin/ptxas",
    }


def trtllm_spec(inventory: Inventory, node: Node, roce: list[str], hf_cache: str,
                infiniband: bool, mpi_major: int = 4) -> ContainerSpec:
    """The TensorRT-LLM container `up` runs on every node: its own sshd (MPI's way in)."""
    container = inventory.container
    flags = ["--ipc", "host", "--gpus", "all", "--ulimit", "memlock=-1",
             "--ulimit", "stack=67108864"]
    if infiniband:
        flags += ["--device", f"{INFINIBAND}:{INFINIBAND}"]
    port = container.ssh_port
    address = fabric_addresses(inventory, node)[0]
    return ContainerSpec(
        name=container.name, image=container.image,
        command=["bash", f"{CONFIG_DIR}/entrypoint.sh"],
        env=fabric_env(inventory, roce, mpi_major),
        mounts=[(CONFIG_DIR, CONFIG_DIR, True), (RUN_DIR, RUN_DIR, False),
                (hf_cache, CONTAINER_HF_HOME, False)],
        labels=managed_labels(inventory, node), flags=flags,
        # the cluster's sshd (MPI's way in) comes back with the node, as its netplan does; a
        # persistent server's boot unit (phases/persist.py) then starts mpirun in it
        restart=RESTART_POLICY,
        hashed={"entrypoint": sha256(entrypoint_content()),
                "sshd_config": sha256(sshd_config_content(inventory, node))},
        # our sshd presenting OUR pinned host key on the first fabric address (another process
        # holding the port would not)
        ready_prelude=f"key=$(cut -d' ' -f2 {quote(HOST_PUB)}); ",
        ready=(f"ssh-keyscan -T 2 -t ed25519 -p {port} {quote(address)} 2>/dev/null "
               '| grep -qF "$key"'),
        ready_what=f"sshd in {container.name} did not answer on {address}:{port} with the "
                   "pinned host key",
        hint=(f"Hint: a container that exits at once usually means its entrypoint failed or "
              f"port {port} is taken on the node."),
        dirs=[RUN_DIR],
    )


def run_args(inventory: Inventory, node: Node, roce: list[str], hf_cache: str,
             infiniband: bool, mpi_major: int = 4) -> list[str]:
    """The TensorRT-LLM container's `docker run` arguments without the config-hash label."""
    return trtllm_spec(inventory, node, roce, hf_cache, infiniband, mpi_major).run_args()


def config_hash(args: list[str], entrypoint: str, sshd_config: str) -> str:
    """Everything the running container depends on: its argv and the files read at start."""
    canonical = json.dumps({"argv": args, "entrypoint": sha256(entrypoint),
                            "sshd_config": sha256(sshd_config)}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def replace_container_cmd(inventory: Inventory, node: Node, args: list[str], user: str,
                          hf_cache: str, remove_old: bool) -> str:
    """The TensorRT-LLM container's start command (waits for our sshd's pinned host key)."""
    spec = trtllm_spec(inventory, node, [], hf_cache, False)
    return run_container_cmd(spec, args, user, hf_cache, remove_old)


MPI_KEY = "mpi"  # ctx.shared.engine: node -> {"version": "5.0.11", "major": 5, ...}


def _image_id(ctx: NodeContext) -> str | None:
    return image_records.image_id_now(ctx, ctx.inventory.container.image)


class MpiVersion(Step):
    """Which Open MPI the image ships (4: ORTE names, 5: PRRTE names), detected once per image
    ID with `mpirun --version` in a throw-away container and recorded on the node."""

    name = "mpi-version"

    def check(self, ctx: NodeContext) -> Outcome:
        image_id = _image_id(ctx)
        record = recorded(ctx.facts, image_id) if image_id else None
        if record:
            ctx.shared.engine.setdefault(MPI_KEY, {})[ctx.node.name] = record
            return Unchanged(f"Open MPI {record['version']} in the image (recorded)")
        return Change(f"detect the image's MPI: docker run --rm {ctx.inventory.container.image} "
                      "mpirun --version")

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        image = ctx.inventory.container.image
        image_id = _image_id(ctx)
        if not image_id:
            raise SparkctlError(f"{ctx.node.name}: container/mpi-version: {image} has no image "
                                "ID on the node (pull failed?)")
        result = ctx.run(detect_and_record_cmd(image, image_id), sudo=True, timeout=180,
                         display=f"docker run --rm {image} mpirun --version")
        try:
            record = json.loads(result.stdout.strip().splitlines()[-1]) if result.ok else None
        except (ValueError, IndexError):
            record = None
        if not record:
            raise SparkctlError(
                f"{ctx.node.name}: container/mpi-version: `mpirun --version` in {image} failed "
                f"(exit {result.exit_status}):\n{result.stderr.strip()[-800:]}\n"
                "Hint: sparkctl launches TensorRT-LLM with Open MPI's mpirun; the image must "
                "have it on its PATH.")
        ctx.shared.engine.setdefault(MPI_KEY, {})[ctx.node.name] = record
        return f"Open MPI {record['version']} (recorded in the node's /var/lib/sparkctl/images)"


def mpi_major(ctx: NodeContext) -> int:
    """The image's Open MPI major version: detected, else (preview only) from the tag."""
    record = (ctx.shared.engine.get(MPI_KEY) or {}).get(ctx.node.name)
    if record:
        return int(record["major"])
    return guess_major_from_tag(ctx.inventory.container.image)


def node_trtllm_spec(ctx: NodeContext) -> ContainerSpec:
    infiniband = has_infiniband(ctx.facts)
    return trtllm_spec(ctx.inventory, ctx.node, roce_devices(ctx.inventory, ctx.facts, ctx.node.name),
                       node_hf_cache(ctx), infiniband, mpi_major(ctx))


def phase(inventory: Inventory) -> Phase:
    return Phase("container", [*image_steps(lambda ctx: ctx.inventory.container.image),
                               MpiVersion(), Container(node_trtllm_spec)],
                 facts)
