"""Where advise finds a model's architecture, in order: the facts table (a cache of models read
before, each entry citing its config.json or GGUF header), sparkctl's own cache of models it
read, the files already downloaded into this machine's Hugging Face cache, then the hub itself
(config.json, or the first megabytes of the GGUF: its header; $HF_ENDPOINT, $HF_TOKEN from the
environment, never printed; not with HF_HUB_OFFLINE=1). A model none of them can read is
refused with what was tried: advise never guesses a dense model.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

from orchestrator.advise.architecture import (
    Truncated,
    Unreadable,
    facts_from_config,
    facts_from_gguf,
    read_gguf_header,
)
from orchestrator.advise.facts import FACTS, ModelFacts

HEADER_BYTES = (4 << 20, 32 << 20)
"""How much of a GGUF to read for its header: 4 MB, then 32 MB for large vocabularies."""
SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
HUB_TIMEOUT = 10.0


class ModelUnreadable(Exception):
    """No source could say the model's architecture; the text lists what was tried."""


def hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    return Path(home) / "hub"


def facts_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sparkctl" / "model-facts"


def parts_of(gguf: str) -> list[str]:
    found = SPLIT.search(gguf)
    if not found:
        return [gguf]
    total = int(found.group(2))
    return [SPLIT.sub(f"-{i:05d}-of-{total:05d}.gguf", gguf) for i in range(1, total + 1)]


def local_file(model: str, revision: str, name: str) -> Path | None:
    repo = hub_cache() / f"models--{model.replace('/', '--')}"
    ref = repo / "refs" / revision
    snapshots = [repo / "snapshots" / ref.read_text().strip()] if ref.is_file() else \
        sorted((repo / "snapshots").glob("*"))
    for snapshot in snapshots:
        if (snapshot / name).is_file():
            return snapshot / name
    return None


def hub_get(model: str, revision: str, name: str, limit: int | None) -> bytes:
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise OSError("HF_HUB_OFFLINE is set")
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    request = urllib.request.Request(f"{endpoint}/{model}/resolve/{revision}/{name}")
    if limit:
        request.add_header("Range", f"bytes=0-{limit - 1}")
    token = os.environ.get("HF_TOKEN")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=HUB_TIMEOUT) as answer:  # https, or $HF_ENDPOINT
            return bytes(answer.read(limit) if limit else answer.read())
    except urllib.error.HTTPError as exc:
        raise OSError(f"{endpoint} answered HTTP {exc.code} for {name}") from None
    except (urllib.error.URLError, TimeoutError) as exc:
        raise OSError(f"{endpoint} unreachable ({getattr(exc, 'reason', exc)})") from None


def gguf_header(model: str, revision: str, name: str) -> tuple[Any, str]:
    path = local_file(model, revision, name)
    for limit in HEADER_BYTES:
        if path is not None:
            with open(path, "rb") as handle:
                data, where = handle.read(limit), f"{name} in the Hugging Face cache"
        else:
            data, where = hub_get(model, revision, name, limit), f"{name} on the hub"
        try:
            return read_gguf_header(data), where
        except Truncated:
            continue
    raise Unreadable(f"{name}: the GGUF header is longer than {HEADER_BYTES[-1] >> 20} MB")


def read_model(model: str, revision: str, gguf: str | None) -> ModelFacts:
    """The architecture from the downloaded files, else the hub (raises OSError, Unreadable)."""
    if gguf:
        headers, where = [], ""
        for part in parts_of(gguf):
            header, where = gguf_header(model, revision, part)
            headers.append(header)
        return facts_from_gguf(headers, f"read from the GGUF header ({where})")
    path = local_file(model, revision, "config.json")
    data = path.read_bytes() if path else hub_get(model, revision, "config.json", None)
    where = "the Hugging Face cache" if path else "the hub"
    try:
        config = json.loads(data)
    except ValueError:
        raise Unreadable("config.json is not JSON") from None
    return facts_from_config(config, f"read from config.json ({where})")


def cache_key(model: str, revision: str, gguf: str | None) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{model}@{revision}@{gguf or 'config'}") + ".json"


def model_facts(model: str, revision: str = "main", gguf: str | None = None) -> ModelFacts:
    """The facts of a recipe's model (see the module's docstring for the order)."""
    if model in FACTS:
        return FACTS[model]
    cached = facts_cache() / cache_key(model, revision, gguf)
    try:
        return ModelFacts(**json.loads(cached.read_text()))
    except (OSError, ValueError, TypeError):
        pass
    what = f"{model}" + (f" ({gguf})" if gguf else "") + (f" at {revision}" if revision != "main" else "")
    try:
        facts = read_model(model, revision, gguf)
    except (OSError, Unreadable) as exc:
        raise ModelUnreadable(
            f"cannot read the architecture of {what}: not in the facts table, not in "
            f"{hub_cache()}, and the hub: {exc}. advise will not guess (a dense guess reads "
            "every weight per token); download the model (`sparkctl launch` fetches it) or "
            "let advise reach the hub") from None
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(asdict(facts)))
    except OSError:
        pass  # a cache only
    return facts
