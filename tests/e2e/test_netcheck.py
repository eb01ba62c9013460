"""netcheck on the lab: all pass after `up`, and each injected fault is caught and named.

One `sparkctl up` for the module (on a copy of the lab inventory with lab thresholds: veth links
are fast but far from 175 Gbps), then per fault: inject, netcheck --json, assert the failing
check names the node, the interface and a fix, restore.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Lab, Sparkctl, healthy_lab

pytestmark = pytest.mark.lab

CONTAINER = "trtllm-multinode"


sparkctl = Sparkctl(timeout=300)


@pytest.fixture(scope="module")
def upped(lab_session: list[Lab], tmp_path_factory: pytest.TempPathFactory) -> tuple[Lab, Path]:
    lab = healthy_lab(lab_session)
    data = yaml.safe_load(lab.inventory.read_text())
    # lab thresholds (the lead may put these in the lab's own inventory)
    data["fabric"].setdefault("min_link_gbps", 1)
    data["fabric"].setdefault("max_latency_ms", 5)
    inventory = tmp_path_factory.mktemp("netcheck") / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data))
    up = sparkctl("up", "--inventory", str(inventory), "--yes")
    assert up.returncode == 0, f"up failed:\n{up.stdout}\n{up.stderr}"
    # piped: the streamed lines are the record (with the proofs), stdout no table of them again
    assert not any(c in up.stdout for c in "│┃━┏└") and up.stdout.startswith("OK up: "), up.stdout
    if ", 0 changed," not in up.stdout:  # an earlier module may have left the lab up
        assert "✓ spark-a mpirun: mpirun -np 2 hostname reached spark-a, spark-b" in up.stderr
        assert "✓" not in up.stdout, "the steps are streamed once, on stderr"
    return lab, inventory


def netcheck(inventory: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    result = sparkctl("netcheck", "--inventory", str(inventory), "--json", *extra, timeout=240)
    assert result.stdout.strip(), result.stderr
    return result.returncode, json.loads(result.stdout)


def problems(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in report["checks"] if c["status"] == "fail"]


def find(report: dict[str, Any], check: str, **where: str) -> dict[str, Any]:
    matching = [c for c in problems(report) if c["check"] == check
                and all(c.get(k) == v for k, v in where.items())]
    assert matching, f"no failed {check} {where} in:\n" + "\n".join(
        f"{c['status']} {c['check']} {c['node']} {c['interface']}: {c['message']}" for c in problems(report))
    return matching[0]


@pytest.fixture
def faults(upped: tuple[Lab, Path]) -> Any:
    lab, _ = upped

    def inject(kind: str, *args: str) -> None:
        lab.cli("fault", kind, *args, check=True)

    yield inject
    lab.cli("fault", "restore", check=True)


def test_healthy_lab_passes_every_check(upped: tuple[Lab, Path]) -> None:
    _, inventory = upped
    code, report = netcheck(inventory, "--deep")
    assert problems(report) == [], [(p["check"], p.get("message")) for p in problems(report)]
    assert code == 0 and report["ok"] is True
    checks = {c["check"] for c in report["checks"]}
    assert {"interface", "address", "mtu", "route", "ping", "mtu-ping", "ssh-node", "ssh-container",
            "mpirun", "container-env", "image", "latency", "throughput", "roce-mtu",
            "roce-gid"} <= checks
    # each RDMA device's active MTU and the RoCEv2 GID index of its fabric address, per node
    roce = [c for c in report["checks"] if c["check"] in ("roce-mtu", "roce-gid")]
    assert len(roce) == 8 and all(c["value"] == (4096 if c["check"] == "roce-mtu" else 3)
                                  for c in roce), roce
    assert all(set(c) >= {"check", "node", "peer", "interface", "status", "value", "unit",
                          "threshold", "message"} for c in report["checks"])


def test_piped_deep_output_is_plain_lines_with_the_numbers_and_the_proofs(
        upped: tuple[Lab, Path]) -> None:
    """Off a terminal (issue 20, items 13-14): no box table, one line per shown check, and on
    success the measured figures per link, NCCL's bus bandwidth and the mpirun proof."""
    _, inventory = upped
    result = sparkctl("netcheck", "--inventory", str(inventory), "--deep", timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert not any(c in result.stdout for c in "│┃━┏└"), result.stdout

    def shown(prefix: str) -> list[str]:
        return [line for line in lines if line.startswith(prefix)]
    assert len(shown("pass throughput: ")) == 2 and all("Gb/s" in x for x in shown("pass throughput"))
    assert len(shown("pass latency: ")) == 4 and all("ms average" in x for x in shown("pass latency"))
    assert len(shown("pass nccl-busbw spark-a: ")) == 1 and "GB/s" in shown("pass nccl-busbw")[0]
    assert shown("pass mpirun spark-a: mpirun reached every container: spark-a, spark-b.")
    assert lines[-1].startswith("OK netcheck: ") and "0 fail" in lines[-1]
    assert len(lines) == 9, result.stdout  # 2 throughput, 4 latency, busbw, mpirun, summary


def test_cut_cable(upped: tuple[Lab, Path], faults: Any) -> None:
    _, inventory = upped
    faults("cut-cable", "--node", "spark-b", "--interface", "enp1s0f1np1")
    code, report = netcheck(inventory)
    assert code == 1
    fail = find(report, "interface", node="spark-b", interface="enp1s0f1np1")
    assert "cable" in fail["message"] and fail["fix"]
    find(report, "ping", node="spark-a", peer="spark-b", interface="enp1s0f1np1")


def test_address_changed_by_hand(upped: tuple[Lab, Path], faults: Any) -> None:
    _, inventory = upped
    faults("change-address", "--node", "spark-b", "--interface", "enp1s0f1np1",
           "--address", "192.168.200.99/24")
    code, report = netcheck(inventory)
    assert code == 1
    fail = find(report, "address", node="spark-b", interface="enp1s0f1np1")
    assert "192.168.200.99/24" in fail["message"] and "sparkctl up" in fail["fix"]
    find(report, "ping", node="spark-a", peer="spark-b", interface="enp1s0f1np1")


def test_mtu_changed_on_one_side(upped: tuple[Lab, Path], faults: Any) -> None:
    _, inventory = upped
    faults("set-mtu", "--node", "spark-b", "--interface", "enP2p1s0f1np1", "--mtu", "1500")
    code, report = netcheck(inventory)
    assert code == 1
    fail = find(report, "mtu", node="spark-b", interface="enP2p1s0f1np1")
    assert fail["value"] == 1500 and fail["threshold"] == 9000
    find(report, "mtu-ping", node="spark-a", peer="spark-b", interface="enP2p1s0f1np1")


def test_rdma_device_at_mtu_1024(upped: tuple[Lab, Path], faults: Any) -> None:
    """ibv_devinfo says active_mtu 1024 on one device (its link is at 9000 and pings fine):
    netcheck fails naming the device; nothing else fails."""
    _, inventory = upped
    faults("roce-mtu", "--node", "spark-b", "--interface", "enP2p1s0f1np1")
    code, report = netcheck(inventory)
    assert code == 1
    fail = find(report, "roce-mtu", node="spark-b", interface="enP2p1s0f1np1")
    assert "roceP2p1s0f1" in fail["message"] and (fail["value"], fail["threshold"]) == (1024, 4096)
    assert [c["check"] for c in problems(report)] == ["roce-mtu"], problems(report)


def test_delay_and_loss_caught_by_deep(upped: tuple[Lab, Path], faults: Any) -> None:
    _, inventory = upped
    faults("delay", "--node", "spark-b", "--interface", "enp1s0f1np1", "--ms", "20", "--loss", "10")
    code, report = netcheck(inventory, "--deep")
    assert code == 1
    fail = find(report, "latency", node="spark-b", peer="spark-a", interface="enp1s0f1np1")
    assert fail["value"] >= 20 and "tc qdisc" in fail["fix"]


def test_sshd_stopped_in_one_container(upped: tuple[Lab, Path], faults: Any) -> None:
    lab, inventory = upped
    # sshd is the container's main process: the exec dies with it (exit 137), as in docker
    lab.exec("spark-b", f"docker exec {CONTAINER} sh -c 'kill $(cat /run/sparkctl-sshd.pid)'",
             check=False)
    try:
        code, report = netcheck(inventory)
        assert code == 1
        fail = find(report, "ssh-node", node="spark-a", peer="spark-b")
        assert "spark-b" in fail["message"] and fail["fix"]
    finally:
        restore_container(lab, inventory)


def test_container_env_names_a_down_interface(upped: tuple[Lab, Path], faults: Any) -> None:
    lab, inventory = upped
    info = json.loads(lab.exec("spark-b", f"docker inspect {CONTAINER}").stdout)[0]
    env = [e for e in info["Config"]["Env"] if not e.startswith(("NCCL_SOCKET_IFNAME=", "PATH="))]
    env.append("NCCL_SOCKET_IFNAME=enp1s0f0np0")  # the uncabled port: down
    args = ["docker", "run", "-d", "--name", CONTAINER, "--network", "host"]
    for item in env:
        args += ["-e", item]
    for bind in info["HostConfig"].get("Binds") or []:
        args += ["-v", bind]
    for key, value in (info["Config"].get("Labels") or {}).items():
        args += ["--label", f"{key}={value}"]
    args += [info["Config"]["Image"], *(info["Config"].get("Cmd") or [])]
    lab.exec("spark-b", f"docker rm -f {CONTAINER}")
    lab.exec("spark-b", args)
    try:
        code, report = netcheck(inventory)
        assert code == 1
        fail = find(report, "container-env", node="spark-b", interface="enp1s0f0np0")
        assert "NCCL_SOCKET_IFNAME" in fail["message"] and fail["fix"]
    finally:
        restore_container(lab, inventory)


def restore_container(lab: Lab, inventory: Path) -> None:
    """Put the sparkctl container back so later tests start healthy."""
    lab.exec("spark-b", f"docker rm -f {CONTAINER}", check=False)
    up = sparkctl("up", "--inventory", str(inventory), "--yes")
    assert up.returncode == 0, f"up failed:\n{up.stdout}\n{up.stderr}"
