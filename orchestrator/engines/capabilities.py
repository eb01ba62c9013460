"""What an engine MAY have beyond the Engine core (engines/base.py): one small typed protocol
per capability. The shared code asks for one with `isinstance` (or the helpers below, which
also say what an engine without it means), so an engine implements only what it has and never
a member that does nothing.

| capability | who has it | what the shared code does with it |
| --- | --- | --- |
| `TakesApiKey` | every engine today | launch --api-key-file; without it launch refuses a key |
| `MetersDrafting` | every engine today | bench's speculative-decoding figures from /metrics |
| `OwnContainers` | vLLM, SGLang, llama.cpp | `down --server` drops their restart policy |
| `LabelsLogs` | vLLM, SGLang, llama.cpp | `logs`: its own server containers' label |
| `RecordsPids` | TensorRT-LLM, vLLM | status: whose pid files are a server's |
| `ProbesStatus` | vLLM | its own `status` probe in the server's container, and its verdict |
| `UpStage` | TensorRT-LLM | phases `up` adds and the container they keep |
| `Warns` | TensorRT-LLM, llama.cpp | launch's warnings about a recipe |
| `PreviewsConfig` | every engine today | `recipes show --json`'s engine part |
| `Advisable` | every engine today | `sparkctl advise` (engines/layouts.py) |
| `Imports` | vLLM, SGLang, llama.cpp | `recipes import` (engines/importing.py) |
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from orchestrator.records import ServerRecord
from orchestrator.remote.fact_records import CommandResult

if TYPE_CHECKING:
    from orchestrator.core.step import Phase
    from orchestrator.engines.apikey import KeyWay
    from orchestrator.engines.base import UpContainer
    from orchestrator.engines.import_job import RecipeImporter
    from orchestrator.engines.layouts import LayoutSupport
    from orchestrator.engines.meters import SpecMeter
    from orchestrator.inventory import Inventory
    from orchestrator.recipe import BaseRecipe


class NoSettings(BaseModel):
    """The inventory section of an engine without a settings.py (engines/__init__.py
    settings_type): `engines: {NAME: {}}`."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


@runtime_checkable
class TakesApiKey(Protocol):
    api_key: KeyWay
    """How its server takes `launch --api-key-file`'s key (engines/apikey.py): the engine's
    own mechanism, or sparkctl's key-checking relay in front, and what it leaves open."""


@runtime_checkable
class MetersDrafting(Protocol):
    spec_meter: type[SpecMeter]
    """How its /metrics gives a benchmark cell's speculative-decoding figures (engines/meters.py)."""


@runtime_checkable
class OwnContainers(Protocol):
    def containers(self, server: str) -> list[str]:
        """The containers of its server SERVER (its own, not `up`'s): `down --server` drops
        their restart policy; server "" gives fixed names `down` still inspects, if any."""
        ...


@runtime_checkable
class LabelsLogs(Protocol):
    log_label: str
    """The label `sparkctl logs` gives its own server containers' lines (sparkctl.engine=NAME)."""


@runtime_checkable
class RecordsPids(Protocol):
    process_words: tuple[str, ...]
    """Words of its server processes' command lines: `status` counts a recorded pid file as
    the server's only when its command line has one of them."""


@runtime_checkable
class ProbesStatus(Protocol):
    def status_probe(self) -> tuple[str, str]:
        """(key, a Python program) `status` runs in the recorded server's container."""
        ...

    def judge_probe(self, server: ServerRecord, answer: CommandResult | None) -> dict[str, Any]:
        """That program's answer judged for `status` ("problem" when something is wrong)."""
        ...


@runtime_checkable
class UpStage(Protocol):
    def up_phases(self, inventory: Inventory) -> list[Phase]:
        """Phases `up` adds after the shared ones for a cluster that serves this engine."""
        ...

    def up_container(self, inventory: Inventory) -> UpContainer | None:
        """The container its `up` phases keep on every node (None: the inventory does not
        serve it)."""
        ...


@runtime_checkable
class Warns(Protocol):
    def warnings(self, recipe: BaseRecipe) -> list[str]:
        """Things about the recipe a user should know before launching (not errors)."""
        ...


@runtime_checkable
class PreviewsConfig(Protocol):
    def config_preview(self, recipe: BaseRecipe) -> dict[str, object]:
        """What `recipes show --json` adds for this engine (its generated configuration)."""
        ...


@runtime_checkable
class Advisable(Protocol):
    layouts: LayoutSupport
    """`sparkctl advise`: its layouts on N nodes, a recipe as one server of a layout, its
    decode efficiency and the published figures it is fitted to (engines/layouts.py)."""


@runtime_checkable
class Imports(Protocol):
    importer: RecipeImporter
    """`sparkctl recipes import`: the community recipes of this engine made its recipes
    (engines/NAME/importer.py, engines/import_job.py)."""


# ------------------------------------------------- what an engine without one of them means
def api_key_way(engine: object) -> KeyWay | None:
    """None: the engine takes no key, and launch refuses --api-key-file (exit 2)."""
    return engine.api_key if isinstance(engine, TakesApiKey) else None


def spec_meter(engine: object) -> type[SpecMeter] | None:
    """None: bench reads no speculative-decoding figures (meters.SpecMeter reads nothing)."""
    return engine.spec_meter if isinstance(engine, MetersDrafting) else None


def containers(engine: object, server: str) -> list[str]:
    return engine.containers(server) if isinstance(engine, OwnContainers) else []


def log_label(engine: object) -> str:
    return engine.log_label if isinstance(engine, LabelsLogs) else ""


def process_words(engine: object) -> tuple[str, ...]:
    return engine.process_words if isinstance(engine, RecordsPids) else ()


def up_phases(engine: object, inventory: Inventory) -> list[Phase]:
    return engine.up_phases(inventory) if isinstance(engine, UpStage) else []


def up_container(engine: object, inventory: Inventory) -> UpContainer | None:
    return engine.up_container(inventory) if isinstance(engine, UpStage) else None


def warnings(engine: object, recipe: BaseRecipe) -> list[str]:
    return engine.warnings(recipe) if isinstance(engine, Warns) else []


def config_preview(engine: object, recipe: BaseRecipe) -> dict[str, object]:
    return engine.config_preview(recipe) if isinstance(engine, PreviewsConfig) else {}
