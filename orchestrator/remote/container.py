"""Run inside a container on a node (Ray's DockerCommandRunner idea): a node's transport plus a
container name, so engines and phases say *what* runs in the container and this module alone
says how docker is asked (`docker exec`, `docker logs`, `docker inspect` of one container, the
quoting of every word).

`Container` only builds commands (pure: plans, `Change.commands`, dry runs and logs show them
exactly); `ContainerTransport` runs them over the node's transport (`run`, `put`, `read`, `logs`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.commands import docker_cmd, env_args, join, quote
from orchestrator.remote.transport import Result


@dataclass(frozen=True)
class ContainerCommands:
    """One container of a node, as the docker commands that reach it."""

    name: str

    def exec_argv(self, argv: Iterable[Any], env: Mapping[str, str] | None = None,
                  detach: bool = False, interactive: bool = False) -> list[str]:
        """`docker exec [-d] [-i] [-e K=V]... NAME ARGV...` as words (for an argv of its own,
        e.g. behind `timeout`)."""
        flags = (["-d"] if detach else []) + (["-i"] if interactive else [])
        return ["docker", "exec", *flags, *env_args("-e", env or {}), self.name,
                *(str(word) for word in argv)]

    def exec_cmd(self, argv: Iterable[Any], env: Mapping[str, str] | None = None,
                 detach: bool = False, interactive: bool = False) -> str:
        """The shell command of `exec_argv`, every word quoted."""
        return join(self.exec_argv(argv, env, detach, interactive))

    def logs_cmd(self, tail: int | str | None = None, since: float | None = None,
                 follow: bool = False) -> str:
        """`docker logs [--since EPOCH] [--tail N] [--follow] NAME` (the container's stdout on
        stdout, its stderr on stderr)."""
        return docker_cmd("logs", *(["--since", f"{since:.0f}"] if since is not None else []),
                          *(["--tail", tail] if tail is not None else []),
                          *(["--follow"] if follow else []), self.name)

    def inspect_cmd(self, fmt: str | None = None) -> str:
        """`docker inspect --type container [-f FMT] NAME` (fails when there is no such
        container, also when an image has its name)."""
        return docker_cmd("inspect", "--type", "container", *(["-f", fmt] if fmt else []),
                          self.name)

    def running_cmd(self) -> str:
        """Prints `true` while it runs (`false` stopped; fails when there is no such container)."""
        return self.inspect_cmd("{{.State.Running}}")

    def is_running_cmd(self) -> str:
        """A shell condition: the container exists and runs."""
        return f"[ \"$({self.running_cmd()} 2>/dev/null)\" = true ]"

    def shown(self, what: str, detach: bool = False) -> str:
        """`docker exec [-d] NAME WHAT`: how the run log shows an exec whose words are too long."""
        return f"docker exec {'-d ' if detach else ''}{self.name} {what}"

    def remove_cmd(self) -> str:
        return docker_cmd("rm", "-f", self.name)

    def start_cmd(self) -> str:
        return docker_cmd("start", self.name)

    def stop_cmd(self, seconds: int | str) -> str:
        return docker_cmd("stop", "-t", seconds, self.name)


class Runs(Protocol):
    """What runs a shell command on a node: a Transport, or a step's NodeContext."""

    def run(self, command: str, *, stdin: bytes | str | None = None, sudo: bool = False,
            timeout: float | None = None, display: str | None = None) -> Result: ...


class ContainerTransport:
    """Commands run inside one container of the node that `transport` reaches."""

    def __init__(self, transport: Runs, container: str | ContainerCommands) -> None:
        self.transport = transport
        self.container = (container if isinstance(container, ContainerCommands)
                          else ContainerCommands(container))

    @property
    def name(self) -> str:
        return self.container.name

    def shown(self, what: str, detach: bool = False) -> str:
        """How the run log shows a command whose program is too long to print."""
        return self.container.shown(what, detach)

    def run(self, argv: Iterable[Any], *, stdin: bytes | str | None = None, sudo: bool = False,
            timeout: float | None = None, display: str | None = None,
            env: Mapping[str, str] | None = None, detach: bool = False) -> Result:
        """ARGV in the container (`-i` when there is stdin to hand it, `-d` detached)."""
        command = self.container.exec_cmd(argv, env, detach, interactive=stdin is not None)
        return self.transport.run(command, stdin=stdin, sudo=sudo, timeout=timeout,
                                  display=display)

    def put(self, path: str, data: bytes | str, mode: int = 0o600, *, sudo: bool = False,
            timeout: float | None = None) -> Result:
        """Write PATH inside the container from stdin (never on a command line), mode MODE."""
        write = f"umask 077 && cat > {quote(path)} && chmod {mode:o} {quote(path)}"
        return self.run(["sh", "-c", write], stdin=data, sudo=sudo, timeout=timeout,
                        display=self.shown(f"write {path}")).check()

    def read(self, path: str, *, sudo: bool = False, timeout: float | None = None) -> str:
        """PATH's text inside the container (raises when it cannot be read)."""
        return self.run(["cat", path], sudo=sudo, timeout=timeout).check().stdout

    def logs(self, tail: int | str | None = None, *, sudo: bool = False,
             timeout: float | None = None) -> str:
        """The container's log (stdout and stderr together); a missing container's is docker's
        error message, never an exception."""
        result = self.transport.run(f"{self.container.logs_cmd(tail)} 2>&1; true", sudo=sudo,
                                    timeout=timeout, display=f"docker logs {self.name}")
        return result.stdout
