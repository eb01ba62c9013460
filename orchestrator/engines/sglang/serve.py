"""SGLang servers: one container per server and node, `sparkctl-sglang-<name>`, whose main process
is `python3 -m sglang.launch_server` (rank R of the server's nodes), bound to 127.0.0.1 on the
first node. Several servers may run at once on chosen nodes; each has its own record
(RUN_DIR/servers/<name>/server.json on its first node, engines/servers.py).

Phases: server-check (every node's servers, judged against this one: name, port, memory),
image-check (phases/registry.py: each of the server's nodes can pull the image, or gets it from
a node that has it), the shared models phase, then serve: the image (pulled, or sent over the
fabric by phases/image_share.py, digest verified), a page-cache drop before a cold start (the seeds' rule
on unified memory; --no-drop-caches skips it), the containers, the record, readiness (SGLang's
/health and its "fired up" log line) and one real chat completion.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestrator.commands import quote
from orchestrator.core.step import Change, NodeContext, Phase, Step
from orchestrator.engines import apikey, config_hash, placed, recipe_origin, servers
from orchestrator.engines.lifecycle import ServerRecord
from orchestrator.engines.serverspec import ServerSpec
from orchestrator.engines.sglang.recipe import Recipe
from orchestrator.errors import SparkctlError
from orchestrator.paths import RUN_DIR
from orchestrator.phases import container as containers
from orchestrator.phases.container import INFINIBAND, ContainerSpec
from orchestrator.phases.memory import DropCaches, NodeGuard, guard_threshold
from orchestrator.recipe import CONTAINER_HF_HOME, DEFAULT_HOST, LaunchOptions
from orchestrator.remote.node_facts import has_infiniband

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node



def key_config(server: str) -> str:
    """The YAML `--config` the entry wrapper writes from the mounted key (0600, in the server's
    run dir, which the container mounts): SGLang merges it into its arguments in-process, so
    the key is in no process's argv (sglang/srt/server_args_config_parser.py)."""
    return f"{servers.record_dir(server)}/api_key.yaml"


def keyed_command(argv: list[str], server: str) -> tuple[list[str], list[str]]:
    """(docker run flags, command) that start ARGV with the key: a shell writes `api-key:` as
    a YAML double-quoted string (backslash and quote escaped) and execs SGLang with --config."""
    config = quote(key_config(server))
    script = (f"umask 077 && {{ printf 'api-key: \"'; tr -d '\\n' < {apikey.CONTAINER_KEY} | "
              f"sed 's/[\\\\\"]/\\\\&/g'; printf '\"\\n'; }} > {config} && "
              f"exec \"$@\" --config {config}")
    return ["--entrypoint", "/bin/sh"], ["-c", script, "sglang", *argv]


def launch_argv(recipe: Recipe, host: str, rank: int = 0, dist_addr: str | None = None) -> list[str]:
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", recipe.model]
    if recipe.revision != "main":
        argv += ["--revision", recipe.revision]
    argv += ["--tp-size", str(recipe.tp_size)]
    if recipe.pp_size > 1:
        argv += ["--pp-size", str(recipe.pp_size)]
    spec = recipe.speculative
    if spec is not None:
        argv += ["--speculative-algorithm", spec.name]
        if spec.draft_model:
            argv += ["--speculative-draft-model-path", spec.draft_model]
        for flag, value in (("--speculative-num-steps", spec.num_steps),
                            ("--speculative-eagle-topk", spec.eagle_topk),
                            ("--speculative-num-draft-tokens", spec.num_draft_tokens)):
            if value is not None:
                argv += [flag, str(value)]
    argv += ["--mem-fraction-static", f"{recipe.memory.kv_cache_fraction:g}"]
    if recipe.trust_remote_code:
        argv.append("--trust-remote-code")
    if recipe.node_count > 1:
        argv += ["--nnodes", str(recipe.node_count), "--node-rank", str(rank),
                 "--dist-init-addr", dist_addr or f"<first node's fabric IP>:{recipe.dist_port}"]
    return [*argv, "--host", host, "--port", str(recipe.port), *recipe.serve_args]


class ServeSpec(ServerSpec):
    """One launch of one SGLang server: its rendezvous, containers, record and judgement."""

    recipe: Recipe

    def __init__(self, recipe: Recipe, inventory: Inventory, options: LaunchOptions) -> None:
        super().__init__(recipe, inventory, options, "sparkctl-sglang-{name}")
        keyed = ["--config", key_config(self.name)] if self.key is not None else []
        self.digest = config_hash(recipe, launch_argv(recipe, self.host) + keyed, self.name)

    def dist_addr(self) -> str:
        return f"{self.inventory.mpi_address(self.inventory.node(self.first))}:{self.recipe.dist_port}"

    def listen_ports(self) -> list[int]:
        return [self.port] + ([self.recipe.dist_port] if len(self.nodes) > 1 else [])

    def record(self) -> dict[str, Any]:
        r = self.recipe
        return ServerRecord(
            name=self.name, engine="sglang", recipe=r.name, model=r.model, port=r.port,
            nodes=self.nodes, config_hash=self.digest, host=self.host,
            ranks=r.tp_size * r.pp_size, persistent=self.options.persist,
            guard_min_available_gb=guard_threshold(self.options.guard_min_available_gb, r),
            memory_gb=self.estimate.total_gb, container=self.container,
            extra={"tp_size": r.tp_size, "pp_size": r.pp_size, "image": r.image,
                   "dist_port": r.dist_port if len(self.nodes) > 1 else None,
                   "speculative": r.speculative.name if r.speculative else None,
                   **recipe_origin(r), **apikey.record_fields(self.name, self.key)}).to_dict()

    def env(self, node: Node, roce: list[str]) -> dict[str, str]:
        """The fabric environment, all of it as the other engines get it (phases/container.fabric_env,
        a ring's three NCCL settings included), plus Gloo's one interface and SGLang's host IP."""
        env = dict(containers.fabric_env(self.inventory, roce))
        env.update({"GLOO_SOCKET_IFNAME": self.inventory.fabric.interfaces[0],
                    "SGLANG_HOST_IP": self.inventory.mpi_address(node), "HF_HUB_OFFLINE": "1"})
        env.update(self.recipe.env)
        return env

    def container_spec(self, node: Node, roce: list[str], hf_cache: str,
                       infiniband: bool) -> ContainerSpec:
        rank = self.nodes.index(node.name)
        flags = ["--ipc", "host", "--gpus", "all", "--shm-size", "32g", "--ulimit", "memlock=-1",
                 "--ulimit", "stack=67108864"]
        if infiniband:
            flags += ["--device", f"{INFINIBAND}:{INFINIBAND}"]
        hashed = {"server": self.digest}
        if rank > 0:  # a new rank 0 is a new rendezvous: the other ranks start again with it
            hashed["first"] = self.container_spec(self.inventory.node(self.first), roce, hf_cache,
                                                  infiniband).digest()
        argv = launch_argv(self.recipe, self.host, rank,
                           self.dist_addr() if len(self.nodes) > 1 else None)
        mounts = [(RUN_DIR, RUN_DIR, False), (hf_cache, CONTAINER_HF_HOME, False)]
        if self.key is not None:  # the key file read-only; a new key starts the server again
            mounts.append(apikey.key_mount(self.name))
            hashed["api_key"] = apikey.key_digest(self.key, self.name)
            entry, argv = keyed_command(argv, self.name)
            flags += entry
        return ContainerSpec(
            name=self.container, image=self.recipe.image, command=argv, env=self.env(node, roce),
            mounts=mounts,
            labels=containers.managed_labels(self.inventory, node, engine="sglang",
                                             server=self.name, recipe=self.recipe.name,
                                             rank=str(rank)),
            flags=flags, hashed=hashed, ready_what=f"SGLang rank {rank} in {self.container}",
            restart=containers.RESTART_POLICY if self.options.persist else None,
            hint=(f"Hint: `docker logs {self.container}` on {node.name} says why SGLang exited "
                  "(a flag, the model, memory)."),
            dirs=[RUN_DIR])

    def spec_for(self, ctx: NodeContext) -> ContainerSpec | None:
        if ctx.node.name not in self.nodes:
            return None
        if len(self.nodes) > 1:
            check_fabric_link(ctx, self)
        infiniband = has_infiniband(ctx.facts)
        roce = containers.roce_devices(ctx.inventory, ctx.facts, ctx.node.name)
        return self.container_spec(ctx.node, roce, containers.node_hf_cache(ctx), infiniband)


def check_fabric_link(ctx: NodeContext, spec: ServeSpec) -> None:
    """Ranks meet at --dist-init-addr over the fabric: a link that is down or an address that is
    gone is named (with the fix) before SGLang would time out in its rendezvous."""
    from orchestrator.phases.network import fabric_link_problem

    found = fabric_link_problem(ctx)
    if found is None:
        return
    raise SparkctlError(
        f"{ctx.node.name}: SGLang's ranks of {spec.name} meet at --dist-init-addr "
        f"{spec.dist_addr()} over the fabric, but {found[2]}. Fix: check the cable between "
        f"{', '.join(spec.nodes)} (`sparkctl status`, `sparkctl netcheck`); `sparkctl up` "
        "restores the addresses")


def cold_start_reason(spec: ServeSpec, container_step: containers.Container
                      ) -> Callable[[NodeContext], str | None]:
    """Why a node needs no page-cache drop before this server starts (None: a cold start)."""
    def reason(ctx: NodeContext) -> str | None:
        if ctx.node.name not in spec.nodes:
            return "no server here"
        if spec.options.skip_drop_caches:
            return "skipped (--no-drop-caches)"
        if not isinstance(container_step.check(ctx), Change):
            return "the server is already running: no cold start"
        return None
    return reason


def serve_phase(spec: ServeSpec, ready: list[Step]) -> Phase:
    from orchestrator.phases.image_share import image_steps
    from orchestrator.phases.models import ServingPhase
    from orchestrator.phases.registry import with_probe

    def facts(inv: Inventory, node: Node) -> dict[str, Any]:
        own = containers.spec_facts([spec.recipe.image], [spec.container], inv.cluster.user)
        own["links"] = True
        own["commands"]["servers"] = servers.servers_cmd(inv, node, probe=True)  # (as the check phase asks)
        if spec.key is not None:
            own.setdefault("files", {}).update(apikey.key_facts(spec.name)["files"])
        return with_probe(own, spec.recipe.image if node.name in spec.nodes else None)

    # a serving node that cannot pull gets the image from one that has it, over the fabric
    container = containers.Container(spec.spec_for, name="sglang")

    def guarded(ctx: NodeContext) -> str | None:
        running = not isinstance(container.check(ctx), Change)
        return "the server already runs (with its guard)" if running else None

    # the memory guard on every serving node, before the containers start loading
    guard = NodeGuard(spec.nodes, servers.record_dir(spec.name), [spec.container],
                      guard_threshold(spec.options.guard_min_available_gb, spec.recipe), guarded)
    steps: list[Step] = [*image_steps(lambda ctx: spec.recipe.image, lambda ctx: spec.nodes),
                         DropCaches(cold_start_reason(spec, container)),
                         apikey.key_files_step(spec.name, spec.nodes, spec.key), guard, container,
                         placed.Record(spec), *ready]
    nodes = [spec.inventory.head_name, *(n for n in spec.nodes if n != spec.inventory.head_name)]
    return ServingPhase("serve", steps, facts, serving=nodes)


def preview(recipe: Recipe) -> list[str]:
    return launch_argv(recipe, DEFAULT_HOST)
