"""Typed facts of a node's system read from the gatherer's answer (remote/node_facts.py)."""

from __future__ import annotations

import pytest
from conftest import node_facts as parsed

from orchestrator.errors import SparkctlError
from orchestrator.remote.facts import request_of
from orchestrator.remote.node_facts import (
    LINKS,
    NETPLAN_FILES,
    ROCE_PORTS,
    ContainerInfo,
    DockerContainer,
    DockerImage,
    ImageInfo,
    Link,
    NetplanDefinition,
    RocePort,
)

INSPECT = {"Name": "/trtllm-multinode", "Id": "c0ffee", "Image": "sha256:abc",
           "Config": {"Image": "nvcr.io/x:1", "Env": ["A=1"],
                      "Labels": {"sparkctl.managed": "true", "sparkctl.cluster": "two-sparks"}},
           "HostConfig": {"Binds": ["/a:/b"]},
           "State": {"Running": False, "Status": "exited", "ExitCode": 137,
                     "StartedAt": "2026-11-25T10:00:00Z"}}


def test_the_requests_merge_into_one() -> None:
    assert request_of(LINKS, ROCE_PORTS, NETPLAN_FILES, DockerImage("i"), DockerContainer("c")) == {
        "links": True, "ibdev2netdev": True, "netplan": True, "images": ["i"], "containers": ["c"]}


def test_a_container_reads_as_its_named_parts() -> None:
    answer = parsed({"containers": {"trtllm-multinode": INSPECT, "gone": None,
                                    "broken": {"error": "permission denied\n"}}}, "spark-a")
    info = DockerContainer("trtllm-multinode").read(answer)
    assert info == ContainerInfo(
        name="trtllm-multinode", image_id="sha256:abc", image="nvcr.io/x:1",
        labels={"sparkctl.managed": "true", "sparkctl.cluster": "two-sparks"}, env=("A=1",),
        id="c0ffee", binds=("/a:/b",), running=False, status="exited", exit_code=137,
        started_at="2026-11-25T10:00:00Z")
    assert info.managed_by("two-sparks") and not info.managed_by("other")
    assert DockerContainer("gone").read(answer) is None and DockerContainer("never").read(parsed({})) is None
    with pytest.raises(SparkctlError, match=r"spark-a: `docker inspect broken` failed: permission denied$"):
        DockerContainer("broken").read(answer)
    assert DockerContainer("broken").read(answer, strict=False) is None


def test_an_image_reads_as_its_id_and_digests() -> None:
    answer = parsed({"images": {"i": {"Id": "sha256:1", "RepoDigests": ["r@sha256:2"]},
                                "bad": {"error": "daemon down"}}})
    assert DockerImage("i").read(answer) == ImageInfo("sha256:1", ("r@sha256:2",))
    assert ImageInfo.of({}) == ImageInfo("")
    with pytest.raises(SparkctlError, match=r"node: `docker image inspect bad` failed: daemon down"):
        DockerImage("bad").read(answer)
    assert DockerImage("bad").read(answer, strict=False) is None


def test_links_and_roce_ports() -> None:
    answer = {"links": {"enp1": {"operstate": "UP", "up": True, "carrier": False, "mtu": 9000,
                                 "addresses": ["192.168.200.12/24"]}, "odd": "not a dict"},
              "ibdev2netdev": {"rc": 0, "err": "", "devices": {
                  "enp1": {"device": "rocep1s0f1", "state": "Up"},
                  "enp2": {"device": "roceP2p1s0f1", "state": "Down"}}}}
    answer = parsed(answer)
    table = LINKS.read(answer)
    assert table is not None and table.error is None
    assert table.links == {"enp1": Link("enp1", up=True, carrier=False, operstate="UP", mtu=9000,
                                        addresses=("192.168.200.12/24",))}
    assert LINKS.read(parsed({})) is None  # not gathered
    failed = LINKS.read(parsed({"links": {"error": "ip: not found"}}))
    assert failed is not None and (failed.error, failed.links) == ("ip: not found", {})
    roce = ROCE_PORTS.read(answer)
    assert roce.ports["enp1"] == RocePort("rocep1s0f1", "Up") and roce.ports["enp1"].up
    assert not roce.ports["enp2"].up and (roce.rc, roce.err) == (0, "")
    missing = ROCE_PORTS.read(parsed({"ibdev2netdev": {"rc": 127, "err": "not found", "devices": {}}}))
    assert (missing.ports, missing.rc, missing.err) == ({}, 127, "not found")


def test_netplan_files_with_their_definitions() -> None:
    answer = {"netplan": {
        "/etc/netplan/50-cloud-init.yaml": {
            "exists": True, "interfaces": ["enp1", "eth0"],
            "definitions": {"enp1": {"section": "ethernets", "match": None, "matches_other": [],
                                     "set_name": None, "addresses": ["10.0.0.1/24"],
                                     "dhcp4": False, "dhcp6": True, "mtu": None}}},
        "/etc/netplan/99-broken.yaml": {"exists": True, "error": "mapping values are not allowed"},
        "/etc/netplan/odd.yaml": None}}
    files = NETPLAN_FILES.read(parsed(answer))
    assert sorted(files) == ["/etc/netplan/50-cloud-init.yaml", "/etc/netplan/99-broken.yaml"]
    cloud = files["/etc/netplan/50-cloud-init.yaml"]
    assert cloud.interfaces == ("enp1", "eth0") and cloud.error is None
    assert cloud.definitions == {"enp1": NetplanDefinition("ethernets", addresses=("10.0.0.1/24",),
                                                           dhcp6=True)}
    broken = files["/etc/netplan/99-broken.yaml"]
    assert broken.error == "mapping values are not allowed" and broken.definitions == {}
    assert NETPLAN_FILES.read(parsed({})) == {}
