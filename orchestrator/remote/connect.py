"""Opening verified SSH connections to every node, in parallel.

Where to connect and with what is resolved like OpenSSH (remote/sshconfig.py): the inventory,
then ~/.ssh/config, then defaults. Keys: ssh-agent (agent-only keys included), key files (a
passphrase is asked once on a terminal and shared across nodes), the default ~/.ssh/id_* keys.
Jump hosts (ProxyJump, chained) are reached first, and the node through a direct-tcpip channel
of the last one; ProxyCommand runs the user's command as the socket.

Host keys, on every hop: checked against sparkctl's pinned file (cluster.known_hosts) and the
user's known_hosts files (hashed entries and [host]:port included) with a reject policy. With
--trust-new-hosts an unknown key is pinned in cluster.known_hosts on first use; a key that
differs from a known one is always refused. Only connection errors are retried.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from orchestrator.errors import HostKeyError, TransportError
from orchestrator.remote import keeper, sshkeys
from orchestrator.remote.cluster import parallel
from orchestrator.remote.sshconfig import Hop, Route, resolve
from orchestrator.remote.sshkeys import KeyStore, auth_message, fingerprint, strategy
from orchestrator.remote.transport import (
    LocalTransport,
    SSHTransport,
    SudoPassword,
    Transport,
    is_local_host,
    trace_event,
)

if TYPE_CHECKING:  # (pydantic's models: an early connection from kept routes needs none)
    from orchestrator.inventory import Inventory, Node

log = logging.getLogger("sparkctl.connect")


class _Retryable(Exception):
    """A connect failure worth another try (refused, reset, timed out)."""


class ReachError(TransportError):
    """TCP (or the jump host's forward) to a hop failed."""


class AuthError(TransportError):
    """The hop's sshd refused every key offered."""


_fingerprint = fingerprint


def sudo_password_files(inventory: Inventory) -> dict[str, Path]:
    """Per-node sudo password files: nodes[].sudo_password_file, else cluster's."""
    files: dict[str, Path] = {}
    for node in inventory.nodes:
        value = node.sudo_password_file or inventory.cluster.sudo_password_file
        if value:
            files[node.name] = inventory.path_setting(value)
    return files


# ---------------------------------------------------------------- host keys


def _policy(route: Route, hop: Hop, trust_new_hosts: bool, pin_lock: threading.Lock) -> Any:
    import paramiko

    files = route.known_hosts_files(hop)

    class Reject(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key):  # type: ignore[no-untyped-def]
            read = ", ".join(str(f) for f in files if f.exists()) or "no file"
            kind = {"ssh-ed25519": "ed25519", "ssh-rsa": "rsa"}.get(
                key.get_name(), "ecdsa" if key.get_name().startswith("ecdsa") else key.get_name())
            keyscan = (f"ssh-keyscan -t {kind} "
                       f"{'-p ' + str(hop.port) + ' ' if hop.port != 22 else ''}{hop.hostname}")
            raise HostKeyError(
                f"{route.node}: {_role(route, hop)}{hop.describe()}'s host key is not in "
                f"known_hosts ({read}); "
                f"refusing to connect to an unverified host (it offered {key.get_name()} "
                f"{_fingerprint(key)}). Run once with --trust-new-hosts to pin it in "
                f"{route.pinned}, or add it yourself: `{keyscan} >> {route.pinned}` after "
                "comparing the fingerprint with the host's own (`ssh-keygen -lf "
                "/etc/ssh/ssh_host_ed25519_key.pub` on it)"
            )

    class Pin(paramiko.MissingHostKeyPolicy):
        """Trust on first use, explicitly asked for: the key is written to the pinned file."""

        def missing_host_key(self, client, hostname, key):  # type: ignore[no-untyped-def]
            pinned = route.pinned
            with pin_lock:
                pinned.parent.mkdir(parents=True, exist_ok=True)
                with pinned.open("a") as handle:
                    handle.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
                pinned.chmod(0o600 if pinned.stat().st_mode & 0o077 == 0 else 0o644)
            client.get_host_keys().add(hostname, key.get_name(), key)

    return Pin() if trust_new_hosts else Reject()


def _load_host_keys(client: Any, route: Route, hop: Hop) -> None:
    if route.pinned.exists():
        client.load_host_keys(str(route.pinned))
    for path in hop.known_hosts:
        if path != route.pinned and path.is_file():
            try:
                client.load_system_host_keys(str(path))
            except OSError as exc:
                log.warning("cannot read %s: %s", path, exc)


# ---------------------------------------------------------------- connecting


def _role(route: Route, hop: Hop) -> str:
    """"the jump host " for a hop in front of the node: a failure there is not the node's, and
    its address alone would read as the node's."""
    return "the jump host " if hop is not route.target else ""


def _connect_hop(route: Route, hop: Hop, sock: Any, trust_new_hosts: bool,
                 pin_lock: threading.Lock, keys: KeyStore, via: str) -> Any:
    import paramiko

    client = paramiko.SSHClient()
    _load_host_keys(client, route, hop)
    client.set_missing_host_key_policy(_policy(route, hop, trust_new_hosts, pin_lock))
    agent, agent_keys = sshkeys.agent_keys()
    if sock is None and hop.proxy_command:
        try:
            sock = paramiko.ProxyCommand(hop.proxy_command)
        except (paramiko.SSHException, OSError) as exc:
            raise ReachError(f"{route.node}: ProxyCommand `{hop.proxy_command}` failed: {exc}") from None
    try:
        client.sparkctl_auth = client.connect(  # type: ignore[attr-defined,func-returns-value]
            hop.hostname, port=hop.port, username=hop.user, sock=sock,
            timeout=hop.connect_timeout, banner_timeout=hop.connect_timeout,
            auth_timeout=hop.connect_timeout, auth_strategy=strategy(hop, keys, agent_keys),
        )
    except paramiko.BadHostKeyException as exc:
        client.close()
        raise HostKeyError(
            f"{route.node}: HOST KEY CHANGED for {_role(route, hop)}{hop.describe()}{via}: expected "
            f"{_fingerprint(exc.expected_key)}, got {_fingerprint(exc.key)}. This can be an "
            f"attack; if the host was reinstalled, remove its old line from known_hosts "
            f"({', '.join(str(f) for f in route.known_hosts_files(hop) if f.exists())}) and "
            "verify the new fingerprint. --trust-new-hosts never overrides a changed key"
        ) from None
    except paramiko.AuthenticationException as exc:
        client.close()
        raise AuthError(auth_message(route, hop, exc, agent is not None, len(agent_keys))) from None
    except HostKeyError:
        client.close()
        raise
    except paramiko.SSHException as exc:
        client.close()
        raise _Retryable(f"{route.node}: SSH to {_role(route, hop)}{hop.address}{via} failed: "
                         f"{exc}") from None
    except (OSError, EOFError) as exc:
        client.close()
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise _Retryable(f"{route.node}: cannot reach {_role(route, hop)}{hop.address}{via}: "
                         f"{reason}") from None
    finally:
        if agent is not None:
            agent.close()
    transport = client.get_transport()
    if transport is not None:
        transport.set_keepalive(hop.keepalive)
    return client


def open_route(route: Route, trust_new_hosts: bool, pin_lock: threading.Lock,
               keys: KeyStore | None = None) -> tuple[Any, list[Any]]:
    """Connect through every hop; returns (the node's client, the jump clients to close after)."""
    import paramiko

    keys = keys or sshkeys.KEYS
    clients: list[Any] = []
    sock: Any = None
    try:
        for index, hop in enumerate(route.hops):
            previous = route.hops[index - 1] if index else None
            via = f" (through {previous.describe()})" if previous else ""
            if previous is not None:
                try:
                    sock = clients[-1].get_transport().open_channel(
                        "direct-tcpip", (hop.hostname, hop.port), ("127.0.0.1", 0),
                        timeout=hop.connect_timeout)
                except (paramiko.SSHException, OSError, EOFError) as exc:
                    raise _Retryable(
                        f"{route.node}: cannot reach {hop.address}{via}: the jump host could not "
                        f"connect ({exc or type(exc).__name__})") from None
            clients.append(_connect_hop(route, hop, sock, trust_new_hosts, pin_lock, keys, via))
    except BaseException:
        for client in reversed(clients):
            client.close()
        raise
    return clients[-1], clients[:-1]


def open_ssh(
    inventory: Inventory, node: Node, sudo_password: SudoPassword, trust_new_hosts: bool,
    pin_lock: threading.Lock, route: Route | None = None,
) -> SSHTransport:
    return open_route_ssh(route or resolve(inventory, node), inventory.cluster.command_timeout,
                          sudo_password, trust_new_hosts, pin_lock)


def open_route_ssh(route: Route, command_timeout: float, sudo_password: SudoPassword,
                   trust_new_hosts: bool, pin_lock: threading.Lock) -> SSHTransport:
    """The node's connection along ROUTE (every hop's host key verified)."""
    for warning in route.warnings:
        log.warning("%s", warning)
    if not trust_new_hosts:
        for hop in route.hops:
            files = route.known_hosts_files(hop)
            if not any(f.exists() for f in files):
                raise HostKeyError(
                    f"{route.node}: no known_hosts file exists ({', '.join(map(str, files))} do "
                    f"not exist), so {hop.describe()}'s host key cannot be verified. Add the key "
                    "(ssh-keyscan, then compare its fingerprint) or run once with "
                    "--trust-new-hosts to pin it"
                )

    @retry(
        retry=retry_if_exception_type(_Retryable),
        stop=stop_after_attempt(3),
        wait=wait_exponential(multiplier=0.5, max=4),
        reraise=True,
    )
    def attempt() -> SSHTransport:
        client, jumps = open_route(route, trust_new_hosts, pin_lock)
        return SSHTransport(route.node, client, route.target.user, sudo_password,
                            command_timeout, jumps=jumps)

    started, opened = time.time(), False
    try:
        transport = attempt()
        opened = True
        return transport
    except _Retryable as exc:
        raise ReachError(str(exc)) from None
    finally:
        trace_event("connect", route.node, started, time.time(), host=route.target.alias,
                    ok=opened)


def connect_all(
    inventory: Inventory, nodes: list[Node], sudo_password: SudoPassword,
    trust_new_hosts: bool = False,
) -> tuple[dict[str, Transport], dict[str, str]]:
    """Connect to every node in parallel; returns (transports, errors by node name)."""
    routes = {node.name: resolve(inventory, node) for node in nodes}
    local = {name for name, route in routes.items() if is_local(route)}
    ssh = _kept_or_direct([r for name, r in routes.items() if name not in local],
                          inventory.cluster.command_timeout, sudo_password, trust_new_hosts)

    def one(name: str) -> Transport:
        if name in local:
            return LocalTransport(name, inventory.cluster.user, sudo_password,
                                  inventory.cluster.command_timeout)
        return ssh(name)

    return connect_each(one, list(routes))


def connect_routes(routes: list[Route], command_timeout: float, sudo_password: SudoPassword,
                   trust_new_hosts: bool = False) -> tuple[dict[str, Transport], dict[str, str]]:
    """connect_all for routes resolved before (core/speculate.py: kept from the last run);
    SSH only (a local node has no connection worth opening early)."""
    return connect_each(_kept_or_direct(routes, command_timeout, sudo_password, trust_new_hosts),
                        [route.node for route in routes])


def _kept_or_direct(routes: list[Route], command_timeout: float, sudo_password: SudoPassword,
                    trust_new_hosts: bool) -> Callable[[str], Transport]:
    """Each node's connection: the keeper's when it holds the route (remote/keeper.py), else
    one of this run's own, which the keeper takes over when the run ends."""
    pin_lock = threading.Lock()
    by_name = {route.node: route for route in routes}
    kept = keeper.held(routes)

    def one(name: str) -> Transport:
        route = by_name[name]

        def direct() -> SSHTransport:
            return open_route_ssh(route, command_timeout, sudo_password, trust_new_hosts, pin_lock)

        if name in kept:
            now = time.time()
            trace_event("connect", name, now, now, host=route.target.alias, ok=True, kept=True)
            return keeper.KeptTransport(route, kept[name], command_timeout, sudo_password, direct)
        transport = direct()
        keeper.remember(route)
        return transport

    return one


def is_local(route: Route) -> bool:
    """This machine is the node itself: commands run here, with no SSH."""
    return not route.jumps and not route.target.proxy_command and \
        is_local_host(route.target.hostname)


def connect_each(one: Callable[[str], Transport], names: list[str]
                 ) -> tuple[dict[str, Transport], dict[str, str]]:
    """ONE(name) for every name in parallel: (transports, errors by name); a failure that is
    not the network's (bad input, a bug) closes the others and is raised."""
    transports: dict[str, Transport] = {}
    errors: dict[str, str] = {}
    outcomes = parallel(one, names)
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
