"""The `Engine` seam and what engines share beyond the recipe vocabulary (orchestrator/recipe.py,
below phases): the `up` container's record, a failed launch, the common rank rules.

An engine (TensorRT-LLM over MPI, vLLM over Ray, SGLang, llama.cpp) is one folder under
orchestrator/engines/ with one `ENGINE` object implementing the small core `Engine`, plus the
capabilities it has (engines/capabilities.py); REGISTRY (engines/__init__.py) finds it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Generic, Protocol, TypeVar

from pydantic import AfterValidator

from orchestrator.errors import SparkctlError
from orchestrator.recipe import SPARK_MEMORY_GB, BaseRecipe, LaunchOptions, MemoryEstimate, Verdict
from orchestrator.remote.gathered import NodeFacts

if TYPE_CHECKING:
    from orchestrator.core.step import NodeContext, Phase
    from orchestrator.engines.readiness import Readiness
    from orchestrator.inventory import ContainerSettings, Inventory, Node
    from orchestrator.netcheck.results import CheckResult
    from orchestrator.phases.container import ContainerSpec


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
    expected_env: Callable[[Inventory, NodeFacts | None], dict[str, str]]
    """The variables netcheck compares with what the running container has (from the node's
    facts: which interfaces carry traffic, where its launcher finds its hostfile)."""
    node_checks: tuple[Callable[[Inventory, Node, NodeFacts], list[CheckResult]], ...] = ()
    """netcheck's own checks of what it depends on (its hostfile), per node."""


Part = TypeVar("Part")


class FolderPart(Generic[Part]):
    """A part of an engine kept in a module of the engine's own folder (recipe.py, layouts.py,
    importer.py, meter.py), imported when first read: `up` and every launch build every engine
    they list (for its ready line and process words), and only a recipe read, `advise`,
    `recipes import` or `bench` needs these. `make` builds an instance (a layouts or importer
    object) where the part is a class used as one."""

    def __init__(self, module: str, name: str, *, make: bool = False) -> None:
        self.module, self.name, self.make = module, name, make

    def __get__(self, engine: object, owner: type) -> Part:
        package = owner.__module__.rpartition(".")[0]  # orchestrator.engines.NAME
        found = getattr(importlib.import_module(f"{package}.{self.module}"), self.name)
        part: Part = found() if self.make else found
        return part


class LaunchFailed(SparkctlError):
    """The server did not come up; `details` holds every node's log tail (long, for the notes)."""

    def __init__(self, reason: str, details: str) -> None:
        super().__init__(f"{reason}\n{details}")
        self.reason = reason
        self.details = details


@dataclass
class Ready:
    seconds: float
    models: list[str]
    marked: bool = False
    """Its record's ready_at is set already (the node's wait set it)."""


class Engine(Protocol):
    """One serving engine: the small core every engine has. What only some engines have is a
    separate capability (engines/capabilities.py) the shared code asks for with isinstance.
    Pure where it can be: phases are built without any remote call."""

    name: str
    """The `engine:` value of its recipes."""
    title: str
    """How people call it (TensorRT-LLM, vLLM, SGLang, llama.cpp)."""
    recipe_type: type[BaseRecipe]
    readiness: Readiness
    """When its server serves, as data (engines/readiness.py): the paths that must answer, its
    ready log line, the first wait and the poll interval, and how a dead rank shows."""

    def model_image(self, recipe: BaseRecipe, inventory: Inventory) -> str:
        """The image whose `hf` and python3 fetch, hash and copy the recipe's models (in a
        short-lived container per command, phases/model_tools.py): the image that serves."""
        ...

    def placement_problem(self, recipe: BaseRecipe, nodes: list[str],
                          inventory: Inventory) -> str | None:
        """Why the recipe cannot run on these nodes (rank order), in the engine's own rank
        rules (tp x pp against the node count, where its first rank must be), or None.
        Checked before anything runs, for the default nodes and for --nodes / `placement`."""
        ...

    def launch_phases(self, recipe: BaseRecipe, inventory: Inventory,
                      options: LaunchOptions) -> list[Phase]:
        """The engine's part of the plan of `launch` (cli/launch_plan.py adds the shared checks),
        built without any remote call: this server judged against the others (from facts),
        models on the serving nodes, the server started, then verify steps that wait for
        readiness over HTTP and send one real request."""
        ...

    def estimate_memory(self, recipe: BaseRecipe,
                        node_memory_gb: float = SPARK_MEMORY_GB) -> MemoryEstimate:
        ...

    def describe(self, recipe: BaseRecipe) -> list[tuple[str, str]]:
        """(title, text) sections `recipes show` prints: config files and the serve command."""
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


EnvVars = Annotated[dict[str, str], AfterValidator(check_env_names)]
"""A recipe's `env:` (vLLM, SGLang, llama.cpp): checked by check_env_names."""
