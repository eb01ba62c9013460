"""What every engine shares: the recipe fields common to all, and the `Engine` seam.

An engine (TensorRT-LLM over MPI, vLLM over Ray, SGLang) is one folder under
orchestrator/engines/ with one `ENGINE` object implementing `Engine`, and one line in the
registry (engines/__init__.py). Everything engine-specific lives behind this protocol: the
recipe fields (a pydantic model discriminated on `engine:`), the phases `up` and `launch` add,
readiness, the commands `recipes show` prints, and the memory estimate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.engines import DEFAULT_ENGINE
from orchestrator.errors import SparkctlError

if TYPE_CHECKING:
    from orchestrator.commands import Secret
    from orchestrator.core.step import NodeContext, Phase
    from orchestrator.engines.apikey import KeyWay
    from orchestrator.engines.meters import SpecMeter
    from orchestrator.inventory import ContainerSettings, Inventory, Node
    from orchestrator.netcheck.results import CheckResult
    from orchestrator.phases.container import ContainerSpec
    from orchestrator.phases.ports import ListenPort

CONTAINER_HF_HOME = "/root/.cache/huggingface"
"""Where a container sees the node's Hugging Face cache (every engine's container mounts it)."""
SPARK_MEMORY_GB = 128.0
"""A DGX Spark's unified memory, shared by the CPU, the GPU and the page cache."""
REPO_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"
REVISION_PATTERN = r"^(refs/pr/[0-9]{1,9}|[A-Za-z0-9][A-Za-z0-9._-]{0,99})$"
"""A branch, tag or commit; never a path (no `/`, no leading `.`: it names a file under the HF
cache's refs/), except the hub's pull-request refs `refs/pr/N`."""
DEFAULT_HOST = "127.0.0.1"
"""Servers bind to localhost on their node; clients come through SSH (chat, tunnel, bench)."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class NoSettings(StrictModel):
    """The inventory section of an engine that has no settings: `engines: {NAME: {}}`."""


@dataclass(frozen=True)
class UpContainer:
    """A container an engine's `up` phases keep on every node (TensorRT-LLM's, with sshd and
    MPI), and what `netcheck` and `status` judge it by."""

    settings: ContainerSettings
    facts: Callable[[Inventory, Node], dict[str, Any]]
    """What netcheck's judgements read beyond the container and its image (its image's
    records, files it depends on)."""
    spec_facts: Callable[[Inventory, Node], dict[str, Any]]
    """What `spec_for` reads (the container step's facts)."""
    spec_for: Callable[[NodeContext], ContainerSpec]
    """The spec `up` starts it from: `status` compares the config hash (current or stale)."""
    expected_env: Callable[[Inventory, dict[str, Any]], dict[str, str]]
    """The variables netcheck compares with what the running container has (from the node's
    facts: which interfaces carry traffic, where its launcher finds its hostfile)."""
    node_checks: tuple[Callable[[Inventory, Node, dict[str, Any]], list[CheckResult]], ...] = ()
    """netcheck's own checks of what it depends on (its hostfile), per node."""


class Memory(StrictModel):
    weights_gb: float = Field(gt=0, le=4096)
    """Size of the model's weights on disk (all shards), in GB: split across the serving nodes."""
    draft_gb: float = Field(default=0.0, ge=0, le=1024)
    """Size of the draft model, in GB: counted whole on every node."""
    kv_cache_fraction: float = Field(default=0.9, gt=0, le=1)
    """The engine's memory fraction, as its own flag means it: a share of what is left after
    loading, or of the whole memory (docs/engines.md's memory row says which, per engine)."""
    runtime_gb: float = Field(default=6.0, ge=0, le=128)
    """CUDA context, activations, CUDA graphs and the server process (rough)."""
    system_reserve_gb: float = Field(default=8.0, ge=0, le=128)
    """What the OS and page cache need to stay healthy on unified memory."""
    guard_min_available_gb: float | None = Field(default=None, ge=0, le=128)
    """The memory guard stops the server when a serving node's MemAvailable falls below this
    (GB); default 4 (`launch --guard-min-available-gb` overrides it)."""
    parallel_weight_loading: bool = True
    """TensorRT-LLM only: False sets TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL=1 (NVIDIA's fix
    for OOM while loading)."""


class FileFilter(StrictModel):
    """Which of the model repository's files a recipe needs (huggingface_hub's patterns: fnmatch
    on the path in the repo, `*` crosses `/`, a trailing `/` means the whole folder)."""

    allow: list[str] = Field(default_factory=list, max_length=64)
    """Only files matching one of these (empty: every file); `hf download --include`."""
    deny: list[str] = Field(default_factory=list, max_length=64)
    """Never files matching one of these; `hf download --exclude`."""


class BaseRecipe(StrictModel):
    """The fields every engine's recipe has; each engine adds its own and fixes `engine`."""

    engine: str = DEFAULT_ENGINE
    """Which engine serves the recipe: trtllm (default), vllm or sglang."""
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")
    """Recipe name, as `sparkctl launch NAME` uses it."""
    description: str = ""
    model: str = Field(pattern=REPO_PATTERN)
    """Hugging Face id of the model to serve."""
    revision: str = Field(default="main", pattern=REVISION_PATTERN)
    """Branch, tag or commit of the model."""
    nodes: int | None = Field(default=None, ge=1, le=64)
    """Nodes the server spans (head first); default: what the parallelism needs."""
    port: int = Field(default=8000, ge=1024, le=65535)
    """Port the server listens on, on its first node (127.0.0.1 unless --host)."""
    placement: list[str] | None = Field(default=None, min_length=1, max_length=64)
    """Inventory node names the server runs on, rank order (first = where it answers); default:
    the head and the next nodes. `launch --nodes` wins over it. Every engine checks it against
    its rank rules before anything runs (Engine.placement_problem)."""
    memory: Memory
    files: FileFilter | None = None
    """Which files of `model` to download and copy (default: all of them)."""
    persist: bool = False
    """Come back after a node reboot, as `launch --persist` does (docs/operate.md)."""
    source: str = Field(default="<recipe>", exclude=True)

    @property
    def node_count(self) -> int:
        return self.nodes or 1

    @property
    def repos(self) -> list[tuple[str, str, str | None]]:
        """(HF id, revision, local dir or None for the HF cache layout) of every model needed."""
        return [(self.model, self.revision, None)]

    @property
    def drafting(self) -> str | None:
        """How the server drafts tokens for speculative decoding, as `recipes list` says it
        (e.g. "Eagle 5"), or None without speculative decoding; engines that draft override it."""
        return None

    @property
    def draft_tokens(self) -> int | None:
        """Tokens drafted per decoding step (what `advise` models), or None without drafting."""
        return None

    def listen_ports(self, nodes: list[str]) -> list[ListenPort]:
        """The TCP ports the server binds on its `nodes` (rank order), proven free before a
        launch (phases/ports.py): the HTTP port on the first node; engines add theirs."""
        from orchestrator.phases.ports import ListenPort

        return [ListenPort(nodes[0], self.port, "HTTP", "launch with another --port")]

    def file_patterns(self, repo: str) -> tuple[list[str], list[str]]:
        """(allow, deny) for one of `repos`: the recipe's `files` for the main model, all files
        of the others (draft models are small)."""
        if repo == self.model and self.files is not None:
            return list(self.files.allow), list(self.files.deny)
        return [], []


Verdict = Literal["fits", "tight", "does not fit"]


class MemoryEstimate(StrictModel):
    """Per node, in GB, against a Spark's unified memory (a rough guide, said to be one)."""

    weights_gb: float
    draft_gb: float
    runtime_gb: float
    system_reserve_gb: float
    kv_cache_gb: float
    total_gb: float
    free_after_kv_gb: float
    fits: bool
    verdict: Verdict
    explanation: str


@dataclass(frozen=True)
class LaunchOptions:
    """What `sparkctl launch` was asked, beyond the recipe."""

    host: str = DEFAULT_HOST
    replace: bool = False
    drop_caches: bool = True
    timeout: float = 1800.0
    guard_min_available_gb: float | None = None
    name: str | None = None
    """The server's name (default: the recipe's); per-server engines (SGLang) key on it."""
    skip_drop_caches: bool = False
    """--no-drop-caches: per-server engines drop the page cache before a cold start unless set."""
    ignore_memory: bool = False
    persist: bool = False
    """--persist (or the recipe's `persist: true`): the server comes back after a node reboot
    (docker restart policy plus a boot unit per serving node, phases/persist.py)."""
    api_key: Secret | None = None
    """--api-key-file's key (checked, cli/api_key.py): each engine hands it to its server in its
    own way (engines/apikey.py, the engine's `api_key` member); never on argv or in Env."""


class LaunchFailed(SparkctlError):
    """The server did not come up; `details` holds every node's log tail (long, for the notes)."""

    def __init__(self, reason: str, details: str) -> None:
        super().__init__(f"{reason}\n{details}")
        self.reason = reason
        self.details = details


Note = Callable[[str], None]
"""Where progress lines go (stderr in the CLI)."""


@dataclass
class Ready:
    seconds: float
    models: list[str]


class Engine(Protocol):
    """One serving engine. Pure where it can be: phases are built without any remote call."""

    name: str
    """The `engine:` value of its recipes."""
    title: str
    """How people call it (TensorRT-LLM, vLLM, SGLang)."""
    recipe_type: type[BaseRecipe]
    ready_line: str
    """The line its server logs once it serves: with it, a server that stopped answering is
    stalled, not still loading (engines/liveness.py; the node scripts get it as an argument)."""

    spec_meter: type[SpecMeter]
    """How its /metrics gives the speculative-decoding figures of a benchmark cell
    (engines/meters.py; `sparkctl bench`)."""
    log_label: str
    """The label `sparkctl logs` gives the lines of its own server containers (those labelled
    sparkctl.engine=NAME), or "" when it has none of its own."""
    health_paths: tuple[str, str]
    """What `status` probes on the serving node: /health, then the engine's second probe
    (TensorRT-LLM's /health_generate sends a token through every rank; others: /v1/models)."""
    settings_type: type[BaseModel]
    """Its section of the inventory's `engines:` (a pydantic model; NoSettings when it has
    none): `engines: {NAME: {...}}` names the engines a cluster serves."""
    process_words: tuple[str, ...]
    """Words of its server processes' command lines: `status` counts a recorded pid file as
    the server's only when its command line has one of them."""
    several_servers: bool
    api_key: KeyWay | None
    """How its server takes an API key (`launch --api-key-file`, engines/apikey.py): the
    engine's own mechanism, or sparkctl's key-checking relay in front; and what it leaves
    open without the key (the health probes' paths). None: launch refuses a key (exit 2)."""
    """Whether several servers of this engine may run at once (on different nodes, or on one
    node when memory and ports allow). False: one server of the engine per cluster (its
    processes run in one cluster-wide container); a different one is refused or --replace'd."""

    def containers(self, server: str) -> list[str]:
        """The containers of its server SERVER (its own, not `up`'s): `down --server` drops
        their restart policy; server "" gives the engine's fixed container names, if any."""
        ...

    def status_probe(self) -> tuple[str, str] | None:
        """(key, a Python program) `status` runs in the recorded server's container when the
        record is this engine's (vLLM: the nodes its Ray cluster knows), or None."""
        ...

    def judge_probe(self, server: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        """That program's answer judged for `status` (with "problem" when something is
        wrong), shown under the probe's key."""
        ...

    def up_phases(self, inventory: Inventory) -> list[Phase]:
        """Phases `up` adds after the shared ones for a cluster that serves this engine
        (TensorRT-LLM: SSH trust and its hostfile, its container with sshd, MPI)."""
        ...

    def up_container(self, inventory: Inventory) -> UpContainer | None:
        """The container its `up` phases keep on every node, or None."""
        ...

    def model_image(self, recipe: Any, inventory: Inventory) -> str:
        """The image whose `hf` and python3 fetch, hash and copy the recipe's models (in a
        short-lived container per command, phases/model_tools.py): the image that serves."""
        ...

    def placement_problem(self, recipe: Any, nodes: list[str], inventory: Inventory) -> str | None:
        """Why the recipe cannot run on these nodes (rank order), in the engine's own rank
        rules (tp x pp against the node count, where its first rank must be), or None.
        Checked before anything runs, for the default nodes and for --nodes / `placement`."""
        ...

    def launch_phases(self, recipe: Any, inventory: Inventory, options: LaunchOptions) -> list[Phase]:
        """The plan of `launch`, built without any remote call: refuse a different running
        server (judged from facts), models on the serving nodes, the server started, then
        verify steps that wait for readiness over HTTP and send one real request."""
        ...

    def estimate_memory(self, recipe: Any, node_memory_gb: float = SPARK_MEMORY_GB) -> MemoryEstimate:
        ...

    def describe(self, recipe: Any) -> list[tuple[str, str]]:
        """(title, text) sections `recipes show` prints: config files and the serve command."""
        ...

    def warnings(self, recipe: Any) -> list[str]:
        """Things about the recipe a user should know before launching (not errors)."""
        ...

    def config_preview(self, recipe: Any) -> dict[str, object]:
        """What `recipes show --json` adds for this engine (its generated configuration)."""
        ...


def ranks_problem(ranks: int, rule: str, nodes: list[str]) -> str | None:
    """The rule every engine has on a Spark (one GPU each): RANKS ranks, one per node."""
    if ranks == len(nodes):
        return None
    return (f"{rule} = {ranks} rank(s), one per Spark (one GPU each), so it needs {ranks} "
            f"node(s), not {len(nodes)} ({', '.join(nodes)}); name {ranks} node(s) with --nodes "
            "or pick a recipe whose parallelism fits")


def head_first_problem(title: str, how: str, nodes: list[str], inventory: Inventory) -> str | None:
    """Engines whose first rank runs on the head (`up`'s MPI container, the Ray head): the
    nodes must be the head and the next nodes in inventory order."""
    wanted = [n.name for n in inventory.ordered_nodes()[: len(nodes)]]
    if nodes == wanted:
        return None
    return (f"{title} {how}, so its nodes are the head and the next nodes in inventory order: "
            f"{', '.join(wanted)} (not {', '.join(nodes)})")


def verdict_of(left_gb: float, free_gb: float, reserve_gb: float) -> tuple[bool, Verdict]:
    """Shared judgement: what is left after loading must exceed the OS reserve, and what the
    engine's cache leaves must be at least half of it."""
    fits = left_gb > reserve_gb and free_gb >= 0.5 * reserve_gb
    if left_gb <= reserve_gb:
        return False, "does not fit"
    return fits, "fits" if fits else "tight"


def check_env_names(env: dict[str, str]) -> dict[str, str]:
    """A recipe's `env:` (vLLM, SGLang): variable names only, and no secrets (recipes are
    shared and shown; the HF token has its own way in)."""
    import re

    bad = [k for k in env if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", k)]
    secret = [k for k in env if "TOKEN" in k or "SECRET" in k]
    if bad:
        raise ValueError(f"env: {', '.join(bad)} is not an environment variable name")
    if secret:
        raise ValueError(f"env: {', '.join(secret)} looks like a secret; recipes are not "
                         "secret (the HF token comes from $HF_TOKEN or --hf-token-file)")
    return env
