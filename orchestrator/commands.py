"""Pure builders of remote shell commands.

Every value is quoted with shlex.quote, so names and paths from an inventory stay inert on the
remote shell. Secrets are wrapped in `Secret`, which prints as *** everywhere (logs, reports,
previews); a secret never goes on a command line at all: it travels on stdin.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping
from typing import Any


class Secret:
    """A value that must never be shown: str() and repr() mask it; `.reveal()` is explicit."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __str__(self) -> str:
        return "***"

    def __repr__(self) -> str:
        return "Secret(***)"

    def __bool__(self) -> bool:
        return bool(self._value)


def quote(value: Any) -> str:
    if isinstance(value, Secret):
        raise TypeError("a Secret must not be placed on a command line; send it on stdin")
    return shlex.quote(str(value))


def join(args: Iterable[Any]) -> str:
    """Quote and join argv into one shell command."""
    return " ".join(quote(a) for a in args)


def env_args(flag: str, env: Mapping[str, str]) -> list[str]:
    """['-e', 'K=V', ...] in a stable order (stable order keeps config hashes stable)."""
    out: list[str] = []
    for key in sorted(env):
        out += [flag, f"{key}={env[key]}"]
    return out


def python_script_cmd(args: Mapping[str, Any] | None = None) -> str:
    """Run a Python script that arrives on stdin, with JSON arguments as argv[1]."""
    return join(["python3", "-", json.dumps(dict(args or {}), sort_keys=True)])


def install_file_cmd(path: str, mode: int, owner: str = "root", group: str = "root") -> str:
    """Atomically replace `path` with stdin: write a temp file beside it, then rename.

    The rename keeps readers from ever seeing half a file, and the mode is set before the
    content lands, so a 0600 file is never briefly world-readable.
    """
    directory = path.rsplit("/", 1)[0] or "/"
    tmp = f"{path}.sparkctl-tmp"
    return (
        f"mkdir -p {quote(directory)} && umask 077 && cat > {quote(tmp)} && "
        f"chmod {mode:o} {quote(tmp)} && chown {quote(owner)}:{quote(group)} {quote(tmp)} && "
        f"mv -f {quote(tmp)} {quote(path)}"
    )


def remove_files_cmd(paths: Iterable[str]) -> str:
    return join(["rm", "-f", "--", *paths])


def docker_cmd(*args: Any) -> str:
    return join(["docker", *args])


def sh_cmd(script: str) -> str:
    """Wrap a compound shell command so it can run under sudo as one argument."""
    return join(["sh", "-c", script])
