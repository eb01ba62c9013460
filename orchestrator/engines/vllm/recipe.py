"""vLLM recipes: the model, the parallelism, the image, the Ray cluster and extra `vllm serve` flags.

Refused before anything runs (exit 2): a node count that is not tensor x pipeline parallel size
(one GPU per Spark), flags sparkctl sets itself, and any flag vLLM's own argument parser would
reject (checked against the option table extracted from the pinned vLLM source; the error names
the flag, the vLLM version and the nearest valid flag).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from orchestrator.engines.base import EnvVars, verdict_of
from orchestrator.recipe import SPARK_MEMORY_GB, BaseRecipe, MemoryEstimate, StrictModel

if TYPE_CHECKING:
    from orchestrator.recipe import ListenPort

DEFAULT_IMAGE = "nvcr.io/nvidia/vllm:26.10-py3"
"""NVIDIA's vLLM container, release 26.10: vLLM 0.31.0 (the version the option table was
extracted from, orchestrator/engines/vllm/options.json) on CUDA 13.4.3, with DGX Spark caches,
per NVIDIA's release notes (docs.nvidia.com/deeplearning/frameworks/vllm-release-notes/
rel-26-10.html). GB10 is sm_121 and needs CUDA 13; vLLM's own `vllm/vllm-openai:v0.31.0` is
CUDA 13 too (the default since v0.20.0) and works as a recipe `image:`."""
DEFAULT_CONTAINER = "sparkctl-vllm"
IMAGE_PATTERN = r"^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]+)?(@sha256:[0-9a-f]{64})?$"
# Flags sparkctl sets from typed fields; setting them again would be ambiguous.
RESERVED_FLAGS = {
    "--host": "launch --host", "--port": "port", "--tensor-parallel-size": "tensor_parallel_size",
    "-tp": "tensor_parallel_size", "--pipeline-parallel-size": "pipeline_parallel_size",
    "-pp": "pipeline_parallel_size", "--distributed-executor-backend": "executor",
    "--gpu-memory-utilization": "memory.kv_cache_fraction", "--revision": "revision",
    "--model": "model", "--nnodes": "the node count", "--node-rank": "(set per node)",
    "--master-addr": "(the head's fabric address)", "--master-port": "master_port",
    "--headless": "(set on the ranks > 0)",
}


class RayOptions(StrictModel):
    port: int = Field(default=6379, ge=1024, le=65535)
    """The Ray head's GCS port base, on the first node's fabric address: the server's own port is
    this plus its offset (engines/vllm/ports.py; 6379 for a server on API port 8000)."""
    object_store_gb: float = Field(default=2.0, ge=0.08, le=64)
    """Ray's object store per node (--object-store-memory). vLLM barely uses it; Ray's default
    (30% of memory) would take ~38 GB of a Spark's unified memory from the model."""
    num_cpus: int | None = Field(default=None, ge=1, le=1024)
    """--num-cpus for every Ray node (default: Ray counts them)."""
    join_timeout: float = Field(default=120.0, gt=0, le=3600)
    """Seconds to wait for every node to show in `ray status` before vllm serve starts."""


class Recipe(BaseRecipe):
    engine: Literal["vllm"] = "vllm"
    image: str = Field(default=DEFAULT_IMAGE, pattern=IMAGE_PATTERN)
    """The vLLM image every serving node runs (its Ray and vLLM)."""
    container_name: str = Field(default=DEFAULT_CONTAINER, pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$")
    """The prefix of the server's containers: `<container_name>-<server name>` on each of its
    nodes (Ray head or worker, or an mp rank; vllm serve runs in the first node's). Before
    servers were named it was the one container's name (`sparkctl-vllm`)."""
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    pipeline_parallel_size: int = Field(default=1, ge=1, le=64)
    serve_args: list[str] = Field(default_factory=list)
    """More `vllm serve` flags, verbatim (each item one argv word), checked against vLLM's table."""
    env: EnvVars = Field(default_factory=dict)
    """Extra environment of the containers (e.g. VLLM_* switches)."""
    ray: RayOptions = Field(default_factory=RayOptions)
    executor: Literal["auto", "ray", "mp"] = "auto"
    """How the nodes work together: `ray` (a Ray cluster, vllm serve on the head), `mp` (vLLM's own
    multi-node: --nnodes/--node-rank/--master-addr/--master-port, --headless on the ranks > 0, no
    Ray) or `auto`: Ray where the image is known to ship it, else mp (engines/vllm/images.py).
    Forcing `ray` on an image without Ray is refused."""
    omp_threads_bind: list[str] = Field(default_factory=list)
    """Per rank, in rank order, the cores that rank's OpenMP threads run on, as vLLM's CPU
    platform reads them (VLLM_CPU_OMP_THREADS_BIND in that rank's container: `0`, `0-3`, `auto`).
    Empty (the default, right for a Spark): unset. vLLM's CUDA platform never reads it, and its
    mp workers limit their own torch threads; it matters where vLLM runs on CPUs, as in the lab,
    whose nodes share the host's cores: each rank gets its own (docs/engines.md). A list shorter
    than the ranks repeats (rank R takes entry R modulo its length), so `advise` may try other
    parallelisms of the same recipe."""
    master_port: int = Field(default=29501, ge=1024, le=65535)
    """vLLM's --master-port base with the mp executor: rank 0 listens on the first node's fabric
    address at this plus the server's offset (engines/vllm/ports.py; 29501 on API port 8000)
    and the headless ranks connect to it."""

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def node_count(self) -> int:
        return self.nodes or self.world_size

    @property
    def backend(self) -> str:
        """The executor this launch uses: "ray" or "mp" (engines/vllm/images.py decides auto)."""
        from orchestrator.engines.vllm.images import executor_for

        return executor_for(self.executor, self.image)

    def listen_ports(self, nodes: list[str]) -> list[ListenPort]:
        from orchestrator.engines.vllm.ports import ServerPorts
        from orchestrator.recipe import ListenPort

        # on the first node, next to vllm serve: the Ray head's GCS (the dashboard agent on
        # every node), or (mp, several nodes) rank 0's --master-port; each the recipe's
        # base plus the server's offset (engines/vllm/ports.py). The other fixed Ray ports
        # (raylet, workers, ...) are in the record and judged against other servers, not
        # pre-checked here: a worker's raylet still exiting after its head restarted is not
        # told from a stranger's (in the lab) and would refuse the relaunch that replaces it
        ports = ServerPorts.of(self)
        fix = "launch with another --port (it moves every port of the server)"
        if self.backend == "ray":
            extra = [ListenPort(nodes[0], ports.ray, "Ray GCS", fix),
                     *(ListenPort(n, ports.ray_agent, "Ray dashboard agent", fix) for n in nodes)]
        elif self.node_count > 1:
            extra = [ListenPort(nodes[0], ports.master, "master-port", fix)]
        else:
            extra = []
        return [*super().listen_ports(nodes), *extra]

    @model_validator(mode="after")
    def _consistent(self) -> Recipe:
        if self.nodes is not None and self.nodes != self.world_size:
            raise ValueError(
                f"nodes is {self.nodes} but tensor_parallel_size x pipeline_parallel_size is "
                f"{self.world_size}: a Spark has one GPU, so vLLM needs one node per rank")
        from orchestrator.engines.optiontable import refuse_serve_args
        from orchestrator.engines.vllm.images import known, no_ray_message
        from orchestrator.engines.vllm.options import canonical, check_serve_args

        found = known(self.image)
        if self.executor == "ray" and found is not None and not found.ray:
            raise ValueError(no_ray_message(self.image, found.source))

        # an abbreviation (--tensor-parallel) is the flag itself to vLLM's argparse
        refuse_serve_args(self.serve_args, RESERVED_FLAGS, canonical, check_serve_args)
        return self


def estimate_memory(recipe: Recipe, node_memory_gb: float = SPARK_MEMORY_GB) -> MemoryEstimate:
    """Per node: vLLM takes --gpu-memory-utilization of the whole memory (weights, activations
    and the KV cache inside it); Ray's object store comes on top; the rest is the system's."""
    m = recipe.memory
    weights = m.weights_gb / recipe.world_size
    loaded = weights + m.runtime_gb
    vllm_gb = m.kv_cache_fraction * node_memory_gb
    kv = vllm_gb - loaded
    store = recipe.ray.object_store_gb if recipe.backend == "ray" else 0.0  # no Ray, no store
    free = node_memory_gb - vllm_gb - store
    fits, verdict = verdict_of(node_memory_gb - loaded - store, free, m.system_reserve_gb)
    if kv <= 0:
        fits, verdict = False, "does not fit"
    explanation = (
        f"per node {weights:.1f} GB weights + {m.runtime_gb:g} GB runtime inside vLLM's "
        f"{m.kv_cache_fraction:g} x {node_memory_gb:g} GB = {vllm_gb:.1f} GB "
        f"(--gpu-memory-utilization), leaving {kv:.1f} GB KV cache; + {store:g} GB Ray object "
        f"store; {free:.1f} GB left for the system (reserve {m.system_reserve_gb:g} GB): {verdict}"
    )
    if kv <= 0:
        explanation += " (the weights alone exceed --gpu-memory-utilization: raise it or add nodes)"
    return MemoryEstimate(
        weights_gb=round(weights, 2), draft_gb=0.0, runtime_gb=m.runtime_gb,
        system_reserve_gb=m.system_reserve_gb, kv_cache_gb=round(max(kv, 0.0), 2),
        total_gb=round(vllm_gb + store, 2), free_after_kv_gb=round(free, 2), fits=fits,
        verdict=verdict, explanation=explanation,
    )
