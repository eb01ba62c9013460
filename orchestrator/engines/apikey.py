"""A server's API key (`launch --host ADDR --api-key-file FILE`): how it reaches the server, and
how sparkctl's own clients find it again.

The key never travels on a command line and never sits in a container's configuration (`docker
inspect` shows Cmd, Env, Mounts and Labels to anyone in the docker group). It goes:
  controller file (checked: cli/api_key.py) -> stdin of the node's ledger script (phases/files.py)
  -> RUN_DIR/servers/<server>/api_key on every serving node (0600 root)
  -> mounted read-only at CONTAINER_KEY in the server's own container (vLLM and TensorRT-LLM,
     which start in a long-lived container, read it through the run dir that container mounts)
  -> the engine, in its own way at its pinned version (each engine's `api_key` member, a
     `KeyWay`: llama-server reads the file itself, vLLM gets VLLM_API_KEY from the wrapper that
     reads the file and execs `vllm serve`, SGLang gets a YAML `--config` its entry wrapper
     writes, TensorRT-LLM's trtllm-serve has no key at all, so sparkctl's key-checking relay
     stands in front of it).
The server's record says only that a key is set and where the node's file is (`api_key_file`);
node-side probes read that file as root, `chat`/`bench` read it over SSH (stdout of `sudo cat`,
registered as a secret so no log line shows it).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.commands import Secret, quote
from orchestrator.engines.lifecycle import ServerRecord
from orchestrator.engines.servers import record_dir
from orchestrator.errors import SparkctlError

if TYPE_CHECKING:
    from pathlib import Path

    from orchestrator.core.step import NodeContext, Step
    from orchestrator.remote.transport import Transport

CONTAINER_KEY = "/run/sparkctl/api_key"
"""Where the server's container sees the key file (a read-only bind mount of the node's file)."""
RECORD_FIELD = "api_key_file"
"""The record's field naming the node's key file (absent: the server has no key)."""


@dataclass(frozen=True)
class KeyWay:
    """How an engine's server takes an API key, and what it answers without one."""

    how: str
    """One line for docs and notes: the engine's own mechanism at its pinned version."""
    open_paths: tuple[str, ...]
    """Paths the engine answers without the key; a trailing `*` makes a prefix."""
    guarded_prefix: str = "/"
    """Only paths under this prefix need the key at all (an engine that checks /v1 only)."""
    relay: bool = False
    """The engine takes no key: it binds 127.0.0.1 on an inner port and sparkctl's
    key-checking relay binds --host:--port in front of it."""

    def is_open(self, path: str) -> bool:
        """Whether the engine answers PATH without the key (what status may probe)."""
        if not path.startswith(self.guarded_prefix):
            return True
        return any(path.startswith(p[:-1]) if p.endswith("*") else path == p
                   for p in self.open_paths)


def key_problem(value: str) -> str | None:
    """Why VALUE cannot be an API key, or None: the one rule for every key sparkctl reads
    (launch's, the gateway's, a recorded server's from its node). Printable ASCII only: an
    HTTP header carries nothing else, so a server given a non-ASCII key never matches what a
    client sends, and readiness would wait out its whole --timeout. No `#` first: llama-server's
    --api-key-file reads such a line as a comment and runs with no key at all."""
    if not value:
        return "it is empty: put one key on one line"
    if "\n" in value or "\r" in value:
        return "it must hold one key on one line"
    if any(not "!" <= c <= "~" for c in value):
        return "a key is printable ASCII without spaces (letters, digits, punctuation)"
    if value.startswith("#"):
        return ("a key must not start with '#' (llama-server's --api-key-file reads such a line "
                "as a comment and would serve with no key)")
    return None


def relay_inner_port(port: int) -> int:
    """Where an engine behind sparkctl's key-checking relay listens on 127.0.0.1 (the relay
    holds the server's own port): 10000 above, or below near the top of the range."""
    return port + 10000 if port + 10000 <= 65535 else port - 10000


def relayed_port(way: KeyWay | None, key: Secret | None, port: int) -> int | None:
    """The inner port a launch binds besides its own (proven free first), or None."""
    return relay_inner_port(port) if key is not None and way is not None and way.relay else None


def node_key_file(server: str) -> str:
    """The key on a serving node: next to the server's record, root only."""
    return f"{record_dir(server)}/api_key"


def key_mount(server: str) -> tuple[str, str, bool]:
    """(node path, container path, read-only) for a ContainerSpec's mounts."""
    return (node_key_file(server), CONTAINER_KEY, True)


@functools.lru_cache(maxsize=8)
def _stretched(value: str, server: str) -> str:
    return hashlib.pbkdf2_hmac("sha256", value.encode(), f"sparkctl-api-key:{server}".encode(),
                               200_000).hex()[:16]


def key_digest(key: Secret, server: str) -> str:
    """What a container's configuration hash holds of the key, so a new key restarts the
    server: a slow salted digest (PBKDF2, 200k rounds), never the key, and useless to guess
    a strong key from."""
    return _stretched(key.reveal(), server)


def key_facts(server: str) -> dict[str, Any]:
    """The facts request for the node's key file: its sha256 and mode, never its content."""
    return {"files": {node_key_file(server): False}}


def key_files_step(server: str, nodes: list[str], key: Secret | None) -> Step:
    """Write the key to every serving node (0600 root, on stdin through the ledger): a no-op
    when it is there already with that content and mode."""
    from orchestrator.phases.files import FileSpec, ManagedFiles

    def render(ctx: NodeContext) -> list[FileSpec]:
        if key is None or ctx.node.name not in nodes:
            return []
        return [FileSpec(node_key_file(server), 0o600, key.reveal() + "\n", secret=True)]

    return ManagedFiles("api-key", render)


def record_fields(server: str, key: Secret | None) -> dict[str, Any]:
    """What a server's record says of its key: where the node's file is, or nothing."""
    return {RECORD_FIELD: node_key_file(server)} if key is not None else {}


def bearer(key: Secret | str | None) -> dict[str, str]:
    """The header sparkctl's clients send (empty without a key)."""
    if key is None:
        return {}
    value = key.reveal() if isinstance(key, Secret) else key
    return {"Authorization": f"Bearer {value}"}


def read_node_key(transport: Transport, server: ServerRecord) -> Secret | None:
    """The key of a recorded server, read from its node's file over SSH (stdout, never argv);
    None when the record says it has none."""
    from orchestrator.state import register_secret

    path = server.api_key_file
    if not path:
        return None
    result = transport.run(f"cat {quote(path)}", sudo=True, timeout=30,
                           display=f"read the API key of {server.name} ({path})")
    value = result.stdout.strip()
    if not result.ok or not value:
        raise SparkctlError(
            f"{transport.node}: server {server.name} has an API key, but its file {path} "
            f"cannot be read ({result.stderr.strip()[:200] or 'empty'}); relaunch it with "
            "--api-key-file, or pass the key file to this command with --api-key-file")
    problem = key_problem(value)
    if problem:  # (a file written by hand on the node: no client could send it)
        raise SparkctlError(
            f"{transport.node}: server {server.name}'s API key file {path}: {problem}; "
            "relaunch it with a valid --api-key-file")
    secret = Secret(value)
    register_secret(secret)
    return secret


def probe_host(host: str) -> str:
    """Where a probe on the serving node reaches a server bound to HOST (a wildcard bind
    answers on loopback; a fabric address only on itself)."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "localhost", "") else host


def key_copy(transport: Transport, server: ServerRecord, folder: Path) -> str | None:
    """For a relaunch of a server with an API key (`bench --sweep`): its key, read from the
    node, in a 0600 file of FOLDER (the caller's private temporary folder, removed with it)."""
    key = read_node_key(transport, server)
    if key is None:
        return None
    path = folder / "api.key"
    path.touch(mode=0o600)
    path.write_text(key.reveal() + "\n")
    return str(path)


def key_note(server: ServerRecord, node: str) -> str:
    """What `tunnel` says of a server with a key: how to send it, never the key."""
    return (f"The server needs its API key: send `Authorization: Bearer <key>` (OpenAI clients: "
            "api_key=<key>), the key being the one line of the --api-key-file it was launched "
            f"with (on {node}: {server.api_key_file}, root only).")


def env_from_file(variable: str, key_file: str) -> str:
    """A shell prefix that exports VARIABLE from the node's key file inside the container (the
    run dir is mounted there) right before the wrapper execs the engine: the key is in the
    engine's environment only, never in a command line or the container's configuration."""
    return f'{variable}="$(cat {quote(key_file)})"; export {variable}; '
