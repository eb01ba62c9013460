"""The nodes of one vLLM server working together: its own Ray cluster, or vLLM's own multi-node
(mp), in the server's containers `sparkctl-vllm-<server>` on its nodes. Its first node (the first
of --nodes or `placement`, else the head) is the Ray head or the mp master.

Ray (images that ship it): per node of the server a container running a Ray node
(engines/vllm/ray.py), `vllm serve --distributed-executor-backend ray` on the first node. vLLM
copies every NCCL_*/UCX_* variable of the driver onto its Ray workers (ray_env.py), so a worker's
own NCCL_IB_HCA is replaced by the first node's: nodes whose RoCE device names differ from the
first node's are refused first.

mp (images without Ray, or `executor: mp`): the first node's container idles until the serve
phase starts rank 0 in it (`vllm serve ... --node-rank 0`, the API server); every other node's
container runs its headless rank (`--headless --node-rank R`), which connects to the first
node's --master-addr:--master-port over the fabric. A headless rank ends when rank 0 does, so its
container starts it again: it rejoins whenever rank 0 is restarted. No raylet runs anywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.core.step import NodeContext, Outcome, Step, Unchanged
from orchestrator.engines.vllm import images, ray
from orchestrator.engines.vllm.guard import GuardRayPorts, guard_facts
from orchestrator.errors import EXIT_BAD_INPUT, SparkctlError
from orchestrator.inventory import Inventory, Node
from orchestrator.paths import RUN_DIR
from orchestrator.phases import container as containers
from orchestrator.phases.container import INFINIBAND, ContainerSpec
from orchestrator.recipe import CONTAINER_HF_HOME
from orchestrator.remote.gathered import NodeFacts
from orchestrator.remote.node_facts import has_infiniband

if TYPE_CHECKING:
    from orchestrator.core.step import Phase
    from orchestrator.engines.vllm.serve import ServeSpec

# A headless rank exits with rank 0; started again, it waits for the next rank 0 (`down` removes
# the container, which ends the loop). A rank that ends while rank 0 still listens on its master
# port died on its own (killed, out of memory): rank 0 cannot serve without it, yet the real vLLM
# keeps answering /health 200 until the next request. Then the loop ends, and the container with
# it, so status sees the server dead on this node at once (engines/servers.py attach_members).
REJOIN = ('master=$1 port=$2; shift 2; while :; do "$@"; rc=$?; '
          'if timeout 3 bash -c \': < /dev/tcp/$0/$1\' "$master" "$port" 2>/dev/null; then '
          'echo "sparkctl: headless rank ended ($rc) while rank 0 runs ($master:$port): the '
          'server lost this rank" >&2; exit "$rc"; fi; '
          'echo "sparkctl: headless rank ended ($rc); rejoining in 2 s" >&2; sleep 2; done')


def head_address_for(inventory: Inventory, node: Node, first: str | None = None) -> str:
    """The first node's (default: the head's) fabric address on the link it shares with `node`:
    the --master-addr that node's rank connects to (torch's store listens on every address of
    rank 0's node). On a cable or a switch that is its first address; in a ring each neighbour
    has its own link."""
    import ipaddress

    head = inventory.node(first) if first else inventory.head
    if node.name == head.name:
        return ray.node_ip(inventory, head)
    mine = ipaddress.IPv4Address(ray.node_ip(inventory, node))
    for name in inventory.fabric.interfaces:
        cidr = (head.addresses or {}).get(name)
        if cidr and mine in ipaddress.IPv4Interface(cidr).network:
            return inventory.fabric_address(head, name)
    return ray.node_ip(inventory, head)


def mp_spec(spec: ServeSpec, node: Node, roce: list[str], hf_cache: str, infiniband: bool,
            restart: str | None = None) -> ContainerSpec:
    """A node's container for vLLM's own multi-node: the first node's idles (rank 0 is started
    in it by the serve phase), the others run their headless rank."""
    from orchestrator.engines.vllm.serve import serve_argv

    recipe, inventory = spec.recipe, spec.inventory
    head = spec.is_first(node)
    rank = spec.nodes.index(node.name)
    head_ip = head_address_for(inventory, node, spec.first)
    flags = ["--ipc", "host", "--gpus", "all", "--ulimit", "memlock=-1",
             "--ulimit", "stack=67108864"]
    if infiniband:
        flags += ["--device", f"{INFINIBAND}:{INFINIBAND}"]
    command = ["sleep", "infinity"] if head else [
        "bash", "-c", REJOIN, "sparkctl-rank", head_ip, str(spec.ports.master),
        *serve_argv(recipe, "", rank, head_ip, spec.ports.master)]
    env = ray.engine_env(inventory, node, roce, recipe)
    if recipe.omp_threads_bind:  # each rank's own cores (vLLM on CPUs reads it; CUDA does not)
        binds = recipe.omp_threads_bind
        env["VLLM_CPU_OMP_THREADS_BIND"] = binds[rank % len(binds)]
    if not head:
        env["HF_HUB_OFFLINE"] = "1"  # the models are on every node already (models phase)
    return ContainerSpec(
        name=spec.container, image=recipe.image, command=command, env=env,
        mounts=[(RUN_DIR, RUN_DIR, False), (hf_cache, CONTAINER_HF_HOME, False)],
        labels=containers.managed_labels(inventory, node, engine="vllm", server=spec.name,
                                         recipe=recipe.name, rank=str(rank),
                                         role="vllm-head" if head else "vllm-headless"),
        flags=flags, restart=restart, dirs=[RUN_DIR],
        hint=(f"Hint: rank {rank} reaches rank 0 at {head_ip}:{spec.ports.master} over the "
              "fabric; `sparkctl netcheck` tests the links."),
    )


def mp_spec_for(spec: ServeSpec, restart: str | None = None) -> containers.SpecFor:
    def pick(ctx: NodeContext) -> ContainerSpec | None:
        if ctx.node.name not in spec.nodes:
            return None
        ray.check_fabric_link(ctx, spec.first)
        infiniband = has_infiniband(ctx.facts)
        roce = containers.roce_devices(ctx.inventory, ctx.facts, ctx.node.name)
        return mp_spec(spec, ctx.node, roce, containers.node_hf_cache(ctx), infiniband, restart)
    return pick


class SameNcclDevices(Step):
    """Before a Ray launch: every node's RoCE devices named as the first node's (the Ray head's).
    vLLM hands the driver's NCCL_IB_HCA to every Ray worker, so a worker whose devices are named
    otherwise would open devices it does not have."""

    name = "nccl-devices"

    def __init__(self, spec: ServeSpec) -> None:
        self.spec = spec

    def check(self, ctx: NodeContext) -> Outcome:
        inv = ctx.inventory
        if not self.spec.is_first(ctx.node):
            return Unchanged(f"compared on {self.spec.first}, the Ray head")
        head = containers.roce_devices(inv, ctx.facts, ctx.node.name)
        for name in self.spec.nodes:
            theirs = containers.roce_devices(inv, ctx.cluster_facts.get(name) or NodeFacts(name), name)
            if theirs != head:
                raise SparkctlError(
                    f"{name}: its RoCE devices ({','.join(theirs)}) are not named as the Ray head's "
                    f"({','.join(head)}, {self.spec.first}): vLLM copies the head's NCCL_* "
                    f"settings onto every Ray worker, so NCCL on {name} would look for "
                    f"{','.join(head)}. Use `executor: mp` in the recipe (each rank keeps its own "
                    "NCCL_IB_HCA), or serve from nodes whose devices are named alike", EXIT_BAD_INPUT)
        return Unchanged(f"every node's RoCE devices are {','.join(head)}, as the Ray head's "
                         "(vLLM copies the head's NCCL_IB_HCA onto its Ray workers)")


def phase(spec: ServeSpec, restart: str | None = None, guard: Step | None = None) -> Phase:
    """The image on every node of the server and what it holds (Ray or not, recorded per image
    ID), then the nodes: its Ray cluster (each node's Ray port guard first: engines/vllm/
    guard.py), or vLLM's own multi-node containers; `guard` (the memory guard) first, before
    anything loads."""
    from orchestrator.engines.vllm.serve import servers_facts
    from orchestrator.phases.image_share import image_steps
    from orchestrator.phases.models import ServingPhase
    from orchestrator.remote.facts import merge_requests

    recipe, backend = spec.recipe, spec.backend

    def facts(inv: Inventory, node: Node) -> dict[str, Any]:
        own = image_facts(recipe, inv, spec.container)
        if backend == "ray":  # the port guard as the node has it
            own = merge_requests([own, guard_facts(spec, inv, node)])
        if node.name != spec.first:
            return own
        # the servers (is this one running already?) and, with Ray, the nodes its head knows
        own = merge_requests([own, servers_facts(inv, node)])
        if backend != "ray":
            return own
        probe = {"commands": {"ray": ray.probe_cmd(spec.container) + " 2>/dev/null"}}
        return merge_requests([own, probe])

    # a node that cannot pull gets the image from one that has it, over the fabric
    steps: list[Step] = [*([guard] if guard else []),
                         *image_steps(lambda ctx: recipe.image, lambda ctx: spec.nodes),
                         images.RayInImage(recipe.image, backend)]
    if backend == "ray":
        # the guard before any Ray node starts: its ports are never open beyond the fabric
        steps += [SameNcclDevices(spec), GuardRayPorts(spec), ray.RayHead(spec, restart),
                  ray.RayWorker(spec, restart),
                  ray.RayCluster(spec)]
        name = "ray"
    else:
        steps += [containers.Container(mp_spec_for(spec, restart), name="vllm-node")]
        name = "nodes"
    return ServingPhase(name, steps, facts, serving=spec.nodes)


def image_facts(recipe: Any, inventory: Inventory, container: str) -> dict[str, Any]:
    """The image (present? its ID; can the node pull it?), the container, the fabric links and
    the image's Ray record."""
    from orchestrator.phases.registry import with_probe
    from orchestrator.remote.facts import merge_requests

    own = with_probe({**containers.spec_facts([recipe.image], [container],
                                              inventory.cluster.user), "links": True}, recipe.image)
    return merge_requests([own, {"commands": images.record_fact(recipe.image)}])


def ray_probe_phase(spec: ServeSpec) -> Phase | None:
    """Ray on an image sparkctl does not know: look inside it before anything else changes (right
    after the image check, before the models are fetched). An image already on the node is
    probed in the plan; one that is not is pulled first, the only change before a refusal."""
    from orchestrator.phases.image_share import image_steps
    from orchestrator.phases.models import ServingPhase

    recipe = spec.recipe
    if spec.backend != "ray" or images.known(recipe.image):
        return None
    steps: list[Step] = [*image_steps(lambda ctx: recipe.image, lambda ctx: spec.nodes),
                         images.RayInImage(recipe.image, "ray")]
    return ServingPhase("ray-check", steps,
                        lambda inv, node: image_facts(recipe, inv, spec.container),
                        serving=spec.nodes)
