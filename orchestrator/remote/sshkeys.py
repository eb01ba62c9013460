"""The keys sparkctl offers a node's sshd, resolved like OpenSSH does.

ssh-agent keys (agent-only ones included), the key files the inventory or ~/.ssh/config name
(or the default ~/.ssh/id_*), in OpenSSH's order; a passphrase-protected file is unlocked
only when nothing before it worked, asked once per run on a terminal and shared by every
node, and off a terminal the message names the file and `ssh-add`.
"""

from __future__ import annotations

import base64
import getpass
import os
import sys
import threading
from pathlib import Path
from typing import Any

from orchestrator.remote.sshconfig import Hop, KeyFile, Route

PASSPHRASE_TRIES = 3


class KeyLocked(Exception):
    """A passphrase-protected key that could not be unlocked (no terminal, wrong passphrase)."""


def fingerprint(key: object) -> str:
    import hashlib

    digest = hashlib.sha256(key.asbytes()).digest()  # type: ignore[attr-defined]
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def public_blob(path: Path) -> bytes | None:
    """The public key of a private key file without decrypting it: its .pub, or the
    unencrypted header of an OpenSSH-format key."""
    pub = path.with_name(path.name + ".pub")
    try:
        if pub.is_file():
            return base64.b64decode(pub.read_text().split()[1])
        text = path.read_text()
    except (OSError, IndexError, ValueError):
        return None
    begin, end = "-----BEGIN OPENSSH PRIVATE KEY-----", "-----END OPENSSH PRIVATE KEY-----"
    if begin not in text:
        return None
    try:
        import paramiko

        body = base64.b64decode("".join(text.split(begin)[1].split(end)[0].split()))
        magic = b"openssh-key-v1\x00"
        if not body.startswith(magic):
            return None
        message = paramiko.Message(body[len(magic):])
        for _ in range(3):  # cipher, kdf, kdf options
            message.get_string()
        if message.get_int() < 1:
            return None
        return message.get_binary()
    except Exception:
        return None


def is_encrypted(path: Path) -> bool:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return False
    if "ENCRYPTED" in text.split("\n\n")[0]:
        return True
    begin = "-----BEGIN OPENSSH PRIVATE KEY-----"
    if begin in text:
        import paramiko

        try:
            body = base64.b64decode("".join(text.split(begin)[1].split("-----END")[0].split()))
            return paramiko.Message(body[len(b"openssh-key-v1\x00"):]).get_text() != "none"
        except Exception:
            return False
    return False


class KeyStore:
    """Private keys loaded once per run and shared by every connection: a passphrase is asked
    at most once per key file (on a terminal), never logged."""

    def __init__(self, prompt: bool | None = None) -> None:
        self._lock = threading.Lock()
        # keyed by the file's identity too: a key file replaced on disk (a new lab, a rotated
        # key) is read again, never answered from memory
        self._keys: dict[tuple[Path, int, int], Any] = {}
        self._failed: dict[tuple[Path, int, int], str] = {}
        self._prompt = prompt

    def can_prompt(self) -> bool:
        return self._prompt if self._prompt is not None else sys.stdin.isatty()

    def load(self, path: Path) -> Any:
        import paramiko

        with self._lock:
            try:
                st = path.stat()
                ident = (path, st.st_ino, st.st_mtime_ns)
            except OSError:
                ident = (path, 0, 0)
            if ident in self._keys:
                return self._keys[ident]
            if ident in self._failed:
                raise KeyLocked(self._failed[ident])
            try:
                key = paramiko.PKey.from_path(str(path))
            except (TypeError, paramiko.PasswordRequiredException):
                key = self._unlock(path, ident)
            except (paramiko.SSHException, ValueError, OSError) as exc:
                self._failed[ident] = f"cannot read the key {path}: {exc}"
                raise KeyLocked(self._failed[ident]) from None
            self._keys[ident] = key
            return key

    def _unlock(self, path: Path, ident: tuple[Path, int, int]) -> Any:
        import paramiko

        if not self.can_prompt():
            self._failed[ident] = (
                f"the key {path} is protected by a passphrase and no terminal is attached to ask "
                f"for it: add it to ssh-agent once (`ssh-add {path}`) and run again"
            )
            raise KeyLocked(self._failed[ident])
        from orchestrator.state import register_secret

        for _ in range(PASSPHRASE_TRIES):
            secret = getpass.getpass(f"[sparkctl] passphrase for key {path}: ")
            register_secret(secret)
            try:
                return paramiko.PKey.from_path(str(path), secret.encode())  # type: ignore[arg-type]
            except (ValueError, TypeError, paramiko.SSHException):
                print("[sparkctl] wrong passphrase", file=sys.stderr)
        self._failed[ident] = f"the passphrase for {path} was wrong {PASSPHRASE_TRIES} times"
        raise KeyLocked(self._failed[ident])


KEYS = KeyStore()
"""The run's keys (one process is one run): a passphrase typed once serves every node."""


def agent_keys() -> tuple[Any, list[Any]]:
    """(agent, its keys); (None, []) when no agent is reachable."""
    if not os.environ.get("SSH_AUTH_SOCK"):
        return None, []
    import paramiko

    try:
        agent = paramiko.Agent()
        return agent, list(agent.get_keys())
    except (paramiko.SSHException, OSError):
        return None, []


def strategy(hop: Hop, keys: KeyStore, agent_keys: list[Any]) -> Any:
    """The keys to offer, in OpenSSH's order: named key files (through the agent when it holds
    them), other agent keys (unless IdentitiesOnly), then key files still needing a
    passphrase, so a passphrase is only asked when nothing else worked."""
    from paramiko.auth_strategy import AuthSource, AuthStrategy, InMemoryPrivateKey

    class FileKey(AuthSource):
        def __init__(self, username: str, key: KeyFile) -> None:
            super().__init__(username=username)
            self.key = key

        def __repr__(self) -> str:
            return f"key file {self.key.path}"

        def authenticate(self, transport: Any) -> Any:
            return transport.auth_publickey(self.username, keys.load(self.key.path))

    class AgentKey(InMemoryPrivateKey):
        def __repr__(self) -> str:
            comment = getattr(self.pkey, "comment", "") or ""
            return f"agent key {fingerprint(self.pkey)} {comment}".strip()

    class Strategy(AuthStrategy):
        def get_sources(self):  # type: ignore[no-untyped-def]
            by_blob = {key.asbytes(): key for key in agent_keys}
            used: set[bytes] = set()
            later: list[KeyFile] = []
            for key in hop.key_files:
                blob = public_blob(key.path)
                if blob is not None and blob in by_blob:
                    used.add(blob)
                    yield AgentKey(hop.user, by_blob[blob])
                elif is_encrypted(key.path):
                    later.append(key)
                else:
                    yield FileKey(hop.user, key)
            if hop.allow_agent:
                for blob, key in by_blob.items():
                    if blob not in used:
                        yield AgentKey(hop.user, key)
            for key in later:
                yield FileKey(hop.user, key)

    import paramiko

    return Strategy(ssh_config=paramiko.SSHConfig())


def copy_id_hint(hop: Hop, key: Path | None) -> str:
    """The ssh-copy-id line that installs `key` for the hop's user (OpenSSH's own tool)."""
    port = f"-p {hop.port} " if hop.port != 22 else ""
    named = f"-i {key}.pub " if key else ""
    return f"ssh-copy-id {named}{port}{hop.user}@{hop.hostname}"


def auth_message(route: Route, hop: Hop, failure: Any, agent_present: bool,
                  agent_count: int) -> str:
    role = "the jump host " if hop is not route.target else ""
    where = f"{route.node}: {role}{hop.describe()}"
    results = list(getattr(failure, "result", []) or [])
    # a key that could not be unlocked was never offered: the server did not refuse it
    locked = [str(r.result) for r in results if isinstance(r.result, KeyLocked)]
    refused = [repr(r.source) for r in results if not isinstance(r.result, KeyLocked)]
    if not results:
        agent = ("ssh-agent holds no keys (`ssh-add -l`)" if agent_present
                 else "no ssh-agent ($SSH_AUTH_SOCK is unset or dead)")
        return (f"{where}: no key to offer: cluster.ssh_key is not set, no IdentityFile applies "
                f"in {route.config_file or 'ssh_config'}, no default key (~/.ssh/id_ed25519, "
                f"id_ecdsa, id_rsa) exists and {agent}. Name a key (cluster.ssh_key or "
                "IdentityFile), or `ssh-add` one")
    if not refused:
        return f"{where}: no key could be offered: " + "; ".join(locked)
    message = f"{where}: authentication failed: the server refused {', '.join(refused)}"
    if locked:
        message += "; not offered: " + "; ".join(locked)
    files = [r.source.key.path for r in results if not isinstance(r.result, KeyLocked)
             and hasattr(r.source, "key")]
    key = files[0] if files else (hop.key_files[0].path if hop.key_files else None)
    return (message + f". Check that the public key is in ~{hop.user}/.ssh/authorized_keys there "
            f"(`{copy_id_hint(hop, key)}`)")
