"""What an engine's recipe importer works from, and what every engine's import shares.

An engine that can import community recipes has an `importer` (engines/NAME/importer.py): the
sparkrun runtimes and the commands it recognises, and `convert(job)`, which turns the parsed
command into its recipe's fields. The job holds the command as the engine's own parser reads
it (engines/optiontable.py), takes the options the recipe has typed fields for, and keeps the
rest, verbatim, for `serve_args`; what is changed on the way is noted, what cannot be carried
over is refused (InputError, exit 2) naming the file and the option or field.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

from orchestrator.errors import InputError

T = TypeVar("T")

if TYPE_CHECKING:
    from orchestrator.engines.foreign import ForeignRecipe
    from orchestrator.engines.optiontable import OptionTable, ParsedArgs, ParsedOption

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
# bytes per parameter on disk by quantization words in a model's name or sparkrun's metadata
# (4-bit formats carry a scale per block of 16-32 weights, hence a little over 0.5)
_BYTES_PER_PARAM = [
    (("nvfp4", "mxfp4", "fp4", "int4", "awq", "gptq", "autoround", "w4a16", "w4a4", "q4"), 0.56),
    (("q3",), 0.45), (("q5",), 0.69), (("q6",), 0.82),
    (("fp8", "int8", "w8a8", "q8"), 1.06),
]
_PARAMS_IN_NAME = re.compile(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)[Bb](?![A-Za-z])")


class RecipeImporter(Protocol):
    """An engine's side of `recipes import` (engines/NAME/importer.py)."""

    runtimes: frozenset[str]
    """sparkrun `runtime:` values whose commands this engine runs."""
    programs: tuple[tuple[str, ...], ...]
    """How its serve commands start (`python` is read as `python3`, paths by their last part)."""

    def table(self) -> OptionTable: ...

    def convert(self, job: ImportJob) -> dict[str, Any]:
        """The recipe's engine-specific fields from the job's options."""
        ...


@dataclass
class ImportJob:
    foreign: ForeignRecipe
    parsed: ParsedArgs
    default_image: str
    weights_gb: float | None = None  # `recipes import --weights-gb`
    image_override: str | None = None  # `recipes import --image`
    notes: list[str] = field(default_factory=list)
    _taken: set[int] = field(default_factory=set)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def refuse(self, text: str) -> NoReturn:
        raise InputError(f"{self.foreign.path}: {text}")

    def take(self, flag: str) -> ParsedOption | None:
        """The option under its canonical flag, taken out of what goes to serve_args; when given
        twice, the last one (argparse keeps the last value)."""
        found = None
        for index, option in enumerate(self.parsed.options):
            if option.flag == flag:
                self._taken.add(index)
                found = option
        return found

    def value(self, flag: str) -> str | None:
        option = self.take(flag)
        return option.values[-1] if option and option.values else None

    def switch(self, flag: str) -> bool | None:
        """A boolean option's state (True, or False for its --no- form), None when absent."""
        option = self.take(flag)
        if option is None:
            return None
        if option.values:
            return option.values[-1].lower() in ("1", "true", "yes", "on", "t", "y")
        return not option.negated

    def drop(self, flag: str, why: str) -> None:
        option = self.take(flag)
        if option is not None:
            self.note(f"{' '.join(option.words)}: not carried over ({why})")

    def rest(self) -> list[str]:
        """The options no typed field took, verbatim, in their order: the recipe's serve_args."""
        return [word for index, option in enumerate(self.parsed.options)
                if index not in self._taken for word in option.words]

    def positionals(self) -> list[str]:
        return list(self.parsed.positionals)

    def whole(self, flag: str) -> int | None:
        """An integer option's value (the last one given), None when absent."""
        return self._read(flag, int, "a whole number")

    def wholes(self, fields: dict[str, str]) -> dict[str, int]:
        """{field: value} of the integer options given ({flag: the recipe's field}), e.g. the
        parallel sizes."""
        found = {key: self.whole(flag) for flag, key in fields.items()}
        return {key: value for key, value in found.items() if value is not None}

    def port(self, flag: str = "--port") -> int | None:
        return self._read(flag, int, "a port number")

    def host(self, flag: str = "--host") -> None:
        """sparkctl binds servers to 127.0.0.1; a wider bind is `launch --host` with a key."""
        where = self.value(flag)
        if where is not None and where not in LOOPBACK:
            self.note(f"{flag} {where}: not carried over; sparkctl binds the server to "
                      f"127.0.0.1 (`sparkctl launch NAME --host {where} --api-key-file FILE` "
                      "serves beyond the node, with a key)")

    def where_served(self, revision: str | None = "--revision") -> dict[str, Any]:
        """The fields every engine reads alike: the model's revision (REVISION: its flag, None
        when the engine has none), the port; the bind address judged (see `host`)."""
        fields: dict[str, Any] = {}
        if revision and (value := self.value(revision)):
            fields["revision"] = value
        port = self.port()
        if port is not None:
            fields["port"] = port
        self.host()
        return fields

    def fraction(self, flag: str) -> float | None:
        return self._read(flag, float, "a number")

    def _read(self, flag: str, kind: Callable[[str], T], what: str) -> T | None:
        """FLAG's value (the last one given) as KIND, None when absent; refused naming it."""
        raw = self.value(flag)
        if raw is None:
            return None
        try:
            return kind(raw)
        except ValueError:
            self.refuse(f"command: {flag} {raw!r} is not {what}")

    def image(self) -> str:
        """The recipe's container, or the engine's default image in place of one built
        locally (a bare name like eugr's `vllm-node`: no registry serves it)."""
        container = self.foreign.container.strip()
        if self.image_override:
            if container != self.image_override:
                self.note(f"container {container or '(none)'}: replaced by {self.image_override} "
                          "(--image)")
            return self.image_override
        if not container:
            self.note(f"no container named: the engine's default image {self.default_image}")
            return self.default_image
        repo = container.split("@")[0].split(":")[0]
        if "/" not in repo:
            self.note(f"container {container}: an image built locally (eugr's build-and-copy.sh; "
                      f"no registry serves it): the import uses {self.default_image} instead; "
                      "patches built into the local image are not in it")
            return self.default_image
        return container

    def memory(self, kv_cache_fraction: float | None) -> dict[str, Any]:
        memory: dict[str, Any] = {"weights_gb": self.weights()}
        if kv_cache_fraction is not None:
            memory["kv_cache_fraction"] = kv_cache_fraction
        return memory

    def weights(self) -> float:
        """The model's size on disk in GB: --weights-gb, sparkrun's metadata (model_vram, or
        model_params at model_dtype), or the parameter count in the model's name at the bytes
        per parameter its quantization word implies (noted: it is a guess to check)."""
        if self.weights_gb is not None:
            return self.weights_gb
        meta = self.foreign.metadata
        if isinstance(meta.get("model_vram"), int | float) and meta["model_vram"] > 0:
            self.note(f"memory.weights_gb {meta['model_vram']:g}: the recipe's metadata.model_vram")
            return float(meta["model_vram"])
        params = _parameters(meta.get("model_params")) or _parameters(self.foreign.model)
        if params is None:
            self.refuse(f"the size of {self.foreign.model or 'the model'} is not in the recipe "
                        "(no metadata.model_vram or model_params) nor in its name: give it, "
                        "`sparkctl recipes import FILE --weights-gb N` (all weight files, GB)")
        words = f"{self.foreign.model} {meta.get('model_dtype', '')} {meta.get('quantization', '')}"
        per_param = next((size for keys, size in _BYTES_PER_PARAM
                          if any(k in words.lower() for k in keys)), 2.0)
        gb = round(params * per_param, 1)
        self.note(f"memory.weights_gb {gb:g}: guessed as {params:g}B parameters x {per_param:g} "
                  "bytes; check it against the model's files (or import with --weights-gb)")
        return gb


def _parameters(value: Any) -> float | None:
    """Billions of parameters from sparkrun's `model_params` (8B, 8000000000) or a model name
    (Qwen3-235B-A22B: the first count is the total)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value) / 1e9 if value > 1e5 else float(value)
    if isinstance(value, str):
        found = _PARAMS_IN_NAME.search(value.split("/")[-1])
        if found:
            return float(found.group(1))
    return None
