"""Safe YAML loading for user files (inventories, recipes).

User files are small; anything else is a mistake or an attack. We refuse duplicate keys (YAML
silently keeps the last one, which hides typos), oversized files and alias-heavy documents (the
"billion laughs" bomb), and turn every parse problem into an InputError naming file, line and
column.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from orchestrator.errors import InputError
from orchestrator.userfiles import MAX_FILE_BYTES as MAX_FILE_BYTES
from orchestrator.userfiles import file_kind as file_kind
from orchestrator.userfiles import read_user_file as read_user_file

MAX_ALIASES = 200
MAX_EXPANDED_NODES = 100_000


def _expanded_size(value: Any, memo: dict[int, int]) -> int:
    """How many values the document has once aliases are expanded (shared nodes counted each
    time they are referenced), computed in time linear in the distinct nodes."""
    if not isinstance(value, (list, dict)):
        return 1
    key = id(value)
    if memo.get(key) == -1:
        raise yaml.YAMLError("a value contains itself through an alias (recursive anchor)")
    if key not in memo:
        memo[key] = -1
        children = value.values() if isinstance(value, dict) else value
        memo[key] = 1 + sum(_expanded_size(child, memo) for child in children)
    return memo[key]


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys and counts aliases."""

    alias_count = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.alias_count += 1
            if self.alias_count > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise yaml.YAMLError(
                    f"more than {MAX_ALIASES} aliases (line {mark.line + 1}): "
                    "refusing a possible YAML bomb"
                )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping key must be a plain value", key_node.start_mark
                ) from None
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml_text(text: str, source: str) -> Any:
    """Parse YAML text from `source` (a file name used in messages)."""
    if len(text) > MAX_FILE_BYTES:
        raise InputError(f"{source}: file is larger than {MAX_FILE_BYTES} bytes; is it the right file?")
    loader = None
    try:
        loader = _StrictLoader(text)
        data = loader.get_single_data()
        if _expanded_size(data, {}) > MAX_EXPANDED_NODES:
            raise yaml.YAMLError(
                f"the document expands to more than {MAX_EXPANDED_NODES} values through aliases: "
                "refusing a possible YAML bomb"
            )
        return data
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        raise InputError(f"{source}: {where}{problem}") from None
    except (yaml.YAMLError, RecursionError, ValueError, OverflowError) as exc:
        raise InputError(f"{source}: invalid YAML: {exc}") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    """Read `path` and return its top-level mapping, or raise an InputError naming the file."""
    raw = read_user_file(path, what)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    data = load_yaml_text(text, str(path))
    if not isinstance(data, dict):
        kind = "empty" if data is None else type(data).__name__
        raise InputError(f"{path}: expected a mapping of keys at the top level, found {kind}")
    return data


MAX_PROMPT_BYTES = 1_000_000


def read_prompt(prompt: str | None, stream: Any, default: str) -> str:
    """A chat prompt from the argument, else from `stream` (piped stdin, read as bytes, bounded),
    else `default` on a terminal. Invalid UTF-8 and empty input are refused (exit 2), never sent."""
    if prompt is None:
        if stream.isatty():
            return default
        raw = stream.buffer.read(MAX_PROMPT_BYTES + 1) if hasattr(stream, "buffer") else (
            stream.read(MAX_PROMPT_BYTES + 1))
        if isinstance(raw, str):
            raw = raw.encode("utf-8", "surrogateescape")
        if len(raw) > MAX_PROMPT_BYTES:
            raise InputError(f"the prompt on stdin is larger than {MAX_PROMPT_BYTES} bytes")
        try:
            prompt = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"the prompt on stdin is not UTF-8 text (invalid byte at offset "
                             f"{exc.start}); nothing was sent") from None
        where = "on stdin"
    else:
        where = "given"
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError("the prompt argument is not UTF-8 text; nothing was sent") from None
    prompt = prompt.strip()
    if not prompt:
        raise InputError(f"the prompt {where} is empty; nothing was sent "
                         "(pass PROMPT or pipe text to `sparkctl chat`)")
    return prompt
