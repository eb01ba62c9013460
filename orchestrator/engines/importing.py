"""`sparkctl recipes import`: a sparkrun or eugr recipe made a sparkctl recipe.

The file is read as its own tool reads it (engines/foreign.py); its command picks the engine
(each engine's importer says which commands and sparkrun runtimes are its own), whose option
table parses the command as the engine's argument parser would; the engine maps the options
onto its recipe's fields (engines/NAME/importer.py); the result is validated as every recipe
is, then written with a header saying where it came from and what changed on the way.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import InputError

if TYPE_CHECKING:
    from orchestrator.engines.base import Engine
    from orchestrator.engines.foreign import ForeignRecipe
    from orchestrator.engines.import_job import RecipeImporter

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_SECRETS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


@dataclass
class Imported:
    name: str
    engine: str
    path: Path
    fields: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "engine": self.engine, "path": str(self.path),
                "source": self.source, "warnings": self.notes}


def importers() -> dict[str, RecipeImporter]:
    """engine name -> its importer, for every engine that has one."""
    from orchestrator.engines import REGISTRY, get_engine
    from orchestrator.engines.capabilities import Imports

    found = {}
    for name in sorted(REGISTRY):
        engine = get_engine(name)
        if isinstance(engine, Imports):
            found[name] = engine.importer
    return found


def pick_engine(foreign: ForeignRecipe) -> tuple[Engine, RecipeImporter, list[str]]:
    """The engine whose command this is, and the command's words after the program."""
    from orchestrator.engines import get_engine

    known = importers()
    runtimes = sorted(r for imp in known.values() for r in imp.runtimes)
    if foreign.runtime and foreign.runtime not in runtimes:
        raise InputError(f"{foreign.path}: runtime {foreign.runtime!r} is not one sparkctl can "
                         f"import; it imports the runtimes {', '.join(runtimes)}")
    words = [_program_word(w) if i == 0 else w for i, w in enumerate(foreign.argv)]
    for name, importer in known.items():
        for program in importer.programs:
            if tuple(words[: len(program)]) == program:
                if foreign.runtime and foreign.runtime not in importer.runtimes:
                    raise InputError(f"{foreign.path}: runtime {foreign.runtime!r} but the "
                                     f"command runs {' '.join(program)} "
                                     f"({get_engine(name).title}'s)")
                return get_engine(name), importer, foreign.argv[len(program):]
    commands = "; ".join(" ".join(p) for imp in known.values() for p in imp.programs)
    raise InputError(f"{foreign.path}: command runs `{' '.join(foreign.argv[:3])}`, not a "
                     f"server sparkctl can import (it imports: {commands})")


def _program_word(word: str) -> str:
    base = word.rsplit("/", 1)[-1]
    return "python3" if base == "python" else base


def import_recipe(path: Path, *, out: Path | None, user_dir: Path, name: str | None = None,
                  weights_gb: float | None = None, image: str | None = None,
                  force: bool = False) -> Imported:
    """Read, convert, validate and write; nothing is written unless all of it succeeds."""
    import yaml
    from pydantic import ValidationError

    from orchestrator.engines import builtin_names, explain
    from orchestrator.engines.foreign import read
    from orchestrator.engines.import_job import ImportJob

    foreign = read(path)
    engine, importer, argv = pick_engine(foreign)
    table = importer.table()
    parsed = table.parse(argv)
    if parsed.problems:
        raise InputError(f"{path}: command: " + "; ".join(str(p) for p in parsed.problems))
    _refuse_unsupported(foreign)
    default_image = str(engine.recipe_type.model_fields["image"].default)
    job = ImportJob(foreign, parsed, default_image, weights_gb=weights_gb, image_override=image,
                    notes=[])
    recipe_name = name or _slug((out.stem if out else None) or foreign.path.stem)
    if not NAME.match(recipe_name):
        raise InputError(f"{path}: {recipe_name!r} cannot name a recipe: use --name with "
                         "letters a-z, digits, '.', '_', '-' (up to 63)")
    target = out or user_dir / f"{recipe_name}.yml"
    if out is None and recipe_name in builtin_names():
        raise InputError(f"{path}: {recipe_name!r} is a built-in recipe's name; give the "
                         "import another with --name")
    if target.exists() and not force:
        raise InputError(f"{target} exists; pass --force to replace it")
    if foreign.mods:
        job.refuse(f"mods {', '.join(foreign.mods)}: patches applied to the container before "
                   "it serves; sparkctl has no equivalent (it runs images unchanged): use an "
                   "image that has them, or remove `mods` to import without them")
    fields: dict[str, Any] = {"name": recipe_name, "engine": engine.name,
                              "description": _description(foreign), "model": foreign.model}
    if foreign.revision:
        fields["revision"] = foreign.revision
    fields.update(importer.convert(job))
    env = _env(foreign)
    if env:
        fields["env"] = env
    try:
        recipe = engine.recipe_type.model_validate({**fields, "source": str(target)})
    except ValidationError as exc:
        raise InputError(explain(path, exc).replace("invalid recipe", "imported as an invalid "
                                                    "recipe", 1)) from None
    nodes = recipe.node_count
    if nodes < foreign.min_nodes or (foreign.max_nodes is not None and nodes > foreign.max_nodes):
        job.note(f"the recipe says {foreign.min_nodes}..{foreign.max_nodes or 'any'} nodes; "
                 f"its parallelism asks for {nodes}: sparkctl runs it on {nodes}")
    text = _header(foreign, engine, job.notes) + yaml.safe_dump(fields, sort_keys=False,
                                                                   width=100)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return Imported(recipe_name, engine.name, target, fields, job.notes, str(path))


def _refuse_unsupported(foreign: ForeignRecipe) -> None:
    if foreign.unsupported:
        key, what = next(iter(foreign.unsupported.items()))
        raise InputError(f"{foreign.path}: `{key}`: {what}; sparkctl has no equivalent, so the "
                         "recipe cannot be carried over as it is (remove it to import the rest)")


def _env(foreign: ForeignRecipe) -> dict[str, str]:
    for key, value in foreign.env.items():
        if key in _SECRETS:
            raise InputError(f"{foreign.path}: env {key}: a secret does not belong in a recipe; "
                             "sparkctl passes the token with `launch --hf-token-file`")
        if "$" in value:
            raise InputError(f"{foreign.path}: env {key}: {value!r} is expanded from the "
                             "control machine's environment by sparkrun; sparkctl does not: "
                             "write the value itself")
        if re.search(r"\{[A-Za-z_][A-Za-z0-9_.]*\}", value):
            raise InputError(f"{foreign.path}: env {key}: {value!r} has a placeholder filled "
                             "at launch by sparkrun; sparkctl has no equivalent")
    return dict(foreign.env)


def _description(foreign: ForeignRecipe) -> str:
    text = " ".join(foreign.description.split())
    return (text[:160] + " " if text else "") + f"(imported from {foreign.path.name})"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")[:63]


def _header(foreign: ForeignRecipe, engine: Engine, notes: list[str]) -> str:
    digest = hashlib.sha256(foreign.path.read_bytes()).hexdigest()
    runtime = f", runtime {foreign.runtime}" if foreign.runtime else ""
    lines = [f"Imported by `sparkctl recipes import` from {foreign.path.resolve()}",
             f"({foreign.format} recipe{runtime}; sha256 {digest})",
             f"on {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}, served by {engine.title}.",
             "Flags were checked against the engine's pinned option table."]
    if notes:
        lines.append("Changed on the way:")
        lines += [f"- {note}" for note in notes]
    return "".join(f"# {line}\n" for line in lines)
