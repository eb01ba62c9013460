"""Recipes in the community's own formats, read as their tools read them (`recipes import`).

Two formats, both YAML with a serve command template:
- sparkrun (spark-arena/sparkrun, src/sparkrun/core/recipe.py): `model`, `runtime`,
  `min_nodes`/`max_nodes`, `container`, `defaults`, `env`, `metadata`, `command`. The template's
  `{key}` placeholders come from `defaults` plus `model`, substituted until nothing changes;
  a placeholder with no value is left as it is; `\\ ` before a line end is read as `\\`.
- eugr (eugr/spark-vllm-docker, run-recipe.py): `recipe_version`, `name`, `container` and
  `command` required; `description`, `model`, `mods`, `build_args`, `defaults`, `env`,
  `cluster_only`, `solo_only`. The template is Python's `str.format(**defaults)`: literal braces
  are doubled, a placeholder with no default is an error.
Version-1 sparkrun recipes are eugr's format (sparkrun routes them to its eugr runtime).
What is read here is only the file: nothing is fetched, no environment variable expanded.
"""

from __future__ import annotations

import re
import shlex
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from orchestrator.errors import InputError

Format = Literal["sparkrun", "eugr"]
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_TRAILING_SPACE_CONTINUATION = re.compile(r"\\ +\n")
_SHELL_OPERATORS = {"&&", "||", ";", "|", "&", ">", ">>", "<"}
_ENV_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# sparkrun's and eugr's fields that sparkctl has no place for: a recipe using them is refused
# (what they do would silently not happen); `mods` is judged by the importer (an empty list is fine)
UNSUPPORTED = {
    "pre_exec": "commands run in every container before the server (sparkctl runs none)",
    "post_exec": "commands run in the head container once the server answers",
    "post_commands": "commands run on the control machine once the server answers",
    "build_args": "arguments of eugr's local image build (sparkctl pulls images, it builds none)",
    "builder": "a builder plugin that makes the image locally",
    "builder_config": "a builder plugin that makes the image locally",
}


@dataclass
class ForeignRecipe:
    """One community recipe, its command rendered and split into words as bash would."""

    path: Path
    format: Format
    name: str
    description: str
    model: str
    revision: str | None
    runtime: str  # sparkrun's `runtime` as written ("" when left out); eugr: ""
    container: str
    min_nodes: int
    max_nodes: int | None
    defaults: dict[str, Any]
    metadata: dict[str, Any]
    mods: list[str]
    env: dict[str, str]
    argv: list[str]  # the rendered command's words, the leading VAR=value words taken out
    unsupported: dict[str, str] = field(default_factory=dict)  # field -> what it does

    @property
    def label(self) -> str:
        return f"{self.format} recipe {self.path}"


def read(path: Path) -> ForeignRecipe:
    """The recipe at `path`, or an InputError naming the file and what is wrong (exit 2)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InputError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
        raise InputError(f"{path}: not valid YAML{at}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a recipe is a YAML mapping; this file holds "
                         f"{type(data).__name__}")
    kind = detect(path, data)
    defaults = _mapping(path, data, "defaults")
    command = data.get("command")
    if not isinstance(command, str) or not command.strip():
        raise InputError(f"{path}: `command` is missing or empty: the import reads the serve "
                         "command template (sparkrun builds one from `defaults` when it is left "
                         "out; write the command into the recipe to import it)")
    model = str(data.get("model") or "")
    if kind == "eugr":
        rendered = _format_eugr(path, command, defaults)
    else:
        rendered = _substitute_sparkrun(command, {**defaults, "model": model})
    env = {str(k): "" if v is None else str(v) for k, v in _mapping(path, data, "env").items()}
    words, leading_env = split_command(path, rendered)
    min_nodes = _int(path, data, "min_nodes", 1)
    max_nodes = data.get("max_nodes")
    if data.get("cluster_only"):
        min_nodes = max(min_nodes, 2)
    if data.get("solo_only") or data.get("mode") == "solo":
        max_nodes = 1
    mods = data.get("mods") or []
    if not isinstance(mods, list):
        raise InputError(f"{path}: `mods` must be a list, got {type(mods).__name__}")
    raw_metadata = data.get("metadata")
    metadata: dict[str, Any] = raw_metadata if isinstance(raw_metadata, dict) else {}
    return ForeignRecipe(
        path=path, format=kind,
        name=str(data.get("name") or path.stem),
        description=str(data.get("description") or metadata.get("description") or "").strip(),
        model=model, revision=_str_or_none(data.get("model_revision")),
        runtime=str(data.get("runtime") or "") if kind == "sparkrun" else "",
        container=str(data.get("container") or ""), min_nodes=min_nodes,
        max_nodes=int(max_nodes) if isinstance(max_nodes, int) else None,
        defaults=defaults, metadata=metadata, mods=[str(m) for m in mods],
        env={**env, **leading_env}, argv=words,
        unsupported={key: what for key, what in UNSUPPORTED.items() if data.get(key)},
    )


def detect(path: Path, data: dict[str, Any]) -> Format:
    """eugr's format has `recipe_version: "1"` and its four required fields; sparkrun's has a
    `model` and a runtime, container or command. Anything else is neither: exit 2."""
    version = str(data.get("recipe_version", data.get("sparkrun_version", "")))
    eugr_fields = [k for k in ("name", "container", "command") if k not in data]
    if version == "1":
        if eugr_fields:
            raise InputError(f"{path}: an eugr recipe (recipe_version 1) without "
                             f"{', '.join(eugr_fields)} (run-recipe.py requires name, "
                             "recipe_version, container and command)")
        return "eugr"
    if data.get("model") and any(data.get(k) for k in ("runtime", "container", "command")):
        return "sparkrun"
    raise InputError(f"{path}: neither a sparkrun recipe (`model` with `runtime`, `container` "
                     "or `command`) nor an eugr recipe (`recipe_version: \"1\"`, `name`, "
                     "`container`, `command`); a sparkctl recipe is launched as it is: "
                     f"`sparkctl launch {path}`")


def _format_eugr(path: Path, command: str, defaults: dict[str, Any]) -> str:
    """run-recipe.py's `command.format(**params)`: `{{`/`}}` are literal braces, every other
    field must be a default (attribute and index fields are refused: they are never needed)."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(command) if f is not None]
    except ValueError as exc:
        raise InputError(f"{path}: command: {exc} (eugr's template is Python's str.format: "
                         "write a literal brace as {{ or }})") from None
    for name in fields:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise InputError(f"{path}: command: placeholder {{{name}}} is not a plain name "
                             "(write a literal brace as {{ or }})")
        if name not in defaults:
            raise InputError(f"{path}: command: placeholder {{{name}}} has no value in "
                             f"`defaults` (it has: {', '.join(sorted(defaults)) or 'nothing'})")
    return command.format(**{k: _template_value(v) for k, v in defaults.items()})


def _substitute_sparkrun(command: str, values: dict[str, Any]) -> str:
    text = command.strip()
    for _ in range(20):  # nested references resolve in a few rounds; a cycle stops here
        after = _PLACEHOLDER.sub(lambda m: _template_value(values[m.group(1)])
                                 if m.group(1) in values else m.group(0), text)
        if after == text:
            break
        text = after
    return _TRAILING_SPACE_CONTINUATION.sub("\\\n", text)


def _template_value(value: Any) -> str:
    return "" if value is None else str(value)


def split_command(path: Path, rendered: str) -> tuple[list[str], dict[str, str]]:
    """The command's words as bash reads them (line continuations, quotes, comments), with the
    leading `VAR=value` words as environment; a pipeline or command list is refused."""
    try:
        words = shlex.split(rendered.replace("\\\n", " "), comments=True)
    except ValueError as exc:
        raise InputError(f"{path}: command: cannot split it into words as a shell would: "
                         f"{exc}") from None
    operators = [w for w in words if w in _SHELL_OPERATORS]
    if operators:
        raise InputError(f"{path}: command: `{operators[0]}` makes it a shell script, not one "
                         "serve command; sparkctl imports a single server command")
    env: dict[str, str] = {}
    while words and _ENV_WORD.match(words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    if not words:
        raise InputError(f"{path}: command: no program to run")
    return words, env


def _mapping(path: Path, data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key) or {}
    if not isinstance(value, dict):
        raise InputError(f"{path}: `{key}` must be a mapping, got {type(value).__name__}")
    return {str(k): v for k, v in value.items()}


def _int(path: Path, data: dict[str, Any], key: str, default: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{path}: `{key}` must be a whole number of nodes (1 or more), "
                         f"got {value!r}")
    return value


def _str_or_none(value: Any) -> str | None:
    return None if value in (None, "") else str(value)
