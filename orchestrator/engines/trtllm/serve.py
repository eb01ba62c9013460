"""A TensorRT-LLM server, named and placed: `mpirun ... trtllm-serve` started detached (docker
exec -d) in the `up` container of its first node, its ranks on its own nodes only.

Everything of one server lives in RUN_DIR/servers/<name>/ on each of its nodes (the `up`
container mounts RUN_DIR at the same path): the extra LLM API config, its MPI hostfile (its
nodes' fabric addresses in rank order, what mpirun reads instead of the cluster's), processes.json
(which container and command-line words make its processes: node/servers.py checks them there),
the pid files (mpirun.pid, rank-N.pid, memguard.pid) and logs (server.log, rank-N.log), and on
the first node its record server.json (orchestrator/records.ServerRecord). Several servers run at
once, on other nodes or on one node when ports and memory allow (engines/servers.py).

A relaunch of the same server is a no-op (its record's config hash matches and /health is 200);
another configuration under the same name is refused unless --replace; a dead or stalled one is
restarted (engines/lifecycle.py). Readiness is judged over HTTP on the first node afterwards
(readiness.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import yaml

from orchestrator.engines import apikey, config_hash, lifecycle, recipe_origin
from orchestrator.engines.lifecycle import Decision, Running, ServerRecord
from orchestrator.engines.liveness import dead_ranks as ranks_ended
from orchestrator.engines.serverctl import node_cmd, pid_wrapper
from orchestrator.engines.servers import record_dir
from orchestrator.engines.serverspec import ServerSpec
from orchestrator.engines.trtllm.recipe import Recipe
from orchestrator.errors import SparkctlError
from orchestrator.inventory import Inventory
from orchestrator.recipe import LaunchOptions
from orchestrator.remote.container import ContainerCommands
from orchestrator.remote.gathered import NodeFacts
from orchestrator.render import render

CONFIG_NAME = "extra-llm-api-config.yml"
HOSTFILE_NAME = "hostfile"
PROCESSES_NAME = "processes.json"
MAIN = "mpirun.pid"
OURS = ("mpirun", "trtllm", "orted", "sparkctl-memguard")
"""Words in the command lines of the processes a server starts (mpirun, its daemons, the ranks
under trtllm-llmapi-launch, the memory guard): a pid file naming anything else is not ours."""
HOSTFILE_VARS = ("OMPI_MCA_orte_default_hostfile", "PRTE_MCA_prte_default_hostfile")
"""The default hostfile's name in Open MPI 4 and 5 (engines/trtllm/mpi_env.py): set for mpirun
to the server's own hostfile (each version ignores the other's name)."""
# Forwarded to every rank besides the fabric's variables (phases/nccl_env.fabric_variable_names).
FABRIC_ENV = ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "UCX_NET_DEVICES")
PASSED_ENV = ("CPATH", "TRITON_PTXAS_PATH")


def server_dir(name: str) -> str:
    return record_dir(name)


def render_llm_api_config(recipe: Recipe) -> str:
    options = yaml.safe_dump(recipe.llm_api_config(), sort_keys=False, default_flow_style=False)
    return render("trtllm/templates/extra-llm-api-config.yml.j2", recipe=recipe.name,
                  options=options.rstrip())


def hostfile_text(inventory: Inventory, nodes: Sequence[str]) -> str:
    """The server's MPI hostfile: its nodes' fabric addresses, rank 0 (mpirun's node) first."""
    lines = [f"{inventory.mpi_address(inventory.node(name))} slots=1" for name in nodes]
    return "# sparkctl: this server's MPI hosts, in rank order\n" + "\n".join(lines) + "\n"


def processes_text(container: str) -> str:
    return json.dumps({"container": container, "ours": list(OURS)}, sort_keys=True) + "\n"


def rank_wrapper(directory: str, bootstrap: Sequence[str] | None) -> str:
    """Each rank records its pid and writes its log in the server's directory on its node; in
    a ring, preceded by each rank's own NCCL_SOCKET_IFNAME (exact name, `=`): -x forwards the
    first node's value to every rank, but a ring's bootstrap interface differs per node
    (phases/nccl_env.bootstrap_interfaces)."""
    wrapper = ('r="${OMPI_COMM_WORLD_RANK:-0}"; '
               + pid_wrapper(f'{directory}/rank-"$r".pid', f'{directory}/rank-"$r".log'))
    if not bootstrap:
        return wrapper
    cases = " ".join(f"{rank}) export NCCL_SOCKET_IFNAME=={name};;"
                     for rank, name in enumerate(bootstrap))
    return f'case "${{OMPI_COMM_WORLD_RANK:-0}}" in {cases} esac; ' + wrapper


def serve_argv(recipe: Recipe, host: str, fabric: Sequence[str] = FABRIC_ENV,
               bootstrap: Sequence[str] | None = None, name: str | None = None) -> list[str]:
    """mpirun across the server's nodes; each rank's output in its own node's rank-N.log. `fabric`
    names the container's NCCL/UCX variables (a ring adds three): remote ranks start through the
    container's sshd with none of the container's environment, so each is forwarded (-x).
    `bootstrap`: per rank, a ring's NCCL bootstrap interface."""
    directory = server_dir(name or recipe.name)
    passed = ["HF_HUB_OFFLINE=1", *fabric, *PASSED_ENV]
    if not recipe.memory.parallel_weight_loading:
        passed.append("TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL=1")
    argv = ["mpirun", "-np", str(recipe.node_count)]
    for variable in passed:
        argv += ["-x", variable]
    argv += ["bash", "-c", rank_wrapper(directory, bootstrap), "sparkctl-rank",
             "trtllm-llmapi-launch", "trtllm-serve", recipe.model,
             "--backend", recipe.backend, "--tp_size", str(recipe.tp_size)]
    if recipe.max_num_tokens:
        argv += ["--max_num_tokens", str(recipe.max_num_tokens)]
    argv += ["--extra_llm_api_options", f"{directory}/{CONFIG_NAME}", "--port", str(recipe.port),
             "--host", host, *recipe.serve_args]
    return argv


def start_cmd(container: str, argv: list[str], directory: str, relay: str = "") -> str:
    """Detached (docker exec -d), mpirun's own output in server.log, its pid in mpirun.pid, the
    server's own hostfile as mpirun's default one; RELAY: the key-checking relay's start
    (keyrelay.relay_prefix) when the server has a key."""
    wrapper = pid_wrapper(f"{directory}/{MAIN}", f"{directory}/server.log")
    hostfile = f"{directory}/{HOSTFILE_NAME}"
    return ContainerCommands(container).exec_cmd(
        ["bash", "-c", relay + wrapper, "sparkctl-server", *argv],
        env={"HF_HUB_OFFLINE": "1", **dict.fromkeys(HOSTFILE_VARS, hostfile)}, detach=True)


def status_from_facts(facts: NodeFacts) -> dict[str, Any]:
    answer = facts.command("serve")
    if answer is None or answer.rc != 0:
        return {"error": (answer.err if answer else "")[-300:]}
    return dict(json.loads(answer.out))


def dead_ranks(cluster_facts: dict[str, NodeFacts], nodes: list[str]) -> tuple[str, ...]:
    """Recorded rank processes that have ended on these nodes (liveness.dead_ranks' words, as
    status says them too)."""
    return tuple(ranks_ended({node: status_from_facts(cluster_facts.get(node) or NodeFacts(node)).get("pids")
                              or {} for node in nodes}))


def node_plan(recipe: Recipe) -> Any:
    """What one serving node holds (the memory preflight's and the guard's figures)."""
    from orchestrator.engines.trtllm.recipe import estimate_memory
    from orchestrator.phases.memory import NodePlan

    estimate = estimate_memory(recipe)
    return NodePlan(weights_gb=estimate.weights_gb, draft_gb=estimate.draft_gb,
                    runtime_gb=estimate.runtime_gb, kv_cache_fraction=recipe.memory.kv_cache_fraction,
                    tp_size=recipe.tp_size, total_weights_gb=recipe.memory.weights_gb)


class LaunchSpec(ServerSpec):
    """Everything the serve steps of one server share, computed once (pure): its MPI hostfile,
    config, argv (behind the key relay with a key), files and record; in the `up` container."""

    recipe: Recipe

    def __init__(self, recipe: Recipe, inventory: Inventory, options: LaunchOptions) -> None:
        from orchestrator.phases.memory import guard_threshold
        from orchestrator.phases.nccl_env import bootstrap_interfaces, fabric_variable_names

        super().__init__(recipe, inventory, options, inventory.container.name)
        self.replace = options.replace
        self.drop_caches = options.drop_caches
        self.persistent = options.persist
        self.guard_min_available_gb = guard_threshold(options.guard_min_available_gb, recipe)
        self.run_dir = server_dir(self.name)
        self.config_text = render_llm_api_config(recipe)
        self.hostfile = hostfile_text(inventory, self.nodes)
        self.argv = serve_argv(recipe, self.host, fabric_variable_names(inventory),
                               bootstrap_interfaces(inventory, self.nodes), self.name)
        self.key, self.relay = options.api_key, ""
        if self.key is not None:  # trtllm-serve takes no key: the relay binds host:port instead
            from orchestrator.engines.trtllm import keyrelay

            self.argv = keyrelay.behind_relay(self.argv, recipe.port)
            self.relay = keyrelay.relay_prefix(self.host, recipe.port,
                                               apikey.node_key_file(self.name), self.run_dir)
        keyed = ["api-key", apikey.key_digest(self.key, self.name)] if self.key is not None else []
        self.digest = config_hash(recipe, self.argv + keyed, self.config_text)
        self.memory_gb = self.estimate.total_gb

    def files(self) -> dict[str, str]:
        """The server's files on each of its nodes, by path."""
        return {f"{self.run_dir}/{CONFIG_NAME}": self.config_text,
                f"{self.run_dir}/{HOSTFILE_NAME}": self.hostfile,
                f"{self.run_dir}/{PROCESSES_NAME}": processes_text(self.container)}

    def start_cmd(self) -> str:
        return start_cmd(self.container, self.argv, self.run_dir, self.relay)

    def status_cmd(self, port: int | None) -> str:
        return node_cmd(self.container, action="status", run=self.run_dir, ours=list(OURS),
                        main=MAIN, port=port)

    def record(self, started: str | None = None) -> dict[str, Any]:
        r = self.recipe
        draft = r.speculative.draft_model if r.speculative else None
        return ServerRecord(
            name=self.name, engine=r.engine, recipe=r.name, model=r.model, port=r.port,
            nodes=list(self.nodes), config_hash=self.digest, host=self.host, ranks=r.tp_size,
            guard_min_available_gb=self.guard_min_available_gb, persistent=self.persistent,
            memory_gb=self.memory_gb, container=self.container, started=started or lifecycle.now(),
            extra={"draft_model": draft, "tp_size": r.tp_size, "main": MAIN, "ours": list(OURS),
                   "memory_gb_per_node": self.memory_gb,
                   **recipe_origin(r), **apikey.record_fields(self.name, self.key)}).to_dict()

    def running(self, ctx_facts: dict[str, NodeFacts]) -> Running:
        first = ctx_facts.get(self.first) or NodeFacts(self.first)
        return Running.from_status(status_from_facts(first), MAIN)

    def decision(self, ctx: Any) -> Decision:
        """The shared judgement (engines/lifecycle.py) over the first node's status and the
        ranks that ended on any of the server's nodes."""
        running = self.running(ctx.cluster_facts)
        dead = dead_ranks(ctx.cluster_facts, list(self.nodes))
        decision = lifecycle.decide(running, self.digest, self.replace, dead)
        if decision == "refuse":
            raise SparkctlError(lifecycle.refusal(running, self.name))
        return decision

    def restart_reason(self, ctx: Any) -> str:
        return lifecycle.restart_reason(self.running(ctx.cluster_facts),
                                        dead_ranks(ctx.cluster_facts, list(self.nodes)))
