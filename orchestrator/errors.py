"""The errors sparkctl shows to users. Each carries the exit code the CLI returns.

Exit codes (a contract, see docs/contracts.md): 0 ok, 1 a check or step failed, 2 bad usage or bad
input, 130 interrupted.
"""

from __future__ import annotations

import re

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


class SparkctlError(Exception):
    """An error with a message meant for the user, never shown with a traceback."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


class InputError(SparkctlError):
    """Bad inventory, recipe or command-line input (exit 2)."""

    exit_code = EXIT_BAD_INPUT


class TransportError(SparkctlError):
    """A node could not be reached or the SSH session broke."""


class HostKeyError(TransportError):
    """A host key was unknown (without --trust-new-hosts) or did not match the pinned one."""


class CommandError(SparkctlError):
    """A remote command exited non-zero where success was required."""

    def __init__(self, host: str, command: str, exit_status: int, stderr: str) -> None:
        tail = "\n".join(stderr.strip().splitlines()[-8:])
        message = f"{host}: `{command}` exited {exit_status}"
        if tail:
            message += f":\n{tail}"
        container = missing_container(command, stderr)
        if container:
            message = (f"the container {container} is not running on {host}: "
                       "run `sparkctl up` first")
        super().__init__(message)
        self.host = host
        self.command = command
        self.exit_status = exit_status
        self.stderr = stderr


class LockError(SparkctlError):
    """Another sparkctl run holds the cluster lock."""


_MISSING = (re.compile(r"No such container: ([\w.-]+)"),
            re.compile(r"[Cc]ontainer ([\w.-]+) is not running"))


def missing_container(command: str, stderr: str) -> str | None:
    """The container a `docker exec` needed and did not find running, else None."""
    if "docker" not in command:
        return None
    for pattern in _MISSING:
        found = pattern.search(stderr)
        if found:
            return found.group(1)
    return None
