"""Check engine command lines and TensorRT-LLM llm_args YAML against the extracted option tables.

The tables (engines/<engine>/options.json) are written by scripts/extract-engine-options from
each engine's real source at a pinned version, so a recipe is rejected here for exactly the
reasons the real engine would reject it, and the lab's simulated engines use the same tables.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
# pydantic v2 lax mode turns these into booleans (True == 1 and False == 0 in a set);
# anything else (2, "maybe") is rejected.
_BOOL_TRUE = {1, "1", "true", "True", "TRUE", "yes", "on", "t", "y"}
_BOOL_FALSE = {0, "0", "false", "False", "FALSE", "no", "off", "f", "n"}


@dataclass(frozen=True)
class Problem:
    key: str  # a flag ("--tp_size") or a dotted llm_args path ("kv_cache_config.dtype")
    message: str
    engine: str  # "TensorRT-LLM 1.3.0rc13"
    suggestion: str | None = None
    instead: str | None = None  # what replaced a key this version no longer reads

    def __str__(self) -> str:
        hint = f" (did you mean {self.suggestion}?)" if self.suggestion else ""
        if self.instead:
            hint = f"; it was replaced, use {self.instead}"
        return f"{self.key}: {self.message} in {self.engine}{hint}"


@dataclass
class ParsedOption:
    flag: str  # the table's canonical spelling
    spelled: str  # as written: an alias, an abbreviation, a --no- form
    negated: bool  # the --no- form of a boolean
    values: list[str]
    words: list[str]  # the argv words it took, verbatim


@dataclass
class ParsedArgs:
    options: list[ParsedOption] = field(default_factory=list)
    positionals: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


@dataclass
class OptionTable:
    engine: str
    version: str
    flags: dict[str, dict[str, Any]]
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    root_model: str | None = None
    underscores_equal_dashes: bool = False
    # argparse's allow_abbrev (on unless a parser turns it off): `--tp 1` is `--tp-size 1` when
    # no other option starts with --tp; click (trtllm-serve) has no such thing
    allow_abbrev: bool = False
    # keys an earlier release read and this one refuses: key -> {"replacement", "hint"}
    removed: dict[str, dict[str, str]] = field(default_factory=dict)
    _spellings: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for canonical, spec in self.flags.items():
            for spelling in [canonical, *spec.get("aliases", [])]:
                self._spellings[self._norm(spelling)] = canonical

    @property
    def label(self) -> str:
        return f"{self.engine} {self.version}"

    def _norm(self, flag: str) -> str:
        # vLLM's FlexibleArgumentParser reads --max_model_len as --max-model-len.
        return flag.replace("_", "-") if self.underscores_equal_dashes else flag

    def _lookup(self, flag: str) -> tuple[str | None, bool]:
        """The canonical flag for a spelling, and whether it was the --no- form of a boolean."""
        canonical = self._spellings.get(self._norm(flag))
        if canonical is not None:
            return canonical, False
        if flag.startswith("--no-"):
            positive = self._spellings.get(self._norm("--" + flag[5:]))
            if positive and self.flags[positive]["kind"] == "bool_optional":
                return positive, True
        actions = set(self.abbreviations(flag).values())
        if len(actions) == 1:
            return actions.pop()
        return None, False

    def abbreviations(self, flag: str) -> dict[str, tuple[str, bool]]:
        """The spellings a `--prefix` abbreviates, as argparse matches them, each with its
        (canonical flag, whether it is the --no- form); empty when abbreviations are off. One
        option reached through several spellings (--tp -> --tp-size only) is not ambiguous."""
        if not self.allow_abbrev or not flag.startswith("--"):
            return {}
        prefix = self._norm(flag)
        found: dict[str, tuple[str, bool]] = {}
        for spelling, canonical in self._spellings.items():
            if spelling.startswith(prefix):
                found[spelling] = (canonical, False)
            negative = "--no-" + spelling[2:]
            if self.flags[canonical]["kind"] == "bool_optional" and negative.startswith(prefix):
                found[negative] = (canonical, True)
        return found

    def canonical(self, flag: str) -> str | None:
        """The table's own spelling of a flag, an alias or a --no- form; None when unknown."""
        return self._lookup(flag)[0]

    def _problem(self, key: str, message: str, candidates: list[str] | None = None) -> Problem:
        close = difflib.get_close_matches(key, candidates or [], n=1, cutoff=0.6)
        return Problem(key, message, self.label, close[0] if close else None)

    def check_flags(self, argv: list[str]) -> list[Problem]:
        """Problems with a serve command's options; positional words (the model) are skipped."""
        return self.parse(argv).problems

    def parse(self, argv: list[str]) -> ParsedArgs:
        """The words of a command line as the engine's parser reads them: each option under its
        canonical flag (aliases, `--no-` forms and abbreviations resolved) with the values it
        takes, the positional words, and what the parser would refuse."""
        parsed = ParsedArgs()
        spellings = sorted(self._spellings)
        i = 0
        while i < len(argv):
            token = argv[i]
            i += 1
            if not token.startswith("-") or token in ("-", "--"):
                parsed.positionals.append(token)
                continue
            flag, eq, inline = token.partition("=")
            canonical, negated = self._lookup(flag)
            if canonical is None:
                matches = self.abbreviations(flag)
                if matches:  # several options start so: argparse's "ambiguous option" (exit 2)
                    parsed.problems.append(Problem(flag, f"ambiguous option: could match "
                                                         f"{', '.join(sorted(matches))}", self.label))
                else:
                    parsed.problems.append(self._problem(flag, "unknown option", spellings))
                continue
            spec = self.flags[canonical]
            kind = spec["kind"]
            option = ParsedOption(canonical, flag, negated, [], [token])
            parsed.options.append(option)
            if kind in ("store_true", "store_false") or negated or (kind == "bool_optional" and not eq):
                if eq:
                    parsed.problems.append(self._problem(flag, "takes no value"))
                continue
            if eq:
                option.values.append(inline)
            elif i < len(argv) and not _looks_like_flag(argv[i]):
                option.values.append(argv[i])
                i += 1
                # nargs="+"/"*" options (vLLM's list fields) swallow every following word.
                while spec.get("nargs") in ("+", "*") or kind == "list":
                    if i >= len(argv) or _looks_like_flag(argv[i]):
                        break
                    option.values.append(argv[i])
                    i += 1
                option.words.extend(option.values)
            elif spec.get("nargs") in ("?", "*"):
                continue
            else:
                parsed.problems.append(self._problem(flag, "needs a value"))
                continue
            for value in option.values:
                problem = self._check_value(flag, spec, value)
                if problem:
                    parsed.problems.append(problem)
        return parsed

    def _check_value(self, flag: str, spec: dict[str, Any], value: str) -> Problem | None:
        choices = spec.get("choices")
        if choices and value not in [str(c) for c in choices if c is not None]:
            return self._problem(flag, f"{value!r} is not one of {', '.join(map(str, choices))}",
                                 [str(c) for c in choices])
        kind = spec["kind"]
        try:
            if kind == "int":
                int(value)
            elif kind == "float":
                float(value)
        except ValueError:
            return self._problem(flag, f"{value!r} is not {'an integer' if kind == 'int' else 'a number'}")
        if kind in ("bool", "bool_optional") and value not in _BOOL_TRUE | _BOOL_FALSE:
            return self._problem(flag, f"{value!r} is not a boolean")
        return None

    def check_llm_args(self, mapping: Any, model: str | None = None, prefix: str = "") -> list[Problem]:
        """Problems with an llm_args mapping (TensorRT-LLM's extra_llm_api_options YAML)."""
        name = model or self.root_model
        if name is None or name not in self.models:
            return [Problem(prefix or "<root>", "no llm_args table", self.label)]
        spec = self.models[name]
        if not isinstance(mapping, dict):
            return [Problem(prefix or "<root>", f"must be a mapping ({name})", self.label)]
        fields = spec["fields"]
        by_name = {alias: key for key, f in fields.items()
                   for alias in ([key] if f.get("name_accepted", True) else []) + f.get("aliases", [])}
        problems: list[Problem] = []
        for key, value in mapping.items():
            path = f"{prefix}{key}"
            real = by_name.get(str(key))
            if real is None:
                gone = self.removed.get(str(key)) if name == self.root_model else None
                if gone and spec["forbid_extra"]:
                    problems.append(Problem(path, f"is not a field of {name}", self.label,
                                            gone["replacement"], gone["hint"]))
                elif spec["forbid_extra"]:
                    close = difflib.get_close_matches(str(key), sorted(by_name), n=1, cutoff=0.6)
                    problems.append(Problem(path, f"is not a field of {name}", self.label,
                                            close[0] if close else None))
                continue
            problems += self._check_field(path, fields[real], value)
        return problems

    def _check_field(self, path: str, info: dict[str, Any], value: Any) -> list[Problem]:
        if value is None:
            ok = info.get("optional") or info.get("default") is None
            return [] if ok else [Problem(path, "cannot be null", self.label)]
        refs = [r for r in info.get("refs", []) if r in self.models]
        if refs and isinstance(value, dict):
            tag = info.get("discriminator", "decoding_type")
            target = self._pick_model(refs, value, tag)
            if target is None:
                wanted = sorted({v for r in refs for v in self._literals(r, tag)})
                return [Problem(f"{path}.{tag}", f"must be one of {', '.join(wanted)}", self.label,
                                _closest(str(value.get(tag)), wanted))]
            return self.check_llm_args(value, target, prefix=f"{path}.")
        kind = info.get("kind")
        literals = info.get("literals")
        if literals and not refs and value not in literals:
            return [Problem(path, f"{value!r} is not one of {', '.join(map(str, literals))}", self.label,
                            _closest(str(value), [str(v) for v in literals]))]
        bad = (
            (kind == "bool" and not _is_lax_bool(value))
            or (kind == "int" and (isinstance(value, bool) or not _is_lax_int(value)))
            or (kind == "float" and (isinstance(value, bool) or not _is_lax_float(value)))
            or (kind == "list" and not isinstance(value, list | tuple))
            or (kind == "dict" and not isinstance(value, dict))
        )
        if bad:
            return [Problem(path, f"{value!r} is not a valid {kind}", self.label)]
        return _bounds(path, info, value, self.label)

    def _literals(self, model: str, field_name: str) -> list[Any]:
        return list(self.models[model]["fields"].get(field_name, {}).get("literals", []))

    def _pick_model(self, refs: list[str], value: dict[str, Any], tag: str) -> str | None:
        """The model a nested mapping validates against; a discriminated union picks by its tag
        (decoding_type for speculative configs, algorithm for sparse attention)."""
        tagged = [r for r in refs if self._literals(r, tag)]
        if len(refs) == 1 or not tagged:
            return refs[0]
        return next((r for r in tagged if value.get(tag) in self._literals(r, tag)), None)


def _bounds(path: str, info: dict[str, Any], value: Any, label: str) -> list[Problem]:
    """pydantic's ge/gt/le/lt constraints (kv_cache_config.free_gpu_memory_fraction in [0, 1])."""
    if isinstance(value, bool) or not _is_lax_float(value):
        return []
    number = float(value)
    checks = {"ge": lambda b: number >= b, "gt": lambda b: number > b,
              "le": lambda b: number <= b, "lt": lambda b: number < b}
    for bound, ok in checks.items():
        if bound in info and not ok(info[bound]):
            word = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}[bound]
            return [Problem(path, f"{value!r} must be {word} {info[bound]:g}", label)]
    return []


def _looks_like_flag(token: str) -> bool:
    # "-1" or "-0.5" is a value, "-tp" or "--port" is an option.
    return token.startswith("-") and not _is_lax_float(token)


def _closest(word: str, candidates: list[str]) -> str | None:
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return close[0] if close else None


def _is_lax_bool(value: Any) -> bool:
    # pydantic accepts the ints 0/1 but not 1.0 or 2; strings are matched exactly.
    if not isinstance(value, int | str):  # floats, lists, mappings (a list is not even hashable)
        return False
    return value in _BOOL_TRUE or value in _BOOL_FALSE


def _is_lax_int(value: Any) -> bool:
    if isinstance(value, int):
        return True
    if isinstance(value, float):
        return value.is_integer()
    try:
        int(str(value))
    except ValueError:
        return False
    return True


def _is_lax_float(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def load_table(engine: str, path: Path | None = None) -> OptionTable:
    """The table for "trtllm", "vllm" or "sglang", from the JSON beside this module."""
    data = json.loads((path or _HERE / engine / "options.json").read_text())
    prov = data["provenance"]
    return OptionTable(
        engine=prov["engine"], version=prov["version"], flags=data["serve_flags"],
        models=data.get("llm_args", {}), root_model=data.get("root_model"),
        underscores_equal_dashes=data.get("flag_style", {}).get("underscores_equal_dashes", False),
        allow_abbrev=data.get("flag_style", {}).get("allow_abbrev", False),
        removed=data.get("removed_keys", {}),
    )


def refuse_serve_args(serve_args: list[str], reserved: dict[str, str],
                      canonical: Callable[[str], str],
                      check: Callable[[list[str]], list[str]]) -> None:
    """A recipe's validator on its `serve_args`: ValueError for a flag sparkctl sets itself
    (RESERVED: flag -> what sets it; a flag is compared in the engine's own spelling, an alias
    or abbreviation included) and for what the engine's parser would reject (CHECK)."""
    for word in serve_args:
        flag = canonical(word.split("=", 1)[0]) if word.startswith("-") else word
        if flag in reserved:
            raise ValueError(f"serve_args must not set {flag}: sparkctl sets it from "
                             f"{reserved[flag]}")
    problems = check(serve_args)
    if problems:
        raise ValueError("serve_args: " + "; ".join(problems))
