"""Opening verified SSH connections to every node, in parallel.

Host keys: checked against the inventory's known_hosts with paramiko's RejectPolicy. With
--trust-new-hosts an unknown key is pinned (appended to that file) on first use; a key that
differs from the pinned one is always refused. Only connection errors are retried.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from orchestrator.errors import HostKeyError, InputError, TransportError
from orchestrator.inventory import Inventory, Node
from orchestrator.remote.cluster import parallel
from orchestrator.remote.transport import (
    LocalTransport,
    SSHTransport,
    SudoPassword,
    Transport,
    is_local_host,
    trace_event,
)

KEEPALIVE_SECONDS = 15


class _Retryable(Exception):
    """A connect failure worth another try (refused, reset, timed out)."""


def _pinning_policy(known_hosts: Path, lock: threading.Lock):  # type: ignore[no-untyped-def]
    import paramiko

    class PinNewHostKey(paramiko.MissingHostKeyPolicy):
        """Trust on first use, explicitly asked for: the key is written to known_hosts."""

        def missing_host_key(self, client, hostname, key):  # type: ignore[no-untyped-def]
            with lock:
                known_hosts.parent.mkdir(parents=True, exist_ok=True)
                with known_hosts.open("a") as handle:
                    handle.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
                known_hosts.chmod(0o600 if known_hosts.stat().st_mode & 0o077 == 0 else 0o644)
            client.get_host_keys().add(hostname, key.get_name(), key)

    return PinNewHostKey()


def _fingerprint(key: object) -> str:
    import base64
    import hashlib

    digest = hashlib.sha256(key.asbytes()).digest()  # type: ignore[attr-defined]
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def open_ssh(
    inventory: Inventory, node: Node, sudo_password: SudoPassword, trust_new_hosts: bool,
    pin_lock: threading.Lock,
) -> SSHTransport:
    import paramiko

    cluster = inventory.cluster
    key_file = inventory.path_setting(cluster.ssh_key)
    known_hosts = inventory.path_setting(cluster.known_hosts)
    if not key_file.exists():
        raise InputError(
            f"{inventory.source}: cluster.ssh_key: {key_file} does not exist "
            "(the private key that reaches the nodes' management address)"
        )
    if not key_file.is_file():
        from orchestrator.yamlio import file_kind

        raise InputError(f"{inventory.source}: cluster.ssh_key: {key_file} is "
                         f"{file_kind(key_file.stat().st_mode)}, not a private key file")
    if known_hosts.exists() and not known_hosts.is_file():
        from orchestrator.yamlio import file_kind

        raise InputError(f"{inventory.source}: cluster.known_hosts: {known_hosts} is "
                         f"{file_kind(known_hosts.stat().st_mode)}, not a known_hosts file")
    if not known_hosts.exists() and not trust_new_hosts:
        raise HostKeyError(
            f"{node.name}: known_hosts file {known_hosts} does not exist, so {node.host}'s host key "
            "cannot be verified. Add the key (ssh-keyscan, then compare its fingerprint) or run "
            "once with --trust-new-hosts to pin it"
        )

    @retry(
        retry=retry_if_exception_type(_Retryable),
        stop=stop_after_attempt(3),
        wait=wait_exponential(multiplier=0.5, max=4),
        reraise=True,
    )
    def attempt() -> SSHTransport:
        client = paramiko.SSHClient()
        if known_hosts.exists():
            client.load_host_keys(str(known_hosts))
        policy = _pinning_policy(known_hosts, pin_lock) if trust_new_hosts else paramiko.RejectPolicy()
        client.set_missing_host_key_policy(policy)
        try:
            client.connect(
                node.host, port=cluster.ssh_port, username=cluster.user, key_filename=str(key_file),
                look_for_keys=False, allow_agent=False, timeout=cluster.connect_timeout,
                banner_timeout=cluster.connect_timeout, auth_timeout=cluster.connect_timeout,
            )
        except paramiko.BadHostKeyException as exc:
            raise HostKeyError(
                f"{node.name}: HOST KEY CHANGED for {node.host}: expected {_fingerprint(exc.expected_key)}, "
                f"got {_fingerprint(exc.key)}. This can be an attack; if the node was reinstalled, "
                f"remove the old line from {known_hosts} and verify the new fingerprint. "
                "--trust-new-hosts never overrides a changed key"
            ) from None
        except paramiko.SSHException as exc:
            if "not found in known_hosts" in str(exc):
                raise HostKeyError(
                    f"{node.name}: {node.host}'s host key is not in {known_hosts}; refusing to "
                    "connect to an unverified host. Add its key, or run once with --trust-new-hosts "
                    "to pin it"
                ) from None
            if isinstance(exc, paramiko.AuthenticationException):
                raise TransportError(
                    f"{node.name}: {cluster.user}@{node.host} refused the key {key_file}: "
                    f"authentication failed"
                ) from None
            raise _Retryable(f"{node.name}: SSH to {node.host}:{cluster.ssh_port} failed: {exc}") from None
        except (OSError, EOFError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise _Retryable(
                f"{node.name}: cannot reach {node.host}:{cluster.ssh_port}: {reason}"
            ) from None
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(KEEPALIVE_SECONDS)
        return SSHTransport(node.name, client, cluster.user, sudo_password, cluster.command_timeout)

    started, opened = time.time(), False
    try:
        transport = attempt()
        opened = True
        return transport
    except _Retryable as exc:
        raise TransportError(str(exc)) from None
    finally:
        trace_event("connect", node.name, started, time.time(), host=node.host, ok=opened)


def connect_all(
    inventory: Inventory, nodes: list[Node], sudo_password: SudoPassword,
    trust_new_hosts: bool = False,
) -> tuple[dict[str, Transport], dict[str, str]]:
    """Connect to every node in parallel; returns (transports, errors by node name)."""
    pin_lock = threading.Lock()

    def one(node: Node) -> Transport:
        if is_local_host(node.host):
            return LocalTransport(node.name, inventory.cluster.user, sudo_password,
                                  inventory.cluster.command_timeout)
        return open_ssh(inventory, node, sudo_password, trust_new_hosts, pin_lock)

    transports: dict[str, Transport] = {}
    errors: dict[str, str] = {}
    by_name = {node.name: node for node in nodes}
    outcomes = parallel(lambda name: one(by_name[name]), by_name)
    for name, outcome in outcomes.items():
        if isinstance(outcome.error, TransportError):
            errors[name] = str(outcome.error)
        elif outcome.ok:
            transports[name] = outcome.get()
    for outcome in outcomes.values():
        if outcome.error is not None and not isinstance(outcome.error, TransportError):
            for transport in transports.values():
                transport.close()
            outcome.get()  # bad input (InputError) or a bug: raised after closing the others
    return transports, errors
