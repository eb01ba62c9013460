"""Facts of a node's system, asked for and read typed (orchestrator/node/gather.py answers them):
`docker inspect` of containers and images, the interfaces (`ip addr`), the RoCE ports
(ibdev2netdev) and the netplan files. Like the facts of remote/facts.py, each asks (`request()`)
and reads (`read(facts)`) from the node's `NodeFacts` (remote/gathered.py); the records they read
into live in remote/fact_records.py (re-exported here, the phases' vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.remote.fact_records import ContainerInfo as ContainerInfo
from orchestrator.remote.fact_records import ImageInfo as ImageInfo
from orchestrator.remote.fact_records import Link as Link
from orchestrator.remote.fact_records import LinkTable as LinkTable
from orchestrator.remote.fact_records import NetplanDefinition as NetplanDefinition
from orchestrator.remote.fact_records import NetplanFile as NetplanFile
from orchestrator.remote.fact_records import RocePort as RocePort
from orchestrator.remote.fact_records import RoceTable as RoceTable
from orchestrator.remote.facts import Request
from orchestrator.remote.gathered import NodeFacts

# ------------------------------------------------------------------ docker inspect, typed

@dataclass(frozen=True)
class DockerImage:
    """`docker image inspect NAME`: None when the node has no such image; a failed inspect
    raises (naming the node), unless `strict=False` reads it as absent."""

    name: str

    def request(self) -> Request:
        return {"images": [self.name]}

    def read(self, facts: NodeFacts, strict: bool = True) -> ImageInfo | None:
        return facts.image(self.name, strict)


@dataclass(frozen=True)
class DockerContainer:
    """`docker inspect NAME` of a container: None when there is none; a failed inspect raises
    (naming the node), unless `strict=False` reads it as absent."""

    name: str

    def request(self) -> Request:
        return {"containers": [self.name]}

    def read(self, facts: NodeFacts, strict: bool = True) -> ContainerInfo | None:
        return facts.container(self.name, strict)


def container_started(facts: NodeFacts, name: str) -> str:
    """When container NAME last started on the node ("" when there is none, or unreadable)."""
    found = facts.container(name, strict=False)
    return found.started_at if found and found.started_at != "?" else ""


INFINIBAND = "/dev/infiniband"
"""The RDMA devices a container gets with --device where the node has them."""


def has_infiniband(facts: NodeFacts) -> bool:
    return facts.exists(INFINIBAND)


# ------------------------------------------------------------------ links and netplan, typed

@dataclass(frozen=True)
class Links:
    """The node's interfaces (`ip -j -d addr show`); None when they were not gathered."""

    def request(self) -> Request:
        return {"links": True}

    def read(self, facts: NodeFacts) -> LinkTable | None:
        return facts.links


@dataclass(frozen=True)
class RocePorts:
    """ibdev2netdev on the node (an empty table when it was not gathered)."""

    def request(self) -> Request:
        return {"ibdev2netdev": True}

    def read(self, facts: NodeFacts) -> RoceTable:
        return facts.roce


@dataclass(frozen=True)
class NetplanFiles:
    """Every netplan file of the node by path (empty when not gathered)."""

    def request(self) -> Request:
        return {"netplan": True}

    def read(self, facts: NodeFacts) -> dict[str, NetplanFile]:
        return facts.netplan


LINKS, ROCE_PORTS, NETPLAN_FILES = Links(), RocePorts(), NetplanFiles()
