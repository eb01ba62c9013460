"""The engines sparkctl can serve with, and recipes: which engine, which model, how.

Adding an engine: a folder orchestrator/engines/NAME/ whose package exposes `ENGINE` (see
base.Engine); REGISTRY finds it. Recipes are YAML files; built-in ones live in each
engine's recipes/ folder, users pass their own by path. `engine:` picks the engine (default
trtllm, so recipes written before there were several engines keep working).
"""

from __future__ import annotations

import hashlib
import importlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import InputError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from orchestrator.engines.base import Engine, UpContainer
    from orchestrator.inventory import Inventory
    from orchestrator.recipe import BaseRecipe

ENGINES_DIR = Path(__file__).parent
DEFAULT_ENGINE = "trtllm"
"""The engine of a recipe (and a server record) that names none: recipes written before there
were several engines keep working."""


def _engine_folders() -> dict[str, str]:
    """Every package folder here is an engine (its __init__.py exposes ENGINE): adding one is
    adding its folder, nothing else names it."""
    return {path.name: f"{__name__}.{path.name}" for path in sorted(ENGINES_DIR.iterdir())
            if (path / "__init__.py").is_file()}


REGISTRY = _engine_folders()
"""engine name -> the package whose ENGINE implements it (imported on first use)."""


def get_engine(name: str) -> Engine:
    if name not in REGISTRY:
        raise InputError(f"unknown engine {name!r}; sparkctl serves with: {', '.join(sorted(REGISTRY))}")
    engine: Engine = importlib.import_module(REGISTRY[name]).ENGINE
    return engine


def ready_lines() -> dict[str, str]:
    """Each engine's ready line, by engine name: what the node scripts look for in its logs."""
    return {name: get_engine(name).readiness.ready_line for name in sorted(REGISTRY)}


def server_containers(server: str) -> set[str]:
    """The containers a server of that name may run in, whichever engine (OwnContainers)."""
    from orchestrator.engines import capabilities

    return {c for name in REGISTRY for c in capabilities.containers(get_engine(name), server)}


def settings_type(name: str) -> type[BaseModel]:
    """The model of the engine's section of the inventory's `engines:`: `Settings` in its
    folder's settings.py (TensorRT-LLM's `up` container), else capabilities.NoSettings. Read
    without building the engine: every inventory load validates every section it names, and
    a command then imports only the engines it uses."""
    if (ENGINES_DIR / name / "settings.py").is_file():
        found: type[BaseModel] = importlib.import_module(f"{REGISTRY[name]}.settings").Settings
        return found
    from orchestrator.engines.capabilities import NoSettings

    return NoSettings


def up_container(inventory: Inventory) -> UpContainer | None:
    """The container `up` keeps on every node for an engine the inventory serves, or None
    (an inventory naming only engines that bring their own containers at launch)."""
    from orchestrator.engines import capabilities

    for name in inventory.served_engines:
        found = capabilities.up_container(get_engine(name), inventory)
        if found is not None:
            return found
    return None


def process_words() -> list[str]:
    """Every engine's server-process words (status: which pid files are a server's)."""
    from orchestrator.engines import capabilities

    return sorted({word for name in REGISTRY
                   for word in capabilities.process_words(get_engine(name))})


def recipe_files() -> dict[str, Path]:
    """Built-in recipes by name, from every registered engine's recipes/ folder."""
    found: dict[str, Path] = {}
    for name in sorted(REGISTRY):
        for path in sorted((ENGINES_DIR / name / "recipes").glob("*.yml")):
            found[path.stem] = path
    return found


def recipe_origin(recipe: Any) -> dict[str, str]:
    """What a server's record says of a recipe the user gave as a file ({"recipe_file": its
    absolute path}; nothing for a built-in one): `advise --measure` restores the server from
    that file and `status` names it in its relaunch hint, never the built-in of the same name."""
    source = Path(str(getattr(recipe, "source", "") or ""))
    if not source.is_file() or source.resolve() in {p.resolve() for p in recipe_files().values()}:
        return {}
    return {"recipe_file": str(source.resolve())}


def builtin_names() -> list[str]:
    return sorted(recipe_files())


def user_recipes_dir() -> Path:
    """The user's own recipes (imported or hand-written): $XDG_CONFIG_HOME/sparkctl/recipes,
    ~/.config/sparkctl/recipes by default (the XDG base directory specification)."""
    import os

    base = os.environ.get("XDG_CONFIG_HOME") or ""
    root = Path(base) if Path(base).is_absolute() else Path.home() / ".config"
    return root / "sparkctl" / "recipes"


def user_recipe_files() -> dict[str, Path]:
    """The user's recipes by name (the file's stem); a built-in name is the built-in's."""
    folder = user_recipes_dir()
    if not folder.is_dir():
        return {}
    builtin = recipe_files()
    return {path.stem: path for pattern in ("*.yml", "*.yaml") for path in sorted(folder.glob(pattern))
            if path.stem not in builtin and path.is_file()}


def recipe_names() -> list[str]:
    """Every recipe `launch NAME` finds: the built-in ones and the user's."""
    return sorted({*recipe_files(), *user_recipe_files()})


def load_recipe(name_or_path: str) -> Any:
    """A built-in recipe by name, or a recipe file by path; errors name the file and key."""
    from pydantic import ValidationError

    from orchestrator.yamlio import load_yaml_mapping

    path = Path(name_or_path).expanduser()
    if not (path.suffix in (".yml", ".yaml") or "/" in name_or_path):
        found = recipe_files().get(name_or_path) or user_recipe_files().get(name_or_path)
        if found is None:
            mine = sorted(user_recipe_files())
            raise InputError(
                f"no recipe named {name_or_path!r}; built in: {', '.join(builtin_names())}; "
                + (f"yours ({user_recipes_dir()}): {', '.join(mine)} " if mine else
                   f"none of yours in {user_recipes_dir()} ")
                + "(or pass the path of a recipe file)"
            )
        path = found
    data = load_yaml_mapping(path, "recipe")
    engine_name = data.get("engine", DEFAULT_ENGINE)
    if not isinstance(engine_name, str) or engine_name not in REGISTRY:  # ([] or {}: unhashable)
        raise InputError(f"{path}: invalid recipe:\n  engine: {engine_name!r} is not an engine "
                         f"sparkctl knows; use one of: {', '.join(sorted(REGISTRY))}")
    engine = get_engine(str(engine_name))
    try:
        return engine.recipe_type.model_validate({**data, "engine": engine_name, "source": str(path)})
    except ValidationError as exc:
        raise InputError(explain(path, exc)) from None


def explain(path: Path, exc: Any) -> str:
    lines = [f"{path}: invalid recipe:"]
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "literal_error":
            message = f"{message} (got {error.get('input')!r})"
        elif error["type"] == "string_pattern_mismatch" and str(error["loc"][-1]).endswith("revision"):
            message = (f"{error.get('input')!r} is not a revision: a branch, tag or commit "
                       "of letters, digits, '.', '_', '-' starting with a letter or digit (never a path), "
                       "or refs/pr/N")
        lines.append(f"  {where}: {message}")
    return "\n".join(lines)


def engine_of(recipe: BaseRecipe) -> Engine:
    return get_engine(recipe.engine)


def check_against_inventory(recipe: BaseRecipe, inventory: Inventory) -> None:
    """Refuse (exit 2) a recipe this cluster cannot run."""
    if recipe.placement:
        known = [n.name for n in inventory.nodes]
        unknown = [n for n in recipe.placement if n not in known]
        if unknown or len(set(recipe.placement)) != len(recipe.placement):
            raise InputError(f"recipe {recipe.name}: nodes {', '.join(recipe.placement)}: "
                             + (f"{', '.join(unknown)} not in the inventory {inventory.source} "
                                if unknown else "a node is named twice ")
                             + f"(nodes: {', '.join(known)})")
        if len(recipe.placement) != recipe.node_count:
            raise InputError(f"recipe {recipe.name} needs {recipe.node_count} node(s) but is "
                             f"placed on {len(recipe.placement)}: {', '.join(recipe.placement)}")
    if recipe.node_count > len(inventory.nodes):
        raise InputError(
            f"recipe {recipe.name} needs {recipe.node_count} nodes but the inventory "
            f"{inventory.source} has {len(inventory.nodes)}: "
            f"{', '.join(n.name for n in inventory.nodes)}"
        )
    if not inventory.serves(recipe.engine):
        raise InputError(f"recipe {recipe.name} is served by {engine_of(recipe).title}, which the "
                         f"inventory {inventory.source} does not list under engines: (it lists "
                         f"{', '.join(inventory.served_engines)}); add `{recipe.engine}: {{}}` "
                         "there and run `sparkctl up`")
    from orchestrator.recipe import serving_nodes

    nodes = serving_nodes(recipe, inventory)
    problem = engine_of(recipe).placement_problem(recipe, nodes, inventory)
    if problem:
        raise InputError(f"recipe {recipe.name} on {', '.join(nodes)}: {problem}")


def default_placement(recipe: Any, inventory: Inventory) -> Any:
    """The recipe without `placement` when it names the default nodes (the head and the next):
    the same server as one launched without --nodes, so its configuration hash is the same
    (a relaunch, e.g. bench --sweep's restore, is then a no-op, not a replacement)."""
    default = [n.name for n in inventory.ordered_nodes()[: recipe.node_count]]
    if recipe.placement and list(recipe.placement) == default:
        return recipe.model_copy(update={"placement": None})
    return recipe


def config_hash(recipe: BaseRecipe, argv: list[str], config_text: str) -> str:
    """What makes a running server the same server: relaunching an equal one is a no-op."""
    canonical = json.dumps(
        {"recipe": recipe.model_dump(mode="json"), "argv": argv, "config": config_text},
        sort_keys=True,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
