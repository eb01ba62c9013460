"""Typed facts of a node's system, read from the gatherer's sections (orchestrator/node/gather.py):
`docker inspect` of containers and images, the interfaces (`ip addr`), the RoCE ports
(ibdev2netdev) and the netplan files. Like the facts of remote/facts.py, each asks (`request()`)
and reads (`read(answer)`), so phases name what they read instead of looking up strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.remote.facts import DockerObject, File, Request

# ------------------------------------------------------------------ docker inspect, typed

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


def inspect_error(answer: dict[str, Any], kind: str, name: str) -> str | None:
    """Why `docker inspect` of NAME failed on the node (None: answered, or no such object)."""
    raw = (answer.get(kind) or {}).get(name)
    return str(raw["error"]).strip() if isinstance(raw, dict) and "error" in raw else None


@dataclass(frozen=True)
class DockerImage:
    """`docker image inspect NAME`: None when the node has no such image; a failed inspect
    raises (naming the node), unless `strict=False` reads it as absent."""

    name: str

    def request(self) -> Request:
        return {"images": [self.name]}

    def read(self, answer: dict[str, Any], node: str = "node", strict: bool = True) -> ImageInfo | None:
        if not strict and inspect_error(answer, "images", self.name):
            return None
        raw = DockerObject("images", self.name).read(answer, node)
        return None if raw is None else ImageInfo.of(raw)


@dataclass(frozen=True)
class DockerContainer:
    """`docker inspect NAME` of a container: None when there is none; a failed inspect raises
    (naming the node), unless `strict=False` reads it as absent."""

    name: str

    def request(self) -> Request:
        return {"containers": [self.name]}

    def read(self, answer: dict[str, Any], node: str = "node",
             strict: bool = True) -> ContainerInfo | None:
        if not strict and inspect_error(answer, "containers", self.name):
            return None
        raw = DockerObject("containers", self.name).read(answer, node)
        return None if raw is None else ContainerInfo.of(raw)


def container_started(answer: dict[str, Any], name: str, node: str = "node") -> str:
    """When container NAME last started on the node ("" when there is none, or unreadable)."""
    found = DockerContainer(name).read(answer, node, strict=False)
    return found.started_at if found and found.started_at != "?" else ""


INFINIBAND = "/dev/infiniband"
"""The RDMA devices a container gets with --device where the node has them."""


def has_infiniband(answer: dict[str, Any]) -> bool:
    found = File(INFINIBAND).read(answer)
    return bool(found and found.exists)


# ------------------------------------------------------------------ links and netplan, typed

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
class Links:
    """The node's interfaces (`ip -j -d addr show`); None when they were not gathered."""

    def request(self) -> Request:
        return {"links": True}

    def read(self, answer: dict[str, Any]) -> LinkTable | None:
        raw = answer.get("links")
        if not isinstance(raw, dict):
            return None
        if "error" in raw:
            return LinkTable({}, str(raw["error"]))
        return LinkTable({name: Link(
            name, up=bool(entry.get("up", True)), carrier=bool(entry.get("carrier", True)),
            operstate=str(entry.get("operstate", "?")), mtu=entry.get("mtu"),
            addresses=tuple(entry.get("addresses") or ()))
            for name, entry in raw.items() if isinstance(entry, dict)})


@dataclass(frozen=True)
class RocePorts:
    """ibdev2netdev on the node (an empty table when it was not gathered)."""

    def request(self) -> Request:
        return {"ibdev2netdev": True}

    def read(self, answer: dict[str, Any]) -> RoceTable:
        raw = answer.get("ibdev2netdev") or {}
        ports = {str(name): RocePort(str(dev.get("device")), str(dev.get("state")))
                 for name, dev in (raw.get("devices") or {}).items() if isinstance(dev, dict)}
        return RoceTable(ports, int(raw.get("rc", 0)), str(raw.get("err", "")))


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


@dataclass(frozen=True)
class NetplanFiles:
    """Every netplan file of the node by path (empty when not gathered)."""

    def request(self) -> Request:
        return {"netplan": True}

    def read(self, answer: dict[str, Any]) -> dict[str, NetplanFile]:
        out = {}
        for path, raw in (answer.get("netplan") or {}).items():
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


LINKS, ROCE_PORTS, NETPLAN_FILES = Links(), RocePorts(), NetplanFiles()
