"""The typed records a node's facts are made of (what orchestrator/node/gather.py answers, read
into classes): a command's result, a file, `docker inspect` of a container or image, the
interfaces, the RoCE ports and the netplan files. remote/gathered.py assembles them into one
`NodeFacts`; remote/facts.py and remote/node_facts.py say how each is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CommandResult:
    rc: int
    out: str
    err: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


@dataclass(frozen=True)
class FileInfo:
    exists: bool
    mode: int | None = None
    uid: int | None = None
    size: int | None = None
    sha256: str | None = None
    content: str | None = None


# ------------------------------------------------------------------ docker inspect

@dataclass(frozen=True)
class ImageInfo:
    """What sparkctl reads of `docker image inspect`."""

    id: str
    repo_digests: tuple[str, ...] = ()

    @classmethod
    def of(cls, raw: dict[str, Any]) -> ImageInfo:
        return cls(str(raw.get("Id") or ""), tuple(str(d) for d in raw.get("RepoDigests") or []))


@dataclass(frozen=True)
class ContainerInfo:
    """What sparkctl reads of `docker inspect` of a container."""

    name: str
    image_id: str
    """The ID of the image it runs ("Image")."""
    image: str
    """The image name it was created from (Config.Image)."""
    labels: dict[str, str]
    id: str = ""
    env: tuple[str, ...] = ()
    binds: tuple[str, ...] = ()
    running: bool = False
    status: str = "stopped"
    exit_code: int | None = None
    started_at: str = "?"

    @classmethod
    def of(cls, raw: dict[str, Any]) -> ContainerInfo:
        config, state = raw.get("Config") or {}, raw.get("State") or {}
        return cls(name=str(raw.get("Name") or "container").lstrip("/"),
                   image_id=str(raw.get("Image") or ""), image=str(config.get("Image")),
                   labels={str(k): str(v) for k, v in (config.get("Labels") or {}).items()},
                   id=str(raw.get("Id") or ""),
                   env=tuple(config.get("Env") or ()),
                   binds=tuple((raw.get("HostConfig") or {}).get("Binds") or ()),
                   running=bool(state.get("Running")), status=str(state.get("Status", "stopped")),
                   exit_code=state.get("ExitCode"), started_at=str(state.get("StartedAt", "?")))

    def managed_by(self, cluster: str) -> bool:
        """Created by sparkctl for this cluster (its labels say so)."""
        return (self.labels.get("sparkctl.managed") == "true"
                and self.labels.get("sparkctl.cluster") == cluster)


# ------------------------------------------------------------------ links and netplan

@dataclass(frozen=True)
class Link:
    """One interface of `ip -j -d addr show`."""

    name: str
    up: bool = True
    carrier: bool = True
    operstate: str = "?"
    mtu: int | None = None
    addresses: tuple[str, ...] = ()
    """Its IPv4 addresses as CIDR (192.168.200.12/24)."""


@dataclass(frozen=True)
class LinkTable:
    """Every interface of the node by name, or why `ip` could not list them."""

    links: dict[str, Link]
    error: str | None = None


@dataclass(frozen=True)
class RocePort:
    """One line of ibdev2netdev: the RoCE device behind an interface, and its port state."""

    device: str
    state: str

    @property
    def up(self) -> bool:
        return self.state == "Up"


@dataclass(frozen=True)
class RoceTable:
    """ibdev2netdev's answer: interface -> RoCE port; rc/err say whether it could run."""

    ports: dict[str, RocePort]
    rc: int = 0
    err: str = ""


@dataclass(frozen=True)
class NetplanDefinition:
    """What one netplan definition sets that can fight another file's (node/gather.py)."""

    section: str
    match: str | None = None
    """Its match.name (a glob), if any."""
    matches_other: tuple[str, ...] = ()
    """Other match keys (macaddress, driver): it may match an interface by those."""
    set_name: str | None = None
    addresses: tuple[str, ...] = ()
    dhcp4: bool = False
    dhcp6: bool = False
    mtu: int | None = None


@dataclass(frozen=True)
class NetplanFile:
    """One file of /etc/netplan: the interfaces it defines, or why it did not parse."""

    path: str
    interfaces: tuple[str, ...] = ()
    definitions: dict[str, NetplanDefinition] = field(default_factory=dict)
    error: str | None = None


def _mtu(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def read_links(raw: dict[str, Any]) -> LinkTable:
    """The gatherer's `links` section (or why `ip` failed)."""
    if "error" in raw:
        return LinkTable({}, str(raw["error"]))
    return LinkTable({name: Link(
        name, up=bool(entry.get("up", True)), carrier=bool(entry.get("carrier", True)),
        operstate=str(entry.get("operstate", "?")), mtu=entry.get("mtu"),
        addresses=tuple(entry.get("addresses") or ()))
        for name, entry in raw.items() if isinstance(entry, dict)})


def read_roce(raw: dict[str, Any]) -> RoceTable:
    """The gatherer's `ibdev2netdev` section."""
    ports = {str(name): RocePort(str(dev.get("device")), str(dev.get("state")))
             for name, dev in (raw.get("devices") or {}).items() if isinstance(dev, dict)}
    return RoceTable(ports, int(raw.get("rc", 0)), str(raw.get("err", "")))


def read_netplan(section: dict[str, Any]) -> dict[str, NetplanFile]:
    """The gatherer's `netplan` section: every file by path."""
    out = {}
    for path, raw in section.items():
        if not isinstance(raw, dict):
            continue
        definitions = {str(key): NetplanDefinition(
            str(d.get("section")), d.get("match"), tuple(d.get("matches_other") or ()),
            d.get("set_name"), tuple(d.get("addresses") or ()), bool(d.get("dhcp4")),
            bool(d.get("dhcp6")), _mtu(d.get("mtu")))
            for key, d in (raw.get("definitions") or {}).items() if isinstance(d, dict)}
        out[str(path)] = NetplanFile(str(path), tuple(raw.get("interfaces") or ()),
                                     definitions, raw.get("error"))
    return out
