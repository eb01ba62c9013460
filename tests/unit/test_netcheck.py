"""netcheck: faked facts and probe answers in, check results out."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from conftest import cluster_of, node_facts

from orchestrator.engines.trtllm.up import expected_env
from orchestrator.inventory import Inventory
from orchestrator.inventory_checks import inventory_from_data
from orchestrator.netcheck.bandwidth import judge_throughput, throughput_links
from orchestrator.netcheck.checks import (
    CheckResult,
    fabric_links,
    facts_request,
    run_node_checks,
)
from orchestrator.netcheck.container import check_image_digests
from orchestrator.netcheck.probes import (
    build_probes,
    judge_latency,
    judge_mpirun,
    judge_ping,
    judge_probes,
    judge_ssh,
    parse_ping,
)
from orchestrator.paths import NETPLAN_FILE
from orchestrator.remote.gathered import ProbeResult

IFS = ["enp1s0f1np1", "enP2p1s0f1np1"]
ROCE = {"enp1s0f1np1": "rocep1s0f1", "enP2p1s0f1np1": "roceP2p1s0f1"}
PING_OK = ("PING x\n\n--- x ping statistics ---\n3 packets transmitted, 3 received, 0% packet loss, "
           "time 401ms\nrtt min/avg/max/mdev = 0.031/0.052/0.080/0.010 ms\n")
PING_DEAD = "--- x ping statistics ---\n3 packets transmitted, 0 received, 100% packet loss, time 2040ms\n"


def inventory(nodes: int = 2, **fabric: Any) -> Inventory:
    data: dict[str, Any] = {
        "cluster": {"name": "two-sparks", "ssh_key": "/k"},
        "fabric": {"interfaces": IFS, "mtu": 9000, **fabric},
        "nodes": [{"name": f"spark-{chr(97 + i)}", "host": f"h{i}"} for i in range(nodes)],
    }
    return inventory_from_data(data, "two-sparks.yml")


def healthy_facts(inv: Inventory, name: str) -> dict[str, Any]:
    node = inv.node(name)
    assert node.addresses
    env = [f"{k}={v}" for k, v in expected_env(inv).items()]
    env.append("NCCL_IB_HCA=" + ",".join(ROCE[i] for i in IFS))
    hostfile = "".join(f"{inv.fabric_address(n)} slots=1\n" for n in inv.ordered_nodes())
    return {
        "hostname": name,
        "links": {
            i: {"operstate": "UP", "up": True, "carrier": True, "mtu": 9000,
                "addresses": [node.addresses[i]]} for i in IFS
        } | {"eth0": {"operstate": "UP", "up": True, "carrier": True, "mtu": 1500,
                      "addresses": ["10.0.0.2/24"]}},
        "netplan": {NETPLAN_FILE: {"exists": True, "interfaces": list(IFS)},
                    "/etc/netplan/50-cloud-init.yaml": {"exists": True, "interfaces": ["eth0"]}},
        "ibdev2netdev": {"rc": 0, "devices": {i: {"device": ROCE[i], "state": "Up"} for i in IFS}},
        "routes": {link.peer_ip: link.interface for link in fabric_links(inv) if link.node == name},
        "containers": {inv.container.name: {
            "Image": "sha256:" + "a" * 64, "State": {"Running": True, "Status": "running"},
            "Config": {"Env": env}}},
        "images": {inv.container.image: {"Id": "sha256:" + "a" * 64}},
        "files": {"/etc/sparkctl/hostfile": {"exists": True, "content": hostfile},
                  "/etc/sparkctl/ssh_config": {"exists": True}},
        "commands": {f"ethtool:{i}": {"rc": 0, "out": "Settings:\n\tSpeed: 200000Mb/s\n", "err": ""}
                     for i in IFS},
    }


def failures(results: list[CheckResult]) -> list[CheckResult]:
    return [r for r in results if r.status == "fail"]


def node_results(inv: Inventory, name: str, facts: dict[str, Any]) -> list[CheckResult]:
    return run_node_checks(inv, inv.node(name), node_facts(facts, name))


# ---------------------------------------------------------------- links


def test_b2b_links_cover_both_directions_on_each_twin() -> None:
    links = fabric_links(inventory())
    assert {(lk.node, lk.interface, lk.peer, lk.peer_ip) for lk in links} == {
        ("spark-a", "enp1s0f1np1", "spark-b", "192.168.200.13"),
        ("spark-a", "enP2p1s0f1np1", "spark-b", "192.168.201.13"),
        ("spark-b", "enp1s0f1np1", "spark-a", "192.168.200.12"),
        ("spark-b", "enP2p1s0f1np1", "spark-a", "192.168.201.12"),
    }
    assert len(throughput_links(inventory())) == 2


def test_switch_links_every_pair() -> None:
    inv = inventory(nodes=3)
    assert len(fabric_links(inv)) == 3 * 2 * 2


# ---------------------------------------------------------------- per-node checks


def test_healthy_node_passes_everything() -> None:
    inv = inventory()
    results = node_results(inv, "spark-a", healthy_facts(inv, "spark-a"))
    assert results and all(r.status == "pass" for r in results), [r for r in results if r.status != "pass"]
    assert {r.check for r in results} >= {"interface", "speed", "address", "mtu", "netplan",
                                          "twin-subnets", "route", "container", "container-env",
                                          "hostfile"}


def test_cut_cable_names_node_interface_and_cable() -> None:
    inv = inventory()
    facts = healthy_facts(inv, "spark-b")
    facts["links"]["enp1s0f1np1"].update(operstate="DOWN", carrier=False)
    facts["ibdev2netdev"]["devices"]["enp1s0f1np1"]["state"] = "Down"
    [fail] = [r for r in failures(node_results(inv, "spark-b", facts)) if r.check == "interface"]
    assert (fail.node, fail.interface) == ("spark-b", "enp1s0f1np1")
    assert "cable" in fail.message and "Down" in fail.message and fail.fix


def test_missing_and_admin_down_interfaces_fail() -> None:
    inv = inventory()
    facts = healthy_facts(inv, "spark-a")
    del facts["links"]["enP2p1s0f1np1"]
    facts["links"]["enp1s0f1np1"]["up"] = False
    fails = {(r.check, r.interface) for r in failures(node_results(inv, "spark-a", facts))}
    assert ("interface", "enP2p1s0f1np1") in fails and ("interface", "enp1s0f1np1") in fails


def test_changed_address_fails_with_expected_and_found() -> None:
    inv = inventory()
    facts = healthy_facts(inv, "spark-b")
    facts["links"]["enp1s0f1np1"]["addresses"] = ["192.168.200.99/24"]
    [fail] = [r for r in failures(node_results(inv, "spark-b", facts)) if r.check == "address"]
    assert fail.interface == "enp1s0f1np1"
    assert "192.168.200.13/24" in fail.message and "192.168.200.99/24" in fail.message
    assert "sparkctl up" in fail.fix


def test_mtu_mismatch_fails() -> None:
    inv = inventory()
    facts = healthy_facts(inv, "spark-a")
    facts["links"]["enP2p1s0f1np1"]["mtu"] = 1500
    [fail] = [r for r in failures(node_results(inv, "spark-a", facts)) if r.check == "mtu"]
    assert (fail.interface, fail.value, fail.threshold) == ("enP2p1s0f1np1", 1500, 9000)


def test_slow_speed_warns() -> None:
    inv = inventory()
    facts = healthy_facts(inv, "spark-a")
    facts["commands"]["ethtool:enp1s0f1np1"]["out"] = "\tSpeed: 100000Mb/s\n"
    [warn] = [r for r in node_results(inv, "spark-a", facts) if r.status == "warn"]
    assert (warn.check, warn.value) == ("speed", 100000)


def test_other_netplan_file_fighting_warns() -> None:
    inv = inventory()
    facts = healthy_facts(inv, "spark-a")
    # NVIDIA's playbook file: both twins in one /24, and DHCP on the second
    facts["netplan"]["/etc/netplan/40-cx7.yaml"] = {
        "exists": True, "interfaces": ["enp1s0f1np1", "enP2p1s0f1np1"], "definitions": {
            "enp1s0f1np1": {"addresses": ["192.168.100.10/24"]},
            "enP2p1s0f1np1": {"dhcp4": True}}}
    warns = [r for r in node_results(inv, "spark-a", facts) if r.status == "warn"]
    assert [(r.check, r.interface, r.value) for r in warns] == [
        ("netplan", "enp1s0f1np1", "/etc/netplan/40-cx7.yaml"),
        ("netplan", "enP2p1s0f1np1", "/etc/netplan/40-cx7.yaml")]
    assert warns[0].message.startswith(
        "/etc/netplan/40-cx7.yaml sets 192.168.100.10/24 on enp1s0f1np1: netplan merges files")
    assert warns[1].message.startswith("/etc/netplan/40-cx7.yaml sets dhcp4: true on enP2p1s0f1np1")


def test_a_file_that_only_names_a_fabric_interface_is_harmless() -> None:
    """The same rule as up's preflight (phases/netplan_conflicts.py): a definition without
    addresses or DHCP (e.g. one that only sets the MTU) adds nothing that can fight."""
    inv = inventory()
    facts = healthy_facts(inv, "spark-a")
    facts["netplan"]["/etc/netplan/40-cx7.yaml"] = {
        "exists": True, "interfaces": ["enp1s0f1np1"],
        "definitions": {"enp1s0f1np1": {"mtu": 9000}}}
    assert not [r for r in node_results(inv, "spark-a", facts) if r.status == "warn"]


def test_twins_sharing_a_subnet_fail() -> None:
    inv = inventory()
    facts = healthy_facts(inv, "spark-a")
    facts["links"]["enP2p1s0f1np1"]["addresses"] = ["192.168.200.14/24"]
    checks = {r.check for r in failures(node_results(inv, "spark-a", facts))}
    assert "twin-subnets" in checks


def test_route_through_wrong_interface_fails() -> None:
    inv = inventory()
    facts = healthy_facts(inv, "spark-a")
    facts["routes"]["192.168.201.13"] = "enp1s0f1np1"
    [fail] = [r for r in failures(node_results(inv, "spark-a", facts)) if r.check == "route"]
    assert (fail.peer, fail.interface, fail.value) == ("spark-b", "enP2p1s0f1np1", "enp1s0f1np1")


def test_container_env_naming_a_down_interface_fails() -> None:
    inv = inventory()
    facts = healthy_facts(inv, "spark-b")
    env = facts["containers"][inv.container.name]["Config"]["Env"]
    env[:] = [e for e in env if not e.startswith("NCCL_SOCKET_IFNAME=")] + [
        "NCCL_SOCKET_IFNAME=enp1s0f0np0"]
    facts["links"]["enp1s0f0np0"] = {"operstate": "DOWN", "up": True, "carrier": False, "mtu": 1500,
                                     "addresses": []}
    [fail] = [r for r in failures(node_results(inv, "spark-b", facts)) if r.check == "container-env"]
    assert fail.interface == "enp1s0f0np0" and "NCCL_SOCKET_IFNAME" in fail.message
    assert "Socket operation on non-socket" in fail.message


def test_container_env_differing_from_inventory_fails() -> None:
    inv = inventory()
    facts = healthy_facts(inv, "spark-a")
    env = facts["containers"][inv.container.name]["Config"]["Env"]
    env[:] = [e for e in env if not e.startswith("UCX_NET_DEVICES=")] + ["UCX_NET_DEVICES=enp1s0f1np1"]
    [fail] = failures(node_results(inv, "spark-a", facts))
    assert fail.check == "container-env" and "UCX_NET_DEVICES" in fail.message


def test_stopped_container_fails_and_skips_env() -> None:
    inv = inventory()
    facts = healthy_facts(inv, "spark-a")
    facts["containers"][inv.container.name]["State"] = {"Running": False, "Status": "exited",
                                                        "ExitCode": 1}
    results = node_results(inv, "spark-a", facts)
    assert [r.check for r in failures(results)] == ["container"]
    assert "docker logs" in failures(results)[0].fix


def test_hostfile_with_management_addresses_fails() -> None:
    inv = inventory()
    facts = healthy_facts(inv, "spark-a")
    facts["files"]["/etc/sparkctl/hostfile"]["content"] = "10.0.0.2 slots=1\n10.0.0.3 slots=1\n"
    [fail] = failures(node_results(inv, "spark-a", facts))
    assert fail.check == "hostfile" and "mpirun" in fail.message


def test_image_digests_differ_fail_on_every_node_without_majority() -> None:
    inv = inventory()
    facts = {n.name: healthy_facts(inv, n.name) for n in inv.nodes}
    assert all(r.status == "pass" for r in check_image_digests(inv, cluster_of(facts)))
    facts["spark-b"]["containers"][inv.container.name]["Image"] = "sha256:" + "b" * 64
    results = check_image_digests(inv, cluster_of(facts))
    assert [r.status for r in results] == ["fail", "fail"]
    assert "spark-b -> sha256:bbbb" in results[0].message


def test_facts_request_asks_routes_to_every_peer() -> None:
    inv = inventory()
    request = facts_request(inv, inv.node("spark-a"))
    assert request["routes"] == ["192.168.200.13", "192.168.201.13"]
    assert request["commands"]["ethtool:enp1s0f1np1"] == "ethtool enp1s0f1np1"


# ---------------------------------------------------------------- probes


def test_probes_use_the_right_interface_and_full_mtu() -> None:
    inv = inventory()
    probes = {p.key: p for p in build_probes(inv, inv.node("spark-a"), deep=True)}
    mtu = probes["mtu-ping enp1s0f1np1>192.168.200.13"].argv
    assert mtu[mtu.index("-s") + 1] == "8972" and mtu[mtu.index("-M") + 1] == "do"
    assert mtu[mtu.index("-I") + 1] == "enp1s0f1np1"
    ssh = probes["ssh-container enP2p1s0f1np1>192.168.201.13"].argv
    assert ssh[ssh.index("exec") + 1:ssh.index("exec") + 5] == [
        "trtllm-multinode", "ssh", "-F", "/etc/sparkctl/ssh_config"]
    assert "mpirun" in probes and "latency enp1s0f1np1>192.168.200.13" in probes
    other = build_probes(inv, inv.node("spark-b"), deep=False)
    assert not any(p.kind in ("mpirun", "latency") for p in other)


def test_parse_ping() -> None:
    assert parse_ping(PING_OK) == (3, 3, 0.052)
    assert parse_ping(PING_DEAD) == (3, 0, None)
    assert parse_ping("") == (0, 0, None)


def link(node: str = "spark-a", interface: str = "enp1s0f1np1") -> Any:
    return next(lk for lk in fabric_links(inventory()) if lk.node == node and lk.interface == interface)


def test_ping_no_reply_fails_naming_both_ends() -> None:
    result = judge_ping(inventory(), link(), ProbeResult(rc=1, out=PING_DEAD,
                                              err="ping: Warning: source address might be selected"))
    assert result.status == "fail" and result.peer == "spark-b" and result.interface == "enp1s0f1np1"
    assert "100% packet loss" in result.message and "Warning" not in result.message
    assert judge_ping(inventory(), link(), ProbeResult(rc=0, out=PING_OK)).status == "pass"


@pytest.mark.parametrize(("stderr", "cause"), [
    ("ssh: connect to host 192.168.200.13 port 2233: Connection refused", "sshd on spark-b"),
    ("root@192.168.200.13: Permission denied (publickey).", "keys not exchanged"),
    ("Host key verification failed.", "pinned"),
])
def test_ssh_failures_name_the_likely_cause(stderr: str, cause: str) -> None:
    result = judge_ssh(inventory(), link(), "ssh-container", ProbeResult(rc=255, out="", err=stderr))
    assert result.status == "fail" and cause in result.message and result.fix
    assert "2233" in result.message


def test_mpirun_hang_and_missing_host() -> None:
    inv = inventory()
    names = {"spark-a": "spark-a", "spark-b": "spark-b"}
    hang = judge_mpirun(inv, ProbeResult(rc=124, out="", err="", seconds=60.0), names)
    assert hang.status == "fail" and "fabric IPs" in hang.fix
    missing = judge_mpirun(inv, ProbeResult(rc=1, out="spark-a\n", err="ORTE error", seconds=1), names)
    assert missing.status == "fail" and "spark-a" in missing.message
    ok = judge_mpirun(inv, ProbeResult(rc=0, out="spark-b\nspark-a\n", err="", seconds=0.6), names)
    assert ok.status == "pass"


def test_latency_and_loss_against_thresholds() -> None:
    inv = inventory(max_latency_ms=1.0)
    slow = ("50 packets transmitted, 50 received, 0% packet loss, time 1s\n"
            "rtt min/avg/max/mdev = 5.0/5.2/6.0/0.1 ms\n")
    lossy = ("50 packets transmitted, 45 received, 10% packet loss, time 1s\n"
             "rtt min/avg/max/mdev = 0.03/0.05/0.08/0.01 ms\n")
    fine = ("50 packets transmitted, 50 received, 0% packet loss\n"
            "rtt min/avg/max/mdev = 0.03/0.05/0.08/0.01 ms")
    assert judge_latency(inv, link(), ProbeResult(rc=0, out=slow)).status == "fail"
    lost = judge_latency(inv, link(), ProbeResult(rc=0, out=lossy))
    assert lost.status == "fail" and "10%" in lost.message
    assert judge_latency(inv, link(), ProbeResult(rc=0, out=fine)).status == "pass"


def test_throughput_against_min_link_gbps() -> None:
    report = json.dumps({"end": {"sum_received": {"bits_per_second": 9.5e9}}})
    low = judge_throughput(inventory(), link(), 0, report)
    assert (low.status, low.value, low.threshold) == ("fail", 9.5, 184.0)  # 92 % of 200
    assert judge_throughput(inventory(min_link_gbps=1), link(), 0, "warning\n" + report).status == "pass"
    broken = judge_throughput(inventory(), link(), 1, json.dumps({"error": "unable to connect"}))
    assert broken.status == "fail" and "unable to connect" in broken.message


def test_json_record_has_the_contract_keys() -> None:
    record = CheckResult("ping", "spark-a", "fail", "no reply.", fix="check the cable").to_json()
    assert list(record)[:9] == ["check", "node", "peer", "interface", "status", "value", "unit",
                                "threshold", "message"]
    assert record["message"].endswith("Fix: check the cable")


# ---------------------------------------------------------------- the whole run, faked


@pytest.fixture
def fake_session(fake_cluster: Any) -> Any:
    """A session on the shared fake cluster: healthy facts, probes answered by `probe_answer`."""
    def fake_session_(inv: Inventory, probe_answer: Any) -> Any:
        def facts(name: str) -> Any:
            def answer(request: dict[str, Any]) -> dict[str, Any]:
                facts = copy.deepcopy(healthy_facts(inv, name))
                facts["probes"] = {key: probe_answer(key) for key in request.get("probes", {})}
                return facts
            return answer
        return fake_cluster(inv, facts={n.name: facts(n.name) for n in inv.nodes}).session("netcheck")
    return fake_session_


def healthy_probe(key: str) -> dict[str, Any]:
    if key == "mpirun":
        return {"rc": 0, "out": "spark-a\nspark-b\n", "err": "", "seconds": 0.5}
    if key.startswith(("ping", "mtu-ping")):
        return {"rc": 0, "out": PING_OK, "err": ""}
    return {"rc": 0, "out": "", "err": "", "seconds": 0.1}


def test_run_netcheck_one_command_per_node_all_pass(fake_session: Any) -> None:
    from orchestrator.cli.netcheck import run_netcheck

    session = fake_session(inventory(), healthy_probe)
    results = run_netcheck(session, deep=False)
    assert all(r.status == "pass" for r in results), [r for r in results if r.status != "pass"]
    assert all(len(t.commands) == 1 for t in session.transports.values())
    assert {"ping", "mtu-ping", "ssh-node", "ssh-container", "mpirun", "image"} <= {r.check for r in results}


def test_run_netcheck_sshd_stopped_on_one_node(fake_session: Any) -> None:
    from orchestrator.cli.netcheck import run_netcheck

    def answer(key: str) -> dict[str, Any]:
        if key.startswith("ssh") and ".13" in key:
            return {"rc": 255, "out": "", "err": "ssh: connect to host 192.168.200.13 port 2233: "
                    "Connection refused"}
        return healthy_probe(key)

    results = run_netcheck(fake_session(inventory(), answer), deep=False)
    fails = {(r.check, r.node, r.peer) for r in failures(results)}
    assert fails == {("ssh-node", "spark-a", "spark-b"), ("ssh-container", "spark-a", "spark-b")}


def test_judge_probes_reports_a_probe_that_did_not_run() -> None:
    inv = inventory()
    facts = {n.name: healthy_facts(inv, n.name) for n in inv.nodes}
    probes = build_probes(inv, inv.node("spark-b"), deep=False)
    results = judge_probes(inv, inv.node("spark-b"), probes, {}, cluster_of(facts))
    assert results and all(r.status == "fail" for r in results)


def test_iperf3_output_with_bare_nan_still_parses() -> None:
    from orchestrator.netcheck.bandwidth import _first_json

    text = 'warm-up\n{"end": {"sum_received": {"bits_per_second": 9.5e9}, "cpu": -nan, "x": [nan, inf]}}'
    assert _first_json(text)["end"]["sum_received"]["bits_per_second"] == 9.5e9


def test_iperf3_rate_is_found_even_when_its_json_is_broken() -> None:
    from orchestrator.netcheck.bandwidth import _received_bits_per_second

    broken = '{"start": {"x": bad}, "end": {"sum_received": {"bytes": 5,\n"bits_per_second":\t8.5e9}}}'
    assert _received_bits_per_second(broken) == 8.5e9


def test_checks_depending_on_a_failed_check_are_skipped_with_the_reason() -> None:
    """Issue #20: a node's sshd stopped (connect failed) made mpirun report a bogus hostname
    mismatch; a taken port got "fix the ping failures first" with no ping failed."""
    from orchestrator.netcheck.checks import CheckResult
    from orchestrator.netcheck.probes import apply_dependencies

    results = [
        CheckResult("connect", "spark-b", "fail", "cannot reach spark-b over SSH: refused"),
        CheckResult("mpirun", "spark-a", "fail", "`mpirun -np 2 hostname` printed spark-a, spark-b "
                    "(expected spark-a)"),
    ]
    apply_dependencies(results)
    assert results[1].status == "skip" and "spark-b could not be checked" in results[1].message
    assert results[1].fix == ""

    hung = CheckResult("ssh-container", "spark-a", "fail", "ssh hung", peer="spark-b",
                       interface="enp1s0f1np1", fix="fix the ping failures first")
    ping_ok = CheckResult("ping", "spark-a", "pass", "ok", peer="spark-b", interface="enp1s0f1np1")
    apply_dependencies([ping_ok, hung])
    assert hung.status == "fail" and "ping on this link passed" in hung.fix

    hung = CheckResult("ssh-container", "spark-a", "fail", "ssh hung", peer="spark-b",
                       interface="enp1s0f1np1", fix="fix the ping failures first")
    ping_bad = CheckResult("ping", "spark-a", "fail", "no reply", peer="spark-b", interface="enp1s0f1np1")
    mpirun = CheckResult("mpirun", "spark-a", "fail", "hung")
    apply_dependencies([ping_bad, hung, mpirun])
    assert hung.status == "skip" and "ping from spark-a enp1s0f1np1 to spark-b failed" in hung.message
    assert mpirun.status == "skip" and "ssh between containers failed" in mpirun.message


def test_the_iperf3_server_command_returns_once_it_listens() -> None:
    """The real iperf3 on loopback: the server command returns only when its port listens, so
    the client (started right after, on another node) never races it; the client's JSON judges."""
    import shutil
    import socket
    import subprocess

    from orchestrator.netcheck.bandwidth import iperf_client_cmd, iperf_server_cmd, judge_throughput
    from orchestrator.netcheck.checks import Link

    if not (shutil.which("iperf3") and shutil.which("ss")):
        pytest.skip("iperf3 and ss are installed by make install (scripts/install-system-deps)")
    with socket.socket() as probe:  # a free port on loopback
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    link = Link("spark-a", "lo", "127.0.0.1", "spark-b", "lo", "127.0.0.1")
    subprocess.run(["bash", "-c", iperf_server_cmd(link, port)], check=True, timeout=30)
    with socket.socket() as client:  # listening already: a plain connect succeeds at once
        client.connect(("127.0.0.1", port))
    # that connect used up the one-off server (-1); a second server for the real client
    subprocess.run(["bash", "-c", "sleep 1; " + iperf_server_cmd(link, port)], check=True, timeout=30)
    out = subprocess.run(["bash", "-c", iperf_client_cmd(link, port)],
                         capture_output=True, text=True, timeout=60)
    result = judge_throughput(inventory(), link, out.returncode, out.stdout, out.stderr)
    assert result.status in ("pass", "fail") and result.value is not None and result.value > 0, result
