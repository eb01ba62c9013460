"""The inventory: which Sparks, how to reach them, which fabric interfaces, which engines.

Key names are a contract other tools read (docs/contracts.md): keys may be added, never renamed.
Validation catches what breaks clusters, and every message names the file, the key path and
what would be valid.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator.errors import InputError

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
IFNAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$"
HOST_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,252}$"
JUMP_PATTERN = r"^[A-Za-z0-9_.@:/\[\]-]{1,253}(,[A-Za-z0-9_.@:/\[\]-]{1,253}){0,7}$"
PATH_PATTERN = r"^[^\x00\n]*$"
IMAGE_PATTERN = r"^[a-z0-9][a-z0-9._/:@-]{0,254}$"
DEFAULT_SUBNET_BASE = "192.168.200.0"
FIRST_HOST_NUMBER = 12  # NVIDIA's pages number the first Spark .12

IfName = Annotated[str, Field(pattern=IFNAME_PATTERN)]


def numeric_host_problem(host: str) -> str | None:
    """Why `host` must not be dialled, for a host written as numbers (10.213.8.011, 0x0a.1.2.3,
    10.1): the C resolver reads a leading 0 as octal and 0x as hex and fills short forms in,
    so 10.213.8.011 would silently reach 10.213.8.9. Only canonical dotted quads pass."""
    labels = host.split(".")
    if not all(re.fullmatch(r"[0-9]+|0[xX][0-9a-fA-F]*", label) for label in labels):
        return None  # a name (or IPv6): the resolver reads it as written
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        try:
            dialled = f" (this one would be dialled as {socket.inet_ntoa(socket.inet_aton(host))})"
        except OSError:
            dialled = ""
        return (f"{host!r} is not an IPv4 address as written: the resolver reads a leading 0 as "
                f"octal and 0x as hex{dialled}; write four decimal numbers without leading zeros")
    return None


def _jump_hosts(spec: str) -> list[str]:
    """The host part of each [user@]host[:port] of a ProxyJump list."""
    out = []
    for hop in spec.split(","):
        host = hop.rsplit("@", 1)[-1]
        out.append(host if host.startswith("[") else host.split(":", 1)[0])
    return out


def _check_host(value: str) -> str:
    problem = numeric_host_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _check_jump(value: str | None) -> str | None:
    for host in _jump_hosts(value) if value else []:
        _check_host(host)
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Cluster(_Model):
    name: str = Field(pattern=NAME_PATTERN)
    """Cluster name: shown in reports, the lock owner and container labels."""
    user: str = Field(default="nvidia", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    """SSH user on every node; NVIDIA requires the same user on all Sparks."""
    ssh_key: str | None = Field(default=None, pattern=PATH_PATTERN)
    """Private key for the nodes' management addresses (resolved relative to the inventory);
    left out: ~/.ssh/config's IdentityFile, ssh-agent and the default ~/.ssh/id_* keys."""
    known_hosts: str = Field(default="~/.ssh/known_hosts", pattern=PATH_PATTERN)
    """sparkctl's pinned host keys (read, and written by --trust-new-hosts); the user's
    known_hosts files (ssh_config UserKnownHostsFile, default ~/.ssh/known_hosts) are read too."""
    ssh_config: str = Field(default="~/.ssh/config", pattern=PATH_PATTERN)
    """OpenSSH client config read for HostName, User, Port, IdentityFile, ProxyJump ...
    ("" reads none)."""
    proxy_jump: str | None = Field(default=None, pattern=JUMP_PATTERN)
    """Jump host(s) in front of every node: [user@]host[:port][,...], or "none"."""
    _jump = field_validator("proxy_jump")(_check_jump)
    sudo_password_file: str | None = Field(default=None, pattern=PATH_PATTERN)
    """A file (mode 0600) holding the sudo password of every node; nodes[] may override."""
    ssh_port: int = Field(default=22, ge=1, le=65535)
    """SSH port of the nodes' management sshd (left out: ssh_config's Port, else 22)."""
    management_interface: IfName = "enP7s7"
    """The interface the controller reaches nodes through; sparkctl never reconfigures it."""
    head: str | None = Field(default=None, pattern=NAME_PATTERN)
    """Name of the head node (MPI rank 0, the one that serves); default: the first node."""
    connect_timeout: float = Field(default=10.0, gt=0, le=300)
    """Seconds to wait for an SSH connection before calling a node unreachable."""
    command_timeout: float = Field(default=300.0, gt=0, le=86400)
    """Default seconds a remote command may run before it counts as hung."""
    hf_cache: str = Field(default="~/.cache/huggingface", pattern=r"^[~/][^\x00\n]*$")
    """Node directory every engine's containers mount as their Hugging Face cache (~ is the
    cluster user's home); was `container.hf_cache`."""


class Fabric(_Model):
    interfaces: list[IfName] = Field(
        default=["enp1s0f1np1", "enP2p1s0f1np1"], min_length=1, max_length=8
    )
    """The cabled fabric interfaces (twins of one QSFP port), in order; the first one carries
    the MPI hostfile addresses."""
    mtu: int = Field(default=9000, ge=1280, le=9216)
    """MTU of the fabric interfaces; 9000 gives a few % more NCCL bandwidth."""
    topology: Literal["b2b", "switch", "ring"] | None = None
    """b2b (two nodes, one cable), switch (all on one fabric) or ring; default b2b for two nodes,
    switch otherwise. In a ring each link is its own subnet."""
    min_link_gbps: float | None = Field(default=None, gt=0)
    """netcheck --deep fails a link measured below this many Gb/s; left out: 92 % of the link's
    negotiated rate (NVIDIA Sync's speed test: 184 of 200 Gbit/s). The lab sets what veth carries."""
    max_latency_ms: float = Field(default=1.0, gt=0)
    """netcheck fails a link whose round trip is above this."""
    network: Literal["sparkctl", "adopted"] = "sparkctl"
    """Who writes the fabric's netplan: `sparkctl` (its own /etc/netplan/40-sparkctl-fabric.yaml)
    or `adopted`: files sparkctl did not write (NVIDIA Sync's 99-nvidia-sync-cluster.yaml, a
    hand-written one) already give these addresses and MTU; sparkctl verifies them and never
    writes, rewrites or removes a netplan file (`sparkctl init` writes `adopted` when it finds
    them)."""
    min_nccl_busbw_gbps: float | None = Field(default=None, gt=0)
    """netcheck --deep fails NCCL's all_gather bus bandwidth (GB/s) below this; default 21.875
    (direct or switch) or 10 (ring), NVIDIA's pass marks."""

    @field_validator("interfaces")
    @classmethod
    def _unique_interfaces(cls, value: list[str]) -> list[str]:
        duplicates = sorted({name for name in value if value.count(name) > 1})
        if duplicates:
            raise ValueError(f"interface listed twice: {', '.join(duplicates)}")
        return value


CONTAINER_NAME_PATTERN = r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$"


class ContainerSettings(_Model):
    """A container an engine's `up` phases keep on every node (`engines.NAME.container`); the
    engine's own model (engines/NAME/settings.py) gives the defaults."""

    image: str = Field(pattern=IMAGE_PATTERN)
    """The image; the same digest must be on every node."""
    name: str = Field(pattern=CONTAINER_NAME_PATTERN)
    """Container name on every node."""
    ssh_port: int = Field(ge=1, le=65535)
    """Port of the container's sshd (MPI's launcher); it listens on fabric addresses only."""


class Node(_Model):
    name: str = Field(pattern=NAME_PATTERN)
    """Node name, as reports and `--node` use it."""
    host: str = Field(pattern=HOST_PATTERN)
    """Management address or DNS name the controller connects to."""
    addresses: dict[IfName, str] | None = None
    """Fabric address per interface (CIDR); derived when left out."""
    head: bool = False
    """True on the node that serves (MPI rank 0); at most one."""
    proxy_jump: str | None = Field(default=None, pattern=JUMP_PATTERN)
    """Jump host(s) for this node only (overrides cluster.proxy_jump); "none" for a direct
    connection."""
    _host = field_validator("host")(_check_host)
    _jump = field_validator("proxy_jump")(_check_jump)
    sudo_password_file: str | None = Field(default=None, pattern=PATH_PATTERN)
    """A file (mode 0600) holding this node's sudo password."""


class Inventory(_Model):
    cluster: Cluster
    fabric: Fabric = Fabric()
    engines: dict[str, Any] | None = None
    """The engines this cluster serves, each with its own settings (a section whose model the
    engine owns: engines/NAME/settings.py); left out: every engine, with its defaults."""
    nodes: list[Node] = Field(min_length=1)
    source: str = Field(default="<inventory>", exclude=True)
    """Where the inventory was read from (for messages and relative paths)."""

    @model_validator(mode="before")
    @classmethod
    def _legacy_container(cls, data: Any) -> Any:
        """An inventory written before the engine sections: its top-level `container:` is the
        default engine's `engines.<default>.container` (and its hf_cache `cluster.hf_cache`)."""
        if not isinstance(data, dict) or "container" not in data:
            return data
        from orchestrator.engines import DEFAULT_ENGINE, REGISTRY

        data = dict(data)
        legacy = data.pop("container")
        if isinstance(legacy, dict) and "hf_cache" in legacy:
            legacy = dict(legacy)
            cluster = data.get("cluster")
            if isinstance(cluster, dict) and "hf_cache" not in cluster:
                data["cluster"] = {**cluster, "hf_cache": legacy.pop("hf_cache")}
        # without `engines:` it served every engine, and still does
        engines = dict(data.get("engines") or {name: {} for name in sorted(REGISTRY)})
        section = engines.get(DEFAULT_ENGINE) or {}
        if isinstance(section, dict) and "container" in section:
            raise ValueError(f"both container: (the old place) and engines.{DEFAULT_ENGINE}."
                             "container: are set; keep only the second")
        engines[DEFAULT_ENGINE] = {**(section if isinstance(section, dict) else {}),
                                   "container": legacy}
        data["engines"] = engines
        return data

    @field_validator("engines")
    @classmethod
    def _engine_sections(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """Each section validated by its engine's own model (errors name engines.NAME.key)."""
        if value is None:
            return None
        from pydantic import ValidationError

        from orchestrator.engines import REGISTRY, settings_type

        if not value:
            raise ValueError(f"name at least one engine ({', '.join(sorted(REGISTRY))}), or "
                             "leave `engines:` out to serve with every engine")
        sections: dict[str, Any] = {}
        for name, section in value.items():
            if name not in REGISTRY:
                raise ValueError(f"{name!r} is not an engine sparkctl knows; use one of: "
                                 f"{', '.join(sorted(REGISTRY))}")
            try:
                sections[name] = settings_type(name).model_validate(section or {})
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(part) for part in first["loc"])
                raise ValueError(f"{name}.{where}: {first['msg']}"
                                 + (f" (got {first.get('input')!r})"
                                    if first["type"] != "extra_forbidden" else
                                    " (unknown key; docs/inventory.md lists every key)")) from None
        return sections

    @property
    def served_engines(self) -> list[str]:
        """The engines named under `engines:`, or every registered engine when it is left out."""
        from orchestrator.engines import REGISTRY

        return list(self.engines) if self.engines is not None else sorted(REGISTRY)

    def serves(self, engine: str) -> bool:
        return engine in self.served_engines

    def settings(self, engine: str) -> Any:
        """The engine's section (its own pydantic model), its defaults when not written."""
        from orchestrator.engines import settings_type

        found = (self.engines or {}).get(engine)
        return found if found is not None else settings_type(engine)()

    @property
    def up_image(self) -> str | None:
        """The image of the container `up` keeps on every node (a served engine's, its
        UpStage capability), or None: an inventory naming only engines that bring their own
        images at launch pulls nothing at `up`."""
        from orchestrator.engines import up_container

        found = up_container(self)
        return found.settings.image if found else None

    @property
    def container(self) -> ContainerSettings:
        """The container `up` keeps on every node for the default engine (its section's
        `container`): what the code paths of that container read."""
        from orchestrator.engines import DEFAULT_ENGINE

        found = getattr(self.settings(DEFAULT_ENGINE), "container", None)
        assert isinstance(found, ContainerSettings), "the default engine keeps no container"
        return found

    @property
    def head(self) -> Node:
        return next(node for node in self.nodes if node.name == self.head_name)

    @property
    def head_name(self) -> str:
        if self.cluster.head:
            return self.cluster.head
        marked = [node.name for node in self.nodes if node.head]
        return marked[0] if marked else self.nodes[0].name

    @property
    def topology(self) -> str:
        if self.fabric.topology:
            return self.fabric.topology
        return "b2b" if len(self.nodes) == 2 else "switch"

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        valid = ", ".join(n.name for n in self.nodes)
        raise InputError(f"{self.source}: no node named {name!r} (nodes: {valid})")

    def ordered_nodes(self) -> list[Node]:
        """Head first, then the others in file order: the MPI rank order."""
        return [self.head] + [n for n in self.nodes if n.name != self.head_name]

    def fabric_address(self, node: Node, interface: str | None = None) -> str:
        """The node's fabric IP (no prefix) on `interface` (default: the first fabric one)."""
        assert node.addresses is not None
        return node.addresses[interface or self.fabric.interfaces[0]].split("/")[0]

    def mpi_address(self, node: Node) -> str:
        """The address the head reaches `node` at: its hostfile line. In a ring only the link
        a node shares with the head is reachable from there, so pick the first fabric interface
        whose subnet the head also has; on a cable or a switch that is simply the first one."""
        if node.name == self.head_name:
            return self.fabric_address(node)
        head_networks = {
            ipaddress.IPv4Interface(cidr).network for cidr in (self.head.addresses or {}).values()
        }
        for name in self.fabric.interfaces:
            if ipaddress.IPv4Interface((node.addresses or {})[name]).network in head_networks:
                return self.fabric_address(node, name)
        return self.fabric_address(node)

    def path_setting(self, value: str) -> Path:
        """Expand ~ and resolve a path relative to the inventory file's folder."""
        path = Path(value).expanduser()
        if not path.is_absolute() and self.source not in ("<inventory>", ""):
            path = Path(self.source).resolve().parent / path
        return path


def derive_addresses(index: int, interfaces: list[str]) -> dict[str, str]:
    """The default IP plan: twin k on 192.168.(200+k).0/24, node i at host number 12+i."""
    base = ipaddress.IPv4Address(DEFAULT_SUBNET_BASE)
    return {
        name: f"{base + 256 * k + FIRST_HOST_NUMBER + index}/24"
        for k, name in enumerate(interfaces)
    }
