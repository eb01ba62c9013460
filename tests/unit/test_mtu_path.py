"""Switch topology: the end-to-end MTU proof in `up` and the netcheck row that names the switch."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from orchestrator.core.plan import build_up_plan
from orchestrator.core.step import Change, NodeContext, RunOptions, RunState
from orchestrator.errors import SparkctlError
from orchestrator.inventory_checks import inventory_from_data
from orchestrator.netcheck.checks import Link
from orchestrator.netcheck.probes import judge_mtu_ping
from orchestrator.phases import mtu_path
from orchestrator.remote.gathered import NodeFacts, ProbeResult
from orchestrator.remote.transport import Result


def inventory(nodes: int = 3, topology: str | None = "switch", mtu: int = 9000) -> Any:
    fabric: dict[str, Any] = {"mtu": mtu}
    if topology:
        fabric["topology"] = topology
    return inventory_from_data({
        "cluster": {"name": "sw", "ssh_key": "/k"}, "fabric": fabric,
        "nodes": [{"name": f"spark-{chr(97 + i)}", "host": f"h{i}"} for i in range(nodes)],
    }, "sw.yml")


def test_df_ping_fills_one_frame_of_the_configured_mtu() -> None:
    assert mtu_path.df_ping_argv(9000, "enp1s0f1np1", "192.168.200.13") == [
        "ping", "-M", "do", "-s", "8972", "-c", "2", "-W", "2", "-I", "enp1s0f1np1",
        "192.168.200.13"]


def test_command_pings_every_peer_on_every_fabric_subnet() -> None:
    inv = inventory(3)
    cmd = mtu_path.mtu_path_cmd(inv, inv.nodes[0])
    # 2 peers x 2 twins, all at once
    assert cmd.count("ping -M do -s 8972") == 4 and cmd.endswith("wait")
    for address in ("192.168.200.13", "192.168.200.14", "192.168.201.13", "192.168.201.14"):
        assert address in cmd
    assert "192.168.200.12 " not in cmd  # never itself
    shlex.split(cmd)  # well-formed shell words


def test_plan_has_the_proof_on_a_switch_only() -> None:
    assert "fabric-mtu" in [p.name for p in build_up_plan(inventory(3)).phases]
    names = [p.name for p in build_up_plan(inventory(2, topology=None)).phases]
    assert "fabric-mtu" not in names and names.index("network") == 1


def test_parse_and_failure_message_name_node_interface_peer_and_switch() -> None:
    out = ("sparkctl-mtu ok enp1s0f1np1 spark-b 192.168.200.13\n"
           "sparkctl-mtu fail enP2p1s0f1np1 spark-b 192.168.201.13\n")
    results = mtu_path.parse_results(out)
    assert [r.ok for r in results] == [True, False]
    message = mtu_path.failure_message(inventory(2), "spark-a", results, 2)
    assert message is not None
    assert ("frames of 9000 bytes do not pass between spark-a enP2p1s0f1np1 and 192.168.201.13: "
            "set the switch ports to MTU >= 9000 (jumbo frames), or set fabric.mtu: 1500 in the "
            "inventory") in message
    assert mtu_path.failure_message(inventory(2), "spark-a", results[:1], 1) is None
    missing = mtu_path.failure_message(inventory(2), "spark-a", results[:1], 2)
    assert missing and "only 1 of 2" in missing


class FakeTransport:
    def __init__(self, stdout: str) -> None:
        self.stdout, self.commands = stdout, []  # type: ignore[var-annotated]

    def run(self, command: str, **kwargs: Any) -> Result:
        self.commands.append(command)
        return Result("spark-a", command, 0, self.stdout, "", 0.1)


def _ctx(inv: Any, transport: FakeTransport, shared: RunState, verify: bool = False) -> NodeContext:
    return NodeContext(inv, inv.nodes[0], NodeFacts(inv.nodes[0].name), {}, transport,  # type: ignore[arg-type]
                       RunOptions(verify=verify), shared)


def test_step_runs_after_a_change_or_with_verify_and_raises_on_a_dropped_frame() -> None:
    inv = inventory(2)
    step = mtu_path.MtuPath()
    idle = FakeTransport("")
    assert "not re-run" in (step.apply(_ctx(inv, idle, RunState()), Change("verify")) or "")
    assert idle.commands == []
    good = FakeTransport("sparkctl-mtu ok enp1s0f1np1 spark-b 192.168.200.13\n"
                         "sparkctl-mtu ok enP2p1s0f1np1 spark-b 192.168.201.13\n")
    assert "pass unfragmented" in (step.apply(_ctx(inv, good, RunState(), verify=True), Change("v")) or "")
    bad = FakeTransport("sparkctl-mtu fail enp1s0f1np1 spark-b 192.168.200.13\n"
                        "sparkctl-mtu ok enP2p1s0f1np1 spark-b 192.168.201.13\n")
    with pytest.raises(SparkctlError, match=r"spark-a enp1s0f1np1 and 192\.168\.200\.13"):
        step.apply(_ctx(inv, bad, RunState(changed_steps=["spark-a: network/apply"])), Change("v"))


def test_netcheck_mtu_row_names_the_switch_on_a_switch_and_the_mtu_rows_otherwise() -> None:
    link = Link("spark-a", "enp1s0f1np1", "192.168.200.12", "spark-b", "enp1s0f1np1",
                "192.168.200.13")
    dead = ProbeResult(1, "2 packets transmitted, 0 received, 100% packet loss\n", "")
    switch = judge_mtu_ping(inventory(2, topology="switch"), link, dead)
    assert switch.status == "fail"
    assert "frames of 9000 bytes do not pass between spark-a enp1s0f1np1 and 192.168.200.13" in switch.message
    assert "jumbo frames" in switch.fix and "fabric.mtu: 1500" in switch.fix
    direct = judge_mtu_ping(inventory(2, topology="b2b"), link, dead)
    assert direct.status == "fail" and "switch" not in direct.message
