"""The Ray cluster a vLLM server runs on: its own, one container per node of the server, all
over the fabric.

The first node's container (`sparkctl-vllm-<server>`) runs `ray start --head --node-ip-address
<its fabric IP>`, every other node's `ray start --address <first node's fabric IP>:<port>
--node-ip-address <its fabric IP>`, each as the container's main process (`--block`), so the
container lives exactly as long as its Ray node. The ports are the server's own
(engines/vllm/ports.py), so two servers' Ray clusters can share a node. Never the management
network: Ray, NCCL, Gloo and vLLM all get the fabric addresses and interfaces from the
inventory (VLLM_HOST_IP, NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, ...). Before `vllm serve`
starts, the first node waits (with a deadline) until Ray reports every node of the server; a
node that does not show up is named, with the end of its Ray log.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from orchestrator.commands import quote
from orchestrator.core.step import Change, NodeContext, Outcome, Step, Unchanged
from orchestrator.engines.vllm.recipe import Recipe
from orchestrator.errors import SparkctlError
from orchestrator.inventory import Inventory, Node
from orchestrator.node import script
from orchestrator.paths import RUN_DIR
from orchestrator.phases import container as containers
from orchestrator.phases.container import INFINIBAND, ContainerSpec
from orchestrator.recipe import CONTAINER_HF_HOME
from orchestrator.records import ServerRecord
from orchestrator.remote.container import ContainerCommands, ContainerTransport
from orchestrator.remote.fact_records import CommandResult
from orchestrator.remote.gathered import NodeFacts
from orchestrator.remote.node_facts import container_started, has_infiniband
from orchestrator.timestamps import parse_time

if TYPE_CHECKING:
    from orchestrator.engines.vllm.serve import ServeSpec

RAY_LOGS = "/tmp/ray/session_latest/logs"
SPREAD = '{"placement_group_options":{"strategy":"SPREAD"}}'
READY_LOG_LINE = "Ray runtime started"
STARTED_LINE = READY_LOG_LINE.replace(" ", "[ ]")  # no literal of the marker in our argv

RAY_PROBE = script("ray_nodes.py")
"""Runs in the head container with its python3 (the image's, which has Ray): the nodes Ray
knows (orchestrator/node/ray_nodes.py)."""


def node_ip(inventory: Inventory, node: Node) -> str:
    """The fabric address Ray, NCCL and vLLM use for a node (the one the head reaches it at)."""
    return inventory.mpi_address(node)


def engine_env(inventory: Inventory, node: Node, roce: list[str], recipe: Recipe) -> dict[str, str]:
    """The fabric environment, all of it as every engine's container gets it (a ring's three
    NCCL settings included), plus what vLLM reads: its host IP and Gloo's one interface. Nothing
    that nothing reads (TP_SOCKET_IFNAME is TensorPipe's, MASTER_ADDR torchrun's: vLLM takes its
    rendezvous from its own flags)."""
    env = dict(containers.fabric_env(inventory, roce))
    env.update({
        "VLLM_HOST_IP": node_ip(inventory, node),
        # Gloo takes one interface, not a list
        "GLOO_SOCKET_IFNAME": inventory.fabric.interfaces[0],
    })
    if recipe.backend == "ray":
        env.update({
            # Ray's memory monitor counts GPU-resident weights on unified memory as host memory
            # and kills healthy workers (NVIDIA's vLLM playbook turns it off the same way)
            "RAY_memory_monitor_refresh_ms": "0",
            # one GPU per Spark: vLLM's default PACK placement group would try to put bundles
            # together; SPREAD puts one on each node (eugr/spark-vllm-docker#227)
            "VLLM_DISTRIBUTED_EXECUTOR_CONFIG": SPREAD,
        })
    env.update(recipe.env)
    return env


def ray_args(spec: ServeSpec, node: Node) -> list[str]:
    recipe, ports = spec.recipe, spec.ports
    ip = spec.node_ip(node.name)
    store = str(int(recipe.ray.object_store_gb * 1e9))
    if spec.is_first(node):
        args = ["ray", "start", "--head", "--node-ip-address", ip, "--port", str(ports.ray),
                "--include-dashboard=false"]
    else:
        head = spec.node_ip(spec.first)
        args = ["ray", "start", "--address", f"{head}:{ports.ray}", "--node-ip-address", ip]
    # every port fixed, the server's own: another server's Ray node may run on this node too,
    # and the port guard (engines/vllm/guard.py) closes exactly these beyond the fabric
    args += ports.ray_node.args()
    args += ["--num-gpus", "1", "--object-store-memory", store, "--disable-usage-stats"]
    if recipe.ray.num_cpus:
        args += ["--num-cpus", str(recipe.ray.num_cpus)]
    return [*args, "--block"]


def ray_spec(spec: ServeSpec, node: Node, roce: list[str], hf_cache: str, infiniband: bool,
             restart: str | None = None) -> ContainerSpec:
    """A node's Ray container of the server; `restart` is docker's restart policy (--persist)."""
    recipe, inventory = spec.recipe, spec.inventory
    head = spec.is_first(node)
    flags = ["--ipc", "host", "--gpus", "all", "--ulimit", "memlock=-1",
             "--ulimit", "stack=67108864"]
    if infiniband:
        flags += ["--device", f"{INFINIBAND}:{INFINIBAND}"]
    head_ip, port = spec.node_ip(spec.first), spec.ports.ray
    hashed: dict[str, str] = {}
    if not head:
        # a new head is a new Ray cluster: the workers must start again to join it
        head_spec = ray_spec(spec, inventory.node(spec.first), roce, hf_cache, infiniband,
                             restart)
        hashed["head"] = head_spec.digest()
    name = spec.container
    return ContainerSpec(
        name=name, image=recipe.image, command=ray_args(spec, node),
        env=engine_env(inventory, node, roce, recipe),
        mounts=[(RUN_DIR, RUN_DIR, False), (hf_cache, CONTAINER_HF_HOME, False)],
        labels=containers.managed_labels(inventory, node, engine="vllm", server=spec.name,
                                         recipe=recipe.name,
                                         role="ray-head" if head else "ray-worker"),
        flags=flags, hashed=hashed, restart=restart,
        ready=f"{ContainerCommands(name).logs_cmd()} 2>&1 | grep -q {quote(STARTED_LINE)}",
        ready_what=(f"the Ray head in {name} did not start on {head_ip}:{port}" if head else
                    f"the Ray worker on {node.name} did not join the head at {head_ip}:{port}"),
        hint=(f"Hint: the Ray head binds {head_ip}, {spec.first}'s fabric address: is its link up "
              "(`sparkctl status`)?" if head else
              f"Hint: {node.name} must reach the Ray head at {head_ip}:{port} over the fabric: "
              "is the cable in and are both addresses configured? `sparkctl netcheck` tests the "
              "links; `sparkctl up` restores the addresses."),
        dirs=[RUN_DIR],
    )


def check_fabric_link(ctx: NodeContext, first: str) -> None:
    """Ray binds the node's fabric address: refuse at once (naming the fix) when its link is
    down or the address is gone, instead of letting `ray start` time out."""
    from orchestrator.phases.network import fabric_link_problem

    found = fabric_link_problem(ctx)
    if found is None:
        return
    ip, iface, problem = found
    role = "the Ray head" if ctx.node.name == first else "its Ray worker"
    raise SparkctlError(
        f"{ctx.node.name}: {role} would use {ip} on {iface}, but {problem}. Ray, NCCL and "
        "vLLM only use the fabric: check the cable (`sparkctl status`, `sparkctl netcheck`); "
        "`sparkctl up` restores the addresses")


def spec_for(spec: ServeSpec, role: str, restart: str | None = None) -> containers.SpecFor:
    def pick(ctx: NodeContext) -> ContainerSpec | None:
        if ctx.node.name not in spec.nodes or (role == "head") != spec.is_first(ctx.node):
            return None
        check_fabric_link(ctx, spec.first)
        infiniband = has_infiniband(ctx.facts)
        roce = containers.roce_devices(ctx.inventory, ctx.facts, ctx.node.name)
        return ray_spec(spec, ctx.node, roce, containers.node_hf_cache(ctx), infiniband, restart)
    return pick


def head_started(ctx: NodeContext, spec: ServeSpec) -> str:
    """When the head's Ray container last started: as started in this run, else its facts."""
    if ctx.shared.engine.get(HEAD_STARTED):
        return str(ctx.shared.engine[HEAD_STARTED])
    return container_started(ctx.cluster_facts.get(spec.first) or NodeFacts(spec.first), spec.container)


HEAD_STARTED = "ray_head_started"


class RayHead(containers.Container):
    """The head's Ray container; after (re)starting it, records when it started, so the
    workers' step (next, on the other nodes) sees they must join this new head."""

    def __init__(self, spec: ServeSpec, restart: str | None = None) -> None:
        super().__init__(spec_for(spec, "head", restart), name="ray-head")
        self.container = spec.container

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        message = super().apply(ctx, change)
        result = ctx.run(ContainerCommands(self.container).inspect_cmd("{{.State.StartedAt}}"),
                         sudo=True, timeout=60)
        if result.ok:
            ctx.shared.engine[HEAD_STARTED] = result.stdout.strip()
        return message


class RayWorker(containers.Container):
    """A worker's Ray container. A worker belongs to the head it joined: once the head's
    container restarted (`docker restart`, a crash) after the worker started, its Ray cluster
    is a new one and the old worker's raylet only dies a minute later, so a running worker that
    started before the head is replaced (saying why). After a reboot with --persist both restart
    and the worker (re)joins the new head: it started after the head, and is left alone."""

    def __init__(self, spec: ServeSpec, restart: str | None = None) -> None:
        super().__init__(spec_for(spec, "worker", restart), name="ray-worker")
        self.server = spec

    def check(self, ctx: NodeContext) -> Outcome:
        outcome = super().check(ctx)
        started = container_started(ctx.facts, self.server.container)
        if isinstance(outcome, Change) or not started:
            return outcome
        mine = parse_time(started)
        head = parse_time(head_started(ctx, self.server))
        spec = self.spec_for(ctx)
        if mine is None or head is None or mine >= head or spec is None:
            return outcome
        return Change(f"replace container {self.server.container}: the Ray head restarted "
                      f"({head_started(ctx, self.server)}) after this worker joined it; join the "
                      "new head", payload={"args": spec.with_hash(spec.run_args(), spec.digest()),
                                           "remove_old": True})


def probe_cmd(container: str) -> str:
    return ContainerCommands(container).exec_cmd(["python3", "-c", RAY_PROBE])


def parse_probe(answer: CommandResult | None) -> dict[str, Any]:
    if answer is not None and answer.rc != 0:
        return {"error": (answer.err or answer.out).strip()[-400:]}
    for line in reversed((answer.out if answer else "").strip().splitlines()):
        try:
            return dict(json.loads(line))
        except (json.JSONDecodeError, TypeError):
            continue
    return {"error": "the Ray probe printed no JSON"}


def missing_nodes(spec: ServeSpec, probe: dict[str, Any]) -> list[Node]:
    alive = {n.get("ip") for n in probe.get("nodes") or [] if n.get("alive")}
    return [spec.inventory.node(name) for name in spec.nodes if spec.node_ip(name) not in alive]


def ray_log_tail(transport: Any, container: str, lines: int = 15) -> str:
    inside = ContainerCommands(container)
    command = (f"{inside.logs_cmd(lines)} 2>&1; "
               + inside.exec_cmd(["sh", "-c", f"tail -n {lines} {RAY_LOGS}/raylet.err "
                                  f"{RAY_LOGS}/raylet.out 2>/dev/null"]) + " 2>&1; true")
    try:
        result = transport.run(command, sudo=True, timeout=60, display=f"Ray logs in {container}")
        return result.stdout.strip() or "(no Ray log)"
    except SparkctlError as exc:
        return f"(could not read its Ray log: {exc})"


class RayCluster(Step):
    """Every node of the server alive in its Ray (what `ray status` counts), before vLLM starts;
    on the server's first node (its Ray head)."""

    name = "ray-cluster"

    def __init__(self, spec: ServeSpec) -> None:
        self.spec = spec
        self.recipe = spec.recipe

    def check(self, ctx: NodeContext) -> Outcome:
        if not self.spec.is_first(ctx.node):
            return Unchanged(f"the Ray head of {self.spec.name} is on {self.spec.first}")
        probe = parse_probe(ctx.facts.command("ray"))
        want = len(self.spec.nodes)
        if "error" not in probe and not missing_nodes(self.spec, probe):
            alive = sorted(n["ip"] for n in probe["nodes"] if n.get("alive"))
            return Unchanged(f"Ray: {want} node(s) alive ({', '.join(alive)})")
        return Change(f"wait until Ray reports {want} node(s) (deadline "
                      f"{self.recipe.ray.join_timeout:g}s)")

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        note = ctx.options.note
        spec = self.spec
        container = spec.container
        started = time.monotonic()
        deadline = started + self.recipe.ray.join_timeout
        last = 0.0
        while True:
            result = ctx.run(probe_cmd(container), sudo=True, timeout=120,
                             display=ContainerTransport(ctx, container).shown("python3 -c <ray nodes>"))
            probe = parse_probe(CommandResult(result.exit_status, result.stdout, result.stderr))
            missing = missing_nodes(spec, probe)
            alive = sorted(n["ip"] for n in probe.get("nodes") or [] if n.get("alive"))
            if "error" not in probe and not missing:
                return f"Ray: {len(alive)} node(s) alive ({', '.join(alive)})"
            if time.monotonic() > deadline:
                break
            if time.monotonic() - last > 10:
                state = probe.get("error") or f"{len(alive)} alive, waiting for " + ", ".join(
                    f"{n.name} ({spec.node_ip(n.name)})" for n in missing)
                note(f"        [{time.monotonic() - started:5.1f}s] Ray: {state}")
                last = time.monotonic()
            time.sleep(2)
        head_ip = spec.node_ip(spec.first)
        parts = []
        for node in missing:
            transport = ctx.transports.get(node.name)
            tail = ray_log_tail(transport, container) if transport else "(node unreachable)"
            parts.append(f"--- {node.name}: {container} (docker logs and raylet logs)\n{tail}")
        names = ", ".join(f"{n.name} ({spec.node_ip(n.name)})" for n in missing)
        raise SparkctlError(
            f"{ctx.node.name}: Ray shows {len(alive)} of {len(spec.nodes)} "
            f"node(s) after {self.recipe.ray.join_timeout:g}s; missing: {names}"
            + (f" ({probe['error']})" if probe.get("error") else "")
            + f". Each worker must reach the head at {head_ip}:{spec.ports.ray} over the "
            "fabric: check the cable and addresses (`sparkctl netcheck`, `sparkctl status`).\n"
            + "\n".join(parts))


def judge_probe(server: ServerRecord, answer: CommandResult | None) -> dict[str, Any]:
    """`status`: vLLM's Ray cluster as its head reports it (RAY_PROBE's answer): every node the
    server runs on must be alive. A server on vLLM's own multi-node (mp) has no Ray: {}."""
    if server.extra.get("executor", "ray") != "ray":
        return {}
    probe: dict[str, Any] = (parse_probe(answer) if answer and (answer.out or answer.rc)
                             else {"error": "no answer"})
    nodes = probe.get("nodes") or []
    alive = sorted(n.get("ip") for n in nodes if n.get("alive"))
    want = len(server.nodes) or 1
    out: dict[str, Any] = {"nodes": nodes, "alive": len(alive), "expected": want, "problem": ""}
    if probe.get("error"):
        out["error"] = probe["error"]
        out["problem"] = f"the Ray cluster does not answer: {probe['error']}"
    elif len(alive) < want:
        out["problem"] = (f"Ray has {len(alive)} of {want} node(s) alive ({', '.join(alive) or 'none'}): "
                          "a worker's container or link is down; see `sparkctl logs`")
    return out
