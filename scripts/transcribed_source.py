"""TensorRT-LLM's option table from a transcription of its rendered source (no installable source).

TensorRT-LLM publishes neither a wheel on PyPI (its 1.x packages there are stubs that download
from NVIDIA's own index) nor a repository small enough to clone here, but its documentation branch
carries the rendered module source of `tensorrt_llm/llmapi/llm_args.py` and the sphinx-click page
of `trtllm-serve serve`. A person read those pages and wrote down every pydantic class, field,
alias, validator and serve option in `scripts/engine-sources/<engine>-<version>/
options-transcribed.json` (see the README beside it for the provenance). This module turns that
transcription into the same table shape the `ast` extractor writes, reusing its annotation parser,
and checks the transcription against itself (every class's accepted keys must be exactly the
fields and aliases it resolves to), so a slip in the transcription fails the extraction.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Keys that earlier TensorRT-LLM releases read and 1.3.0rc13 refuses (extra="forbid"), with what
# replaced them. Each is re-checked against the generated table: the old key must be absent from
# TorchLlmArgs and the replacement present, so the hint cannot outlive the contract it describes.
# Source: the transcription's `key_answers` (read from the same llm_args page).
REMOVED = {
    "use_cuda_graph": ("cuda_graph_config",
                       "cuda_graph_config: {} turns CUDA graphs on (its keys: batch_sizes, "
                       "max_batch_size, enable_padding); null turns them off"),
    "enable_trtllm_sampler": ("sampler_type",
                              "sampler_type: TRTLLMSampler (deprecated, removed in 1.4; "
                              "TorchSampler becomes the default)"),
    "kv_cache_dtype": ("kv_cache_config",
                       "kv_cache_config: {dtype: fp8} (auto, fp8, nvfp4 or a torch dtype); "
                       "--kv_cache_dtype exists only as a trtllm-serve flag"),
}
_SCALARS = {"bool": "bool", "StrictBool": "bool", "int": "int", "PositiveInt": "int",
            "NonNegativeInt": "int", "float": "float", "NonNegativeFloat": "float",
            "PositiveFloat": "float", "str": "str", "Path": "str", "object": "any", "Any": "any",
            "list": "list", "List": "list", "Set": "list", "set": "list", "tuple": "list",
            "dict": "dict", "Dict": "dict", "Literal": "literal"}
_BOUND = re.compile(r"\b(ge|gt|le|lt)=(-?[0-9.]+)")


def _default(text: str) -> Any:
    if text.startswith("default_factory="):
        return {"factory": text.split("=", 1)[1]}
    if text == "required":
        return {"required": True}
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return {"expr": text}


def _aliases(name: str, alias: str | None) -> tuple[list[str], bool]:
    """The input keys an alias adds, and whether the field's own name stays accepted: a plain
    alias replaces the name (populate_by_name is not set), AliasChoices lists every key."""
    if not alias:
        return [], True
    if alias.startswith("validation_alias="):
        call = ast.parse(alias.split("=", 1)[1], mode="eval").body
        keys = [a.value for a in getattr(call, "args", []) if isinstance(a, ast.Constant)]
        return sorted(set(keys) - {name}), name in keys
    return ([alias], False) if alias != name else ([], True)


def _field(name: str, raw: dict[str, Any], describe: Callable[..., dict[str, Any]],
           aliases: dict[str, ast.AST], enums: dict[str, list[str]], models: set[str]) -> dict[str, Any]:
    annotation = ast.parse(raw["type"], mode="eval").body
    info = describe(annotation, aliases)
    heads = {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)}
    members = {_head(m) for m in _members(annotation)} - {"None"}
    kinds = {_SCALARS.get(m, "model" if m in models else "enum" if m in enums else "other")
             for m in members}
    if "enum" in kinds and "str" in kinds:  # Union[str, SamplerType]: any string gets through
        kinds.discard("enum")
    if kinds == {"int", "float"}:  # Union[int, float]
        info["kind"] = "float"
    elif len(kinds) > 1 and "model" not in kinds:  # Union[float, Dict[str, float]] and the like
        info["kind"] = "any"
    enum = next((m for m in members if m in enums), None)
    if enum and kinds == {"enum"}:
        info["kind"], info["literals"] = "literal", list(enums[enum])
    info["refs"] = [r for r in info.get("refs", []) if r in models]
    if kinds == {"other"}:
        info["kind"] = "any"  # a class defined elsewhere (LoraConfig, TelemetryConfig): not transcribed
    discriminator = re.search(r'discriminator=[\x27"](\w+)[\x27"]', ast.unparse(aliases.get(
        next((h for h in heads if h in aliases), ""), ast.Constant(""))))
    if discriminator:
        info["discriminator"] = discriminator.group(1)
    info["default"] = _default(raw["default"])
    extra, keeps_name = _aliases(name, raw.get("alias"))
    if extra:
        info["aliases"] = extra
    if not keeps_name:
        info["name_accepted"] = False
    for key in ("status", "note"):
        if raw.get(key):
            info[key] = raw[key]
    for bound, value in _BOUND.findall(raw.get("note") or ""):
        info[bound] = float(value)
    return info


def _members(node: ast.AST) -> list[ast.AST]:
    """The top-level members of Optional[...], Union[...] and Annotated[...] (not their insides)."""
    if isinstance(node, ast.Subscript) and _head(node) in ("Optional", "Union", "Annotated"):
        inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        inner = inner[:1] if _head(node) == "Annotated" else inner
        return [m for e in inner for m in _members(e)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _members(node.left) + _members(node.right)
    return [node]


def _head(node: ast.AST) -> str:
    target = node.value if isinstance(node, ast.Subscript) else node
    return ast.unparse(target).split(".")[-1]


def _resolve(name: str, classes: dict[str, Any], seen: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """A class's fields with its bases' first, as Python's MRO puts them (later ones override)."""
    out: dict[str, dict[str, Any]] = {}
    for base in classes[name]["bases"]:
        if base in classes and base not in seen:
            out.update(_resolve(base, classes, (*seen, name)))
    out.update(classes[name]["fields"])
    return out


def _accepted(keys: list[str]) -> set[str]:
    # "_mpi_session  (input key = alias of field 'mpi_session'; ...)": the key is the first word.
    return {k.split()[0] for k in keys}


def llm_args(data: dict[str, Any], describe: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    classes = data["classes"]
    aliases = {k: ast.parse(v, mode="eval").body for k, v in data["type_aliases"].items()}
    enums = {k.split(".")[-1]: v for k, v in data["enums"].items()}
    models: dict[str, Any] = {}
    for name, cls in classes.items():
        fields = {f: _field(f, raw, describe, aliases, enums, set(classes))
                  for f, raw in _resolve(name, classes).items()}
        keys = {k for f, info in fields.items()
                for k in ([f] if info.get("name_accepted", True) else []) + info.get("aliases", [])}
        if keys != _accepted(cls["accepted_keys_resolved"]):
            raise SystemExit(f"transcription disagrees with itself for {name}: fields and aliases "
                             f"give {sorted(keys ^ _accepted(cls['accepted_keys_resolved']))} "
                             "not in accepted_keys_resolved (or the reverse)")
        models[name] = {"forbid_extra": bool(cls["extra_forbid"]), "fields": fields,
                        "bases": cls["bases"]}
    return models


def serve_flags(data: dict[str, Any]) -> dict[str, Any]:
    """trtllm-serve serve's options: names, aliases and choices from the rendered page; value
    kinds only where the older serve.py gives a plain int/float (the page shows no click types)."""
    flags: dict[str, Any] = {}
    for canonical, raw in data["serve_cli"].items():
        names = raw["names"]
        spec: dict[str, Any] = {"aliases": [n for n in names if n != canonical], "kind": "str",
                                "choices": raw.get("choices")}
        older = raw.get("older_serve_py")
        if raw["type"].startswith("boolean on/off"):
            spec["kind"], spec["aliases"] = "bool_optional", []
        elif raw["type"].startswith("boolean flag"):
            spec["kind"] = "store_true"
        elif isinstance(older, dict) and older.get("type") in ("int", "float"):
            spec["kind"] = older["type"]
            spec["kind_source"] = "older serve.py (the rendered page shows no click types)"
        if raw.get("status"):
            spec["status"] = raw["status"]
        flags[canonical] = spec
    return flags


def removed_keys(models: dict[str, Any], root: str) -> dict[str, Any]:
    fields = models[root]["fields"]
    out: dict[str, Any] = {}
    for key, (replacement, hint) in REMOVED.items():
        if key in fields or replacement not in fields:
            raise SystemExit(f"REMOVED[{key!r}] no longer matches {root}: fix the hint")
        out[key] = {"replacement": replacement, "hint": hint}
    return out


def extract(path: Path, describe: Callable[..., dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(table body, provenance additions) for a transcription file."""
    import json

    raw = path.read_bytes()
    data = json.loads(raw)
    root = data["top_level"]
    models = llm_args(data, describe)
    src = data["source"]
    provenance = {
        "source": f"{src['repo']}@{src['commit']}",
        "transcription": {
            "file": path.name, "sha256": hashlib.sha256(raw).hexdigest(),
            "repository": src["repo"], "commit": src["commit"], "pages": src["paths"],
            "generated_from": src["branch_note"], "method": src["method"],
            "spot_check": data["spot_checks"]["method"],
        },
    }
    body = {"serve_flags": serve_flags(data), "root_model": root, "llm_args": models,
            "removed_keys": removed_keys(models, root),
            "flag_style": {"underscores_equal_dashes": False}}
    return body, provenance
