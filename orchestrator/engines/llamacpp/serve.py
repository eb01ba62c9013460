"""One llama.cpp server: `llama-server` in a container on its first node and, when it spans more
nodes, `rpc-server` in a container on each of the others, bound to that node's fabric address;
the first node's llama-server lists them with `--rpc IP:PORT,...` in rank order and splits the
model's layers over them (llama.cpp's RPC backend; the weights travel over the fabric from the
first node, so only it needs the GGUF file).

Phases: server-check (every node's servers, judged against this one: name, port, memory),
image-check, the shared models phase (to the first node only), `rpc` (the image on every
serving node, the rpc-server containers, then a real TCP connection from the first node to
each of them: an unreachable one is refused before anything loads, naming node and port), then
`serve` (llama-server, the record, readiness: /health 200 and the model under /v1/models, then
one real chat completion). A rpc-server container that was started again makes llama-server
start again too (its container's configuration hash holds the rpc containers' IDs): a
restarted rpc-server has lost the layers it held.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from orchestrator.commands import join, quote
from orchestrator.core.step import Change, NodeContext, Phase, Step
from orchestrator.engines import apikey, config_hash, recipe_origin, servers
from orchestrator.engines.apikey import CONTAINER_KEY
from orchestrator.engines.llamacpp.recipe import Recipe
from orchestrator.engines.serverspec import ServerSpec
from orchestrator.errors import SparkctlError
from orchestrator.phases import container as containers
from orchestrator.phases.container import ContainerSpec
from orchestrator.recipe import CONTAINER_HF_HOME, DEFAULT_HOST, LaunchOptions
from orchestrator.remote.gathered import NodeFacts
from orchestrator.remote.node_facts import INFINIBAND, DockerContainer

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node

ENGINE = "llamacpp"
CONNECT_SECONDS = 5


def snapshot_path(repo: str, revision: str, filename: str) -> str:
    """Where a file of a repo is in the container's HF cache; a branch's commit is read from
    refs/ when the container starts (the shell expands it), a commit is used as given."""
    folder = f"{CONTAINER_HF_HOME}/hub/models--{repo.replace('/', '--')}"
    if len(revision) == 40 and all(c in "0123456789abcdef" for c in revision):
        return f"{folder}/snapshots/{revision}/{filename}"
    return f"{folder}/snapshots/$(cat {folder}/refs/{revision})/{filename}"


def server_argv(recipe: Recipe, host: str, rpc: list[str], keyed: bool = False) -> list[str]:
    """llama-server's words; the model paths may hold $(...) for the shell that starts it.
    KEYED: llama-server reads the API key from the mounted file itself (`--api-key-file`)."""
    argv = ["llama-server", "-m", snapshot_path(recipe.model, recipe.revision, recipe.gguf),
            "--alias", recipe.model, "-ngl", str(recipe.gpu_layers), "-c", str(recipe.ctx_size),
            "-np", str(recipe.parallel)]
    if recipe.draft is not None:
        argv += ["--model-draft", snapshot_path(recipe.draft.model, recipe.draft.revision,
                                                recipe.draft.gguf)]
    if rpc:
        argv += ["--rpc", ",".join(rpc)]
    if keyed:
        argv += ["--api-key-file", CONTAINER_KEY]
    return [*argv, "--host", host, "--port", str(recipe.port), "--metrics", *recipe.serve_args]


def shell_line(argv: list[str]) -> str:
    """`exec llama-server ...` for sh -c: every word quoted, the model paths' $(cat refs) kept
    live (in double quotes) so the file of the branch the download fetched is the one loaded."""
    words = []
    for word in argv:
        if "$(" in word:
            head, _, rest = word.partition("$(")
            inner, _, tail = rest.partition(")")
            words.append(f'"{head}$({inner})"{quote(tail) if tail else ""}')
        else:
            words.append(quote(word))
    return "exec " + " ".join(words)


RPC_BINARIES = ("ggml-rpc-server", "rpc-server")
"""llama.cpp's RPC server by build: `ggml-rpc-server` from about b9824 (PR #25045, the one
the pinned image installs), `rpc-server` before (images such as b8192-cu131)."""
RPC_LAUNCH = (
    "for b in " + " ".join(RPC_BINARIES) + "; do "
    'if command -v "$b" >/dev/null 2>&1; then exec "$b" "$@"; fi; done; '
    "echo \"sparkctl: neither ggml-rpc-server (llama.cpp b9824 and later) nor rpc-server "
    "(earlier builds) is on this image's PATH\" >&2; exit 127")
"""sh -c script starting whichever name the image's build has, with the arguments after it."""


def rpc_argv(recipe: Recipe, address: str) -> list[str]:
    return ["-H", address, "-p", str(recipe.rpc_port), *recipe.rpc_args]


def rpc_command(recipe: Recipe, address: str) -> list[str]:
    """The rpc container's command under `--entrypoint /bin/sh`: the launcher, then argv."""
    return ["-c", RPC_LAUNCH, "rpc-server", *rpc_argv(recipe, address)]


class ServeSpec(ServerSpec):
    """One launch of one llama.cpp server: its rpc-servers, containers, record and judgement."""

    recipe: Recipe

    def __init__(self, recipe: Recipe, inventory: Inventory, options: LaunchOptions) -> None:
        super().__init__(recipe, inventory, options, "sparkctl-llamacpp-{name}")
        self.digest = config_hash(recipe, server_argv(recipe, self.host, self.rpc_endpoints(),
                                                      self.key is not None), self.name)

    def rpc_endpoints(self) -> list[str]:
        """IP:PORT of each other node's rpc-server, in rank order (what --rpc lists)."""
        return [f"{self.address(n)}:{self.recipe.rpc_port}" for n in self.nodes[1:]]

    def address(self, node: str) -> str:
        return self.inventory.mpi_address(self.inventory.node(node))

    def record(self) -> dict[str, Any]:
        r = self.recipe
        return {"name": self.name, "engine": ENGINE, "recipe": r.name, "model": r.model,
                "gguf": r.gguf, "port": r.port, "host": self.host, "nodes": self.nodes,
                "container": self.container, "image": r.image,
                "rpc": self.rpc_endpoints(), "draft_model": r.draft.model if r.draft else None,
                "memory_gb": self.estimate.total_gb, "config_hash": self.digest,
                "started": datetime.now(UTC).isoformat(timespec="seconds"),
                "persistent": self.options.persist,  # (a rolling relaunch keeps it)
                **recipe_origin(r),
                **apikey.record_fields(self.name, self.key)}

    def labels(self, node: Node, role: str) -> dict[str, str]:
        return containers.managed_labels(self.inventory, node, engine=ENGINE, server=self.name,
                                         recipe=self.recipe.name, role=role,
                                         rank=str(self.nodes.index(node.name)))

    def rpc_spec(self, node: Node) -> ContainerSpec:
        address = self.address(node.name)
        port = self.recipe.rpc_port
        return ContainerSpec(
            name=self.container, image=self.recipe.image, command=rpc_command(self.recipe, address),
            env=dict(self.recipe.env), labels=self.labels(node, "rpc-server"),
            flags=["--gpus", "all", "--entrypoint", "/bin/sh"],
            ready=f"ss -Hltn 'sport = :{port}' | grep -q {quote(f'{address}:{port}')}",
            ready_what=f"rpc-server listening on {address}:{port} in {self.container}",
            restart=containers.RESTART_POLICY if self.options.persist else None,
            hint=(f"Hint: `docker logs {self.container}` on {node.name} says why rpc-server "
                  f"exited (the address {address} not on the node, port {port} taken)."))

    def server_spec(self, node: Node, hf_cache: str, rpc_ids: list[str]) -> ContainerSpec:
        argv = server_argv(self.recipe, self.host, self.rpc_endpoints(), self.key is not None)
        mounts = [(hf_cache, CONTAINER_HF_HOME, True)]
        hashed = {"server": self.digest, "rpc": ",".join(rpc_ids)}
        if self.key is not None:  # the file, read-only; a new key starts the server again
            mounts.append(apikey.key_mount(self.name))
            hashed["api_key"] = apikey.key_digest(self.key, self.name)
        return ContainerSpec(
            name=self.container, image=self.recipe.image, command=["-c", shell_line(argv)],
            env=dict(self.recipe.env), mounts=mounts,
            labels=self.labels(node, "llama-server"),
            flags=["--gpus", "all", "--ipc", "host", "--entrypoint", "/bin/sh"],
            hashed=hashed,
            ready_what=f"llama-server in {self.container}",
            restart=containers.RESTART_POLICY if self.options.persist else None,
            hint=(f"Hint: `docker logs {self.container}` on {node.name} says why llama-server "
                  "exited (the GGUF file, memory, the --rpc servers)."))

    def rpc_ids(self, ctx: NodeContext) -> list[str]:
        """The running rpc-server containers' IDs, from the phase's (fresh) facts."""
        ids = []
        for node in self.nodes[1:]:
            found = DockerContainer(self.container).read(ctx.cluster_facts.get(node) or NodeFacts(node),
                                                 strict=False)
            ids.append(found.id or "none" if found else "none")
        return ids


def rpc_spec_for(spec: ServeSpec):  # type: ignore[no-untyped-def]
    def spec_for(ctx: NodeContext) -> ContainerSpec | None:
        if ctx.node.name not in spec.nodes[1:]:
            return None
        return spec.rpc_spec(ctx.node)
    return spec_for


def server_spec_for(spec: ServeSpec):  # type: ignore[no-untyped-def]
    def spec_for(ctx: NodeContext) -> ContainerSpec | None:
        if ctx.node.name != spec.first:
            return None
        return spec.server_spec(ctx.node, containers.node_hf_cache(ctx), spec.rpc_ids(ctx))
    return spec_for




class RpcReachable(Step):
    """From the first node, a real TCP connection to every rpc-server, before llama-server
    loads anything: an unreachable one is named (node, address and port), and the server's
    containers are removed (no half-started server stays behind)."""

    name = "rpc-reachable"
    kind = "verify"
    scope = "head"

    def __init__(self, spec: ServeSpec) -> None:
        self.spec = spec

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        import json

        endpoints = self.spec.rpc_endpoints()
        if not endpoints:
            return "one node: no rpc-server"
        from orchestrator.node import script

        command = f"python3 -c {quote(script('connect.py'))} {CONNECT_SECONDS} {join(endpoints)}"
        result = ctx.transports[self.spec.first].run(command, timeout=60 + 5 * len(endpoints),
                                                     display="connect to every rpc-server")
        try:
            answers = json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            answers = {e: result.stderr.strip()[:200] or "no answer" for e in endpoints}
        bad = [(node, e, answers.get(e)) for node, e in zip(self.spec.nodes[1:], endpoints, strict=True)
               if answers.get(e) != "ok"]
        if bad:
            servers.stop_server(ctx.transports, ctx.inventory,
                                servers.unrecorded(self.spec.name, "llamacpp", self.spec.nodes))
            named = "; ".join(f"{node}: rpc-server at {e} ({why})" for node, e, why in bad)
            raise SparkctlError(
                f"{self.spec.first} cannot reach {named}: llama-server was not started (it "
                f"would fail loading the layers it sends there); {self.spec.name}'s containers "
                "were removed. Fix: check the fabric link (`sparkctl netcheck`, `sparkctl "
                "status`) and that nothing else holds the port on that node")
        return f"{self.spec.first} reaches rpc-server at {', '.join(endpoints)}"


class ServerContainer(containers.Container):
    """llama-server's container; one that exits right after it starts (the port taken, the
    GGUF unreadable) takes the server's other containers with it and says llama.cpp's own
    error (the `E` lines name the port or the file)."""

    batch = True  # its one command (docker run + the wait), judged by `done` alone
    timeout = containers.READY_DEADLINE + 120

    def __init__(self, spec: ServeSpec) -> None:
        super().__init__(server_spec_for(spec), name="llama-server")
        self.spec = spec

    def done(self, ctx: NodeContext, change: Change, results: list[Any]) -> str | None:
        from orchestrator.engines.llamacpp.ready import errors

        try:
            return super().done(ctx, change, results)
        except SparkctlError as exc:
            said = errors("\n".join(line.removeprefix("  | ") for line in str(exc).splitlines()))
            servers.stop_server(ctx.transports, ctx.inventory,
                                servers.unrecorded(self.spec.name, "llamacpp", self.spec.nodes))
            raise SparkctlError(
                f"{ctx.node.name}: llama-server exited right after it started"
                + (f": {'; '.join(said)}" if said else f" ({exc})")
                + f"; {self.spec.name}'s containers were removed") from None


class ColdStart:
    """Why a node needs no page-cache drop before its container starts (None: a cold start)."""

    def __init__(self, spec: ServeSpec, step: containers.Container, nodes: list[str]) -> None:
        self.spec, self.step, self.nodes = spec, step, nodes

    def __call__(self, ctx: NodeContext) -> str | None:
        if ctx.node.name not in self.nodes:
            return "no llama.cpp process here"
        if self.spec.options.skip_drop_caches:
            return "skipped (--no-drop-caches)"
        if not isinstance(self.step.check(ctx), Change):
            return "already running: no cold start"
        return None


def facts_for(spec: ServeSpec):  # type: ignore[no-untyped-def]
    from orchestrator.phases.registry import with_probe

    def facts(inv: Inventory, node: Node) -> dict[str, Any]:
        own = containers.spec_facts([spec.recipe.image], [spec.container], inv.cluster.user)
        # llama.cpp's containers get no NCCL/UCX environment (its RPC layer split is plain TCP
        # on the fabric address): the RoCE ports are not asked for
        own.pop("ibdev2netdev", None)
        own["files"].pop(INFINIBAND, None)
        own["commands"]["servers"] = servers.servers_cmd(inv, node, probe=True)
        if spec.key is not None:
            own.setdefault("files", {}).update(apikey.key_facts(spec.name)["files"])
        return with_probe(own, spec.recipe.image if node.name in spec.nodes else None)
    return facts


def rpc_phase(spec: ServeSpec) -> Phase:
    from orchestrator.phases.image_share import image_steps
    from orchestrator.phases.memory import DropCaches
    from orchestrator.phases.models import ServingPhase

    container = containers.Container(rpc_spec_for(spec), name="rpc-server")
    steps: list[Step] = [*image_steps(lambda ctx: spec.recipe.image, lambda ctx: spec.nodes),
                         DropCaches(ColdStart(spec, container, spec.nodes[1:])),
                         node_guard(spec, spec.nodes[1:], container), container,
                         RpcReachable(spec)]
    return ServingPhase("rpc", steps, facts_for(spec), serving=ordered(spec))


def serve_phase(spec: ServeSpec, ready: list[Step]) -> Phase:
    from orchestrator.engines.placed import Record
    from orchestrator.phases.memory import DropCaches
    from orchestrator.phases.models import ServingPhase

    container = ServerContainer(spec)
    # the key file first: the four steps after it are one command on the first node (a batch:
    # core/batch.py), the key (on stdin, never in a command) is not
    steps: list[Step] = [apikey.key_files_step(spec.name, [spec.first], spec.key),
                         DropCaches(ColdStart(spec, container, [spec.first])),
                         node_guard(spec, [spec.first], container), container,
                         Record(spec), *ready]
    return ServingPhase("serve", steps, facts_for(spec), serving=ordered(spec))


def node_guard(spec: ServeSpec, nodes: list[str], container: Step) -> Step:
    """The memory guard on each of NODES before its llama.cpp container loads layers: on a node
    that falls under the threshold it docker-stops the container and records why (status)."""
    from orchestrator.phases.memory import NodeGuard, guard_threshold

    def running(ctx: NodeContext) -> str | None:
        return None if isinstance(container.check(ctx), Change) else "already running (with its guard)"

    return NodeGuard(nodes, servers.record_dir(spec.name), [spec.container],
                     guard_threshold(spec.options.guard_min_available_gb, spec.recipe), running)


def ordered(spec: ServeSpec) -> list[str]:
    head = spec.inventory.head_name
    return [head, *(n for n in spec.nodes if n != head)]


def preview(recipe: Recipe) -> list[str]:
    rpc = [f"<rank {n} fabric IP>:{recipe.rpc_port}" for n in range(1, recipe.node_count)]
    return server_argv(recipe, DEFAULT_HOST, rpc)
