"""netcheck's RoCE rows and link floor (issue 36): each RDMA device's active MTU (4096 with MTU
9000; 1024 fails naming the device), the RoCEv2 GID index of the fabric address against the
engines' NCCL_IB_GID_INDEX, the node-side reader (sysfs or show_gids, and ibv_devinfo), and
--deep choosing ib_write_bw where RDMA can run, judged against 92 % of the negotiated rate."""

from __future__ import annotations

import ipaddress
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeCluster
from conftest import node_facts as as_facts
from nodescript import run_node_script
from test_cli_netcheck import answering, deep_probe, iperf_json
from test_netcheck import IFS, ROCE, healthy_facts, inventory

from orchestrator.cli import netcheck as cli_netcheck
from orchestrator.netcheck.bandwidth import judge_throughput
from orchestrator.netcheck.checks import Link, run_node_checks
from orchestrator.netcheck.roce import (
    expected_active_mtu,
    link_floor,
    parse_ib_write_bw,
    roce_fact,
)

IB_WRITE_BW = """
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 65536      352000           0.00               185.31             0.353447
---------------------------------------------------------------------------------------
"""


def gid_table(address: str, first: int = 2) -> list[dict[str, Any]]:
    packed = ipaddress.IPv6Address("::ffff:" + address).packed
    mapped = ":".join(packed[i:i + 2].hex() for i in range(0, 16, 2))
    return [{"index": 0, "gid": "fe80:0000:0000:0000:0000:00ff:fe00:0001", "ipv4": "", "version": "v1"},
            {"index": 1, "gid": "fe80:0000:0000:0000:0000:00ff:fe00:0001", "ipv4": "", "version": "v2"},
            {"index": first, "gid": mapped, "ipv4": address, "version": "v1"},
            {"index": first + 1, "gid": mapped, "ipv4": address, "version": "v2"}]


def with_roce(facts: dict[str, Any], inv: Any, name: str, mtu: dict[str, int] | None = None,
              env: str | None = None, ib_write_bw: bool = False) -> dict[str, Any]:
    node = inv.node(name)
    answer = {"interfaces": {i: {"device": ROCE[i], "state": "PORT_ACTIVE",
                                 "active_mtu": (mtu or {}).get(i, 4096), "source": "sysfs",
                                 "gids": gid_table(node.addresses[i].split("/")[0])}
                             for i in IFS}}
    facts["commands"]["roce"] = {"rc": 0, "out": json.dumps(answer), "err": ""}
    facts["commands"]["ib_write_bw"] = ({"rc": 0, "out": "/usr/bin/ib_write_bw", "err": ""}
                                        if ib_write_bw else {"rc": 1, "out": "", "err": ""})
    if env is not None:
        facts["containers"][inv.container.name]["Config"]["Env"].append(env)
    return facts


def roce_rows(inv: Any, facts: dict[str, Any]) -> list[Any]:
    return [r for r in run_node_checks(inv, inv.node("spark-a"), as_facts(facts))
            if r.check.startswith("roce")]


def test_healthy_devices_pass_with_their_mtu_and_gid_index() -> None:
    inv = inventory()
    rows = roce_rows(inv, with_roce(healthy_facts(inv, "spark-a"), inv, "spark-a"))
    assert [(r.check, r.interface, r.status, r.value) for r in rows] == [
        ("roce-mtu", "enp1s0f1np1", "pass", 4096), ("roce-gid", "enp1s0f1np1", "pass", 3),
        ("roce-mtu", "enP2p1s0f1np1", "pass", 4096), ("roce-gid", "enP2p1s0f1np1", "pass", 3)]
    assert "NCCL_IB_GID_INDEX is not set" in rows[1].message


def test_a_device_at_mtu_1024_fails_naming_it() -> None:
    inv = inventory()
    facts = with_roce(healthy_facts(inv, "spark-a"), inv, "spark-a", mtu={"enP2p1s0f1np1": 1024})
    failed = [r for r in roce_rows(inv, facts) if r.status == "fail"]
    assert len(failed) == 1 and failed[0].check == "roce-mtu"
    assert (failed[0].value, failed[0].threshold) == (1024, 4096)
    assert "roceP2p1s0f1 (enP2p1s0f1np1) runs at active MTU 1024" in failed[0].message
    assert "ibv_devinfo -d roceP2p1s0f1" in failed[0].fix


def test_engines_told_another_gid_index_fail_and_the_right_one_passes() -> None:
    inv = inventory()
    wrong = roce_rows(inv, with_roce(healthy_facts(inv, "spark-a"), inv, "spark-a",
                                     env="NCCL_IB_GID_INDEX=0"))
    gid = [r for r in wrong if r.check == "roce-gid"]
    assert all(r.status == "fail" and "NCCL_IB_GID_INDEX=0" in r.message and "index 3" in r.message
               for r in gid)
    right = roce_rows(inv, with_roce(healthy_facts(inv, "spark-a"), inv, "spark-a",
                                     env="NCCL_IB_GID_INDEX=3"))
    assert all(r.status == "pass" for r in right)


def test_no_rocev2_gid_for_the_fabric_address_fails() -> None:
    inv = inventory()
    facts = with_roce(healthy_facts(inv, "spark-a"), inv, "spark-a")
    answer = json.loads(facts["commands"]["roce"]["out"])
    answer["interfaces"]["enp1s0f1np1"]["gids"] = gid_table("192.168.200.99")
    facts["commands"]["roce"]["out"] = json.dumps(answer)
    failed = [r for r in roce_rows(inv, facts) if r.status == "fail"]
    assert [r.check for r in failed] == ["roce-gid"] and "192.168.200.12" in failed[0].message


def test_no_rdma_tools_is_one_warning_and_not_gathered_is_no_row() -> None:
    inv = inventory()
    facts = healthy_facts(inv, "spark-a")
    assert roce_rows(inv, facts) == []
    facts["commands"]["roce"] = {"rc": 0, "out": json.dumps({"error": "no RDMA devices: x"}), "err": ""}
    assert [(r.check, r.status) for r in roce_rows(inv, facts)] == [("roce-mtu", "warn")]


def test_active_mtu_expected_from_the_link_mtu() -> None:
    assert [expected_active_mtu(m) for m in (9000, 4200, 4000, 1500, 1280)] == [4096, 4096, 2048, 1024, 1024]


def test_the_floor_is_92_percent_of_the_negotiated_rate_unless_set() -> None:
    assert link_floor(inventory(), 200_000) == (184.0, "92 % of the 200 Gb/s negotiated (NVIDIA: 184 of 200)")
    assert link_floor(inventory(), 100_000)[0] == 92.0
    assert link_floor(inventory(), None)[0] == 184.0
    assert link_floor(inventory(min_link_gbps=0.5), 200_000) == (0.5, "fabric.min_link_gbps")


def test_ib_write_bw_average_is_read_and_judged() -> None:
    assert parse_ib_write_bw(IB_WRITE_BW) == 185.31
    assert parse_ib_write_bw("Couldn't connect to 192.168.200.13:18515") is None
    link = Link("spark-a", "enp1s0f1np1", "192.168.200.12", "spark-b", "enp1s0f1np1", "192.168.200.13")
    good = judge_throughput(inventory(), link, 0, IB_WRITE_BW, "", 200_000, rdma=True)
    assert (good.status, good.value, good.threshold) == ("pass", 185.31, 184.0)
    assert "by ib_write_bw (RDMA)" in good.message
    slow = judge_throughput(inventory(), link, 0, IB_WRITE_BW.replace("185.31", "150.00"), "",
                            200_000, rdma=True)
    assert slow.status == "fail" and "below its floor 184" in slow.message
    broken = judge_throughput(inventory(), link, 1, "", "Couldn't connect", 200_000, rdma=True)
    assert broken.status == "fail" and "ib_write_bw" in broken.message


def test_deep_uses_ib_write_bw_where_both_ends_can(fake_cluster: Callable[..., FakeCluster]) -> None:
    inv = inventory(2)

    def rdma_facts(name: str) -> Callable[..., Any]:
        base = answering(inv, name, deep_probe)
        return lambda request: with_roce(base(request), inv, name, ib_write_bw=True)

    cluster = fake_cluster(inv, facts={n.name: rdma_facts(n.name) for n in inv.nodes})
    cluster["spark-a"].on("ib_write_bw -d", stdout=IB_WRITE_BW)  # (the gatherer asks `command -v`)
    results = cli_netcheck.run_netcheck(cluster.session("netcheck"), deep=True)
    throughput = [r for r in results if r.check == "throughput"]
    assert [(r.value, r.status) for r in throughput] == [(185.31, "pass"), (185.31, "pass")], \
        [r.message for r in throughput]
    servers = [c for c in cluster.commands("spark-b") if "timeout 40 ib_write_bw" in c]
    assert servers and all("-x 3" in s and "-d roce" in s for s in servers), servers
    assert not any("iperf3" in c for c in cluster.commands("spark-a"))


def test_deep_falls_back_to_iperf3_without_ib_write_bw(fake_cluster: Callable[..., FakeCluster]) -> None:
    inv = inventory(2)

    def facts(name: str) -> Callable[..., Any]:
        base = answering(inv, name, deep_probe)
        return lambda request: with_roce(base(request), inv, name)

    cluster = fake_cluster(inv, facts={n.name: facts(n.name) for n in inv.nodes})
    cluster["spark-a"].on("iperf3 -c", stdout=iperf_json(190.0))
    results = cli_netcheck.run_netcheck(cluster.session("netcheck"), deep=True)
    assert all("iperf3 (TCP)" in r.message for r in results if r.check == "throughput")


def test_the_node_reader_prefers_sysfs_and_parses_ibv_devinfo(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    port = tmp_path / "rocep1s0f1" / "ports" / "1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / sub).mkdir(parents=True)
    rows = [("fe80:0000:0000:0000:0000:00ff:fe00:0001", "IB/RoCE v1"),
            ("fe80:0000:0000:0000:0000:00ff:fe00:0001", "RoCE v2"),
            ("0000:0000:0000:0000:0000:ffff:c0a8:c80c", "IB/RoCE v1"),
            ("0000:0000:0000:0000:0000:ffff:c0a8:c80c", "RoCE v2"),
            ("0000:0000:0000:0000:0000:0000:0000:0000", "")]
    for index, (gid, kind) in enumerate(rows):
        (port / "gids" / str(index)).write_text(gid + "\n")
        (port / "gid_attrs" / "types" / str(index)).write_text(kind + "\n")
        (port / "gid_attrs" / "ndevs" / str(index)).write_text("enp1s0f1np1\n")
    outputs = {
        "ibdev2netdev": ("rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)\n"
                        "roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)\n"),
        "ibv_devinfo": "hca_id:\trocep1s0f1\n\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n"
                       "\t\t\tactive_mtu:\t\t1024 (3)\n",
        "show_gids": "DEV\tPORT\tINDEX\tGID\t\t\t\t\tIPv4  \t\tVER\tDEV\n"
                     "roceP2p1s0f1\t1\t3\t0000:0000:0000:0000:0000:ffff:c0a8:c90c\t"
                     "192.168.201.12  \tv2\tenP2p1s0f1np1\n",
    }

    def fake_run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 0, outputs[argv[0]], "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    args = {"interfaces": ["enp1s0f1np1", "enP2p1s0f1np1", "enp1s0f0np0"], "sysfs": str(tmp_path)}
    answer = run_node_script("roce.py", [json.dumps(args)], monkeypatch).json["interfaces"]
    first = answer["enp1s0f1np1"]
    assert (first["device"], first["state"], first["active_mtu"], first["source"]) == \
        ("rocep1s0f1", "PORT_ACTIVE", 1024, "sysfs")
    assert [(g["index"], g["ipv4"], g["version"]) for g in first["gids"]] == [
        (0, "", "v1"), (1, "", "v2"), (2, "192.168.200.12", "v1"), (3, "192.168.200.12", "v2")]
    second = answer["enP2p1s0f1np1"]
    assert second["source"] == "show_gids" and second["gids"][0]["ipv4"] == "192.168.201.12"
    assert "no RoCE device" in answer["enp1s0f0np0"]["error"]


def test_the_reader_is_one_gathered_command() -> None:
    fact = roce_fact(inventory())
    assert fact.command.startswith("python3 -c ") and "enP2p1s0f1np1" in fact.command
