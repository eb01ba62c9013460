"""How sparkctl reaches a node, resolved the way OpenSSH resolves `ssh HOST`.

Order, per setting: the inventory's value when it sets one, then the user's ssh_config
(`cluster.ssh_config`, default ~/.ssh/config: Host/Match blocks, first value wins, read with
paramiko's SSHConfig), then the defaults. So `nodes[].host: spark-a` works whenever
`ssh spark-a` works: HostName, User, Port, IdentityFile, IdentitiesOnly, ProxyJump,
ProxyCommand, ConnectTimeout, ServerAliveInterval and UserKnownHostsFile/GlobalKnownHostsFile
come from there. `StrictHostKeyChecking no` (or accept-new/off) is ignored with a warning:
sparkctl always verifies host keys.

Pure over files: no network. paramiko is imported on first use only (`sparkctl --help`
imports click alone).
"""

from __future__ import annotations

import getpass
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import InputError

if TYPE_CHECKING:  # (the inventory's models need pydantic: a kept route is read without it)
    from orchestrator.inventory import Inventory, Node

DEFAULT_KEYS = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
DEFAULT_USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
DEFAULT_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
DEFAULT_KEEPALIVE = 15
NO_CHECKING = ("no", "off", "accept-new")


@dataclass(frozen=True)
class KeyFile:
    path: Path
    source: str
    """"inventory" (cluster.ssh_key), "ssh_config" (IdentityFile) or "default" (~/.ssh/id_*)."""


@dataclass(frozen=True)
class Hop:
    """One SSH connection of a chain: a jump host or the node itself."""

    alias: str
    """What was asked for: the inventory's host, or one ProxyJump entry."""
    hostname: str
    port: int
    user: str
    key_files: tuple[KeyFile, ...]
    identities_only: bool
    proxy_command: str | None
    connect_timeout: float
    keepalive: int
    known_hosts: tuple[Path, ...]
    """Files read for host keys besides the pinned one (the user's and the system's)."""
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    """Where each setting came from: inventory, ssh_config, spec (user@host:port), default."""

    @property
    def allow_agent(self) -> bool:
        """Agent keys beyond the named identity files: unless IdentitiesOnly (as OpenSSH)."""
        return not self.identities_only

    @property
    def address(self) -> str:
        return f"[{self.hostname}]:{self.port}" if ":" in self.hostname else f"{self.hostname}:{self.port}"

    def describe(self) -> str:
        return f"{self.user}@{self.address}"


@dataclass(frozen=True)
class Route:
    """How one node is reached: optional jump hops, then the node."""

    node: str
    target: Hop
    jumps: tuple[Hop, ...]
    pinned: Path
    """sparkctl's own known_hosts (cluster.known_hosts): read, and written by --trust-new-hosts."""
    config_file: Path | None
    warnings: tuple[str, ...] = ()

    @property
    def hops(self) -> tuple[Hop, ...]:
        return (*self.jumps, self.target)

    def known_hosts_files(self, hop: Hop) -> list[Path]:
        files = [self.pinned]
        for path in hop.known_hosts:
            if path not in files:
                files.append(path)
        return files

    def record(self) -> dict[str, Any]:
        """The route as JSON (paths, names and numbers: no secret), to be read by `of_record`."""
        return json_ready(asdict(self))

    @classmethod
    def of_record(cls, data: dict[str, Any]) -> Route:
        """A route `record` wrote (KeyError, TypeError or ValueError when it is not one)."""
        def hop(h: dict[str, Any]) -> Hop:
            keys = tuple(KeyFile(Path(k["path"]), str(k["source"])) for k in h["key_files"])
            return Hop(str(h["alias"]), str(h["hostname"]), int(h["port"]), str(h["user"]), keys,
                       bool(h["identities_only"]), h["proxy_command"], float(h["connect_timeout"]),
                       int(h["keepalive"]), tuple(Path(p) for p in h["known_hosts"]),
                       dict(h["sources"]))

        return cls(str(data["node"]), hop(data["target"]), tuple(hop(j) for j in data["jumps"]),
                   Path(data["pinned"]),
                   Path(data["config_file"]) if data["config_file"] is not None else None,
                   tuple(str(w) for w in data["warnings"]))


def json_ready(value: Any) -> Any:
    """asdict() output with paths as text and tuples as lists."""
    if isinstance(value, dict):
        return {key: json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    return str(value) if isinstance(value, Path) else value


def config_path(inventory: Inventory) -> Path | None:
    value = inventory.cluster.ssh_config
    if not value:
        return None
    return inventory.path_setting(value)


_CACHE: dict[tuple[str, float], Any] = {}


class _NoConfig:
    """What an empty paramiko SSHConfig answers, without importing paramiko (a run whose
    connections the keeper holds imports no SSH code at all: remote/keeper.py)."""

    @staticmethod
    def lookup(host: str) -> dict[str, Any]:
        return {"hostname": host}


def load_config(path: Path | None) -> Any:
    """paramiko SSHConfig of `path` (an empty one when the file is absent); parse errors are
    bad input naming the file."""
    if path is None or not path.is_file():
        return _NoConfig()
    import paramiko

    try:
        stamp = path.stat().st_mtime
        key = (str(path), stamp)
        if key not in _CACHE:
            _CACHE[key] = paramiko.SSHConfig.from_path(str(path))
        return _CACHE[key]
    except (paramiko.ssh_exception.ConfigParseError, OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read this ssh_config: {exc}") from None


def _first(options: dict[str, Any], name: str) -> str | None:
    value = options.get(name)
    if isinstance(value, list):
        return value[0] if value else None
    return value


def _int(value: str, what: str, where: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise InputError(f"{where}: {what} {value!r} is not a number") from None


def _expand(path: str) -> Path:
    return Path(path).expanduser()


def _known_hosts(options: dict[str, Any]) -> tuple[Path, ...]:
    user = (_first(options, "userknownhostsfile") or " ".join(DEFAULT_USER_KNOWN_HOSTS)).split()
    system = (_first(options, "globalknownhostsfile") or " ".join(DEFAULT_GLOBAL_KNOWN_HOSTS)).split()
    return tuple(_expand(p) for p in [*user, *system] if p.lower() != "none")


def parse_jump(spec: str) -> tuple[str | None, str, int | None]:
    """One ProxyJump entry: [user@]host[:port] or ssh://[user@]host[:port]."""
    text = spec.strip()
    if text.startswith("ssh://"):
        text = text[len("ssh://"):]
    user = None
    if "@" in text:
        user, text = text.rsplit("@", 1)
    port = None
    if text.startswith("["):  # [v6]:port
        host, _, rest = text[1:].partition("]")
        if rest.startswith(":"):
            port = int(rest[1:])
    elif text.count(":") == 1:
        host, raw = text.split(":")
        port = int(raw) if raw.isdigit() else None
        if port is None:
            raise InputError(f"jump host {spec!r}: the port must be a number")
    else:
        host = text
    if not host:
        raise InputError(f"jump host {spec!r} names no host")
    return user, host, port


def resolve(inventory: Inventory, node: Node) -> Route:
    """The route to `node`: inventory first, then ssh_config, then defaults."""
    cluster = inventory.cluster
    explicit = cluster.model_fields_set
    path = config_path(inventory)
    config = load_config(path)
    where = str(path) if path else "ssh_config"
    warnings: list[str] = []
    options = config.lookup(node.host)
    sources: dict[str, str] = {}

    hostname = _first(options, "hostname") or node.host
    sources["hostname"] = "ssh_config" if hostname != node.host else "inventory"
    if "ssh_port" in explicit:
        port, sources["port"] = cluster.ssh_port, "inventory"
    elif _first(options, "port"):
        port, sources["port"] = _int(_first(options, "port") or "", "Port", where), "ssh_config"
    else:
        port, sources["port"] = cluster.ssh_port, "default"
    if "user" in explicit:
        user, sources["user"] = cluster.user, "inventory"
    elif _first(options, "user"):
        user, sources["user"] = _first(options, "user") or "", "ssh_config"
        if user != cluster.user:
            warnings.append(
                f"{node.name}: logging in as {user} (User in {where}) while cluster.user is "
                f"{cluster.user}: set cluster.user to the Sparks' user if it is not {cluster.user}"
            )
    else:
        user, sources["user"] = cluster.user, "default"

    keys: list[KeyFile] = []
    if cluster.ssh_key:
        keys.append(KeyFile(inventory.path_setting(cluster.ssh_key), "inventory"))
    keys += [KeyFile(_expand(p), "ssh_config") for p in options.get("identityfile", [])]
    if not keys:
        keys = [KeyFile(_expand(p), "default") for p in DEFAULT_KEYS if _expand(p).exists()]
    if cluster.ssh_key and not keys[0].path.exists():
        raise InputError(
            f"{inventory.source}: cluster.ssh_key: {keys[0].path} does not exist "
            "(the private key that reaches the nodes' management address; leave ssh_key out "
            "to use ssh-agent, ~/.ssh/config and your default keys)"
        )
    keys = [k for k in keys if k.path.exists()]
    identities_only = (_first(options, "identitiesonly") or "no").lower() == "yes"

    if "connect_timeout" in explicit:
        timeout = cluster.connect_timeout
    elif _first(options, "connecttimeout"):
        timeout = float(_int(_first(options, "connecttimeout") or "", "ConnectTimeout", where))
    else:
        timeout = cluster.connect_timeout
    alive = _first(options, "serveraliveinterval")
    keepalive = _int(alive, "ServerAliveInterval", where) if alive else DEFAULT_KEEPALIVE

    checking = (_first(options, "stricthostkeychecking") or "").lower()
    if checking in NO_CHECKING:
        warnings.append(
            f"{node.name}: `StrictHostKeyChecking {checking}` in {where} is ignored: sparkctl "
            "always verifies host keys (run once with --trust-new-hosts to pin new ones)"
        )

    jump_spec = node.proxy_jump or cluster.proxy_jump
    if jump_spec is not None:
        sources["proxy_jump"] = "inventory"
    else:
        jump_spec = _first(options, "proxyjump")
        sources["proxy_jump"] = "ssh_config" if jump_spec else "default"
    proxy_command = _first(options, "proxycommand")
    if proxy_command and proxy_command.lower() == "none":
        proxy_command = None
    if jump_spec and jump_spec.lower() == "none":
        jump_spec = None
    if jump_spec:
        proxy_command = None  # an explicit jump wins, as the first-obtained value in OpenSSH
    sources["key"] = ",".join(sorted({k.source for k in keys})) or "agent"
    target = Hop(node.host, hostname, port, user, tuple(keys), identities_only, proxy_command,
                 timeout, keepalive, _known_hosts(options), sources)
    jumps = tuple(_jump_hop(inventory, config, spec, timeout)
                  for spec in (jump_spec or "").split(",") if spec.strip())
    return Route(node.name, target, jumps, inventory.path_setting(cluster.known_hosts), path,
                 tuple(warnings))


def _jump_hop(inventory: Inventory, config: Any, spec: str, timeout: float) -> Hop:
    """A jump host: its own ssh_config block (HostName, User, Port, IdentityFile ...)."""
    spec_user, host, spec_port = parse_jump(spec)
    options = config.lookup(host)
    sources: dict[str, str] = {}
    hostname = _first(options, "hostname") or host
    sources["hostname"] = "ssh_config" if hostname != host else "spec"
    if spec_port is not None:
        port, sources["port"] = spec_port, "spec"
    elif _first(options, "port"):
        port, sources["port"] = int(_first(options, "port") or "22"), "ssh_config"
    else:
        port, sources["port"] = 22, "default"
    if spec_user:
        user, sources["user"] = spec_user, "spec"
    elif _first(options, "user"):
        user, sources["user"] = _first(options, "user") or "", "ssh_config"
    else:  # as OpenSSH: the local user name, not the Sparks' user
        user, sources["user"] = getpass.getuser(), "default"
    keys = [KeyFile(_expand(p), "ssh_config") for p in options.get("identityfile", [])]
    if inventory.cluster.ssh_key:
        keys.append(KeyFile(inventory.path_setting(inventory.cluster.ssh_key), "inventory"))
    if not keys:
        keys = [KeyFile(_expand(p), "default") for p in DEFAULT_KEYS]
    keys = [k for k in keys if k.path.exists()]
    sources["key"] = ",".join(sorted({k.source for k in keys})) or "agent"
    alive = _first(options, "serveraliveinterval")
    identities_only = (_first(options, "identitiesonly") or "no").lower() == "yes"
    return Hop(spec.strip(), hostname, port, user, tuple(keys), identities_only, None, timeout,
               int(alive) if alive and alive.isdigit() else DEFAULT_KEEPALIVE,
               _known_hosts(options), sources)
