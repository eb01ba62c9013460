"""The recipe vocabulary every layer shares, below phases/ and engines/ (as inventory.py is):
what every engine's recipe has (`BaseRecipe`: model, revision, nodes, port, placement, memory,
files), the nodes a recipe serves on (`serving_nodes`), what `sparkctl launch` was asked beyond
the recipe (`LaunchOptions`), the memory estimate's record, and a port a server binds
(`ListenPort`). Phases take explicit nodes, images and models; engines add their own recipe
fields on `BaseRecipe` (engines/NAME/recipe.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from orchestrator.commands import Secret
    from orchestrator.inventory import Inventory


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

    engine: str
    """Which engine serves the recipe: each engine's recipe model fixes it (the loader,
    engines/__init__.py, reads a recipe that names none as the default engine's)."""
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


Note = Callable[[str], None]
"""Where progress lines go (stderr in the CLI)."""


class ListenPort(NamedTuple):
    """One TCP port a server binds on one node, what it is for, and how to choose another."""

    node: str
    port: int
    what: str
    fix: str
    address: str = "*"
    """The address it binds: "*" for every address; a server bound to 127.0.0.1 shares its port
    number with a listener on another address (the gateway's relay on the fabric address)."""


def serving_nodes(recipe: BaseRecipe, inventory: Inventory) -> list[str]:
    """The nodes the server runs on, in rank order (head first unless placed elsewhere)."""
    if recipe.placement:
        return list(recipe.placement)
    return [n.name for n in inventory.ordered_nodes()[: recipe.node_count]]
