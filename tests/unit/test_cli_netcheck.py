"""cli/netcheck.py beyond the happy path: unreachable nodes, a failing gatherer, --deep (the
iperf3 round per link over the fake cluster) and the table rendering."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from conftest import FakeCluster
from test_netcheck import PING_OK, healthy_facts, healthy_probe, inventory

from orchestrator.cli import netcheck as cli_netcheck
from orchestrator.inventory import Inventory
from orchestrator.netcheck.bandwidth import throughput_links
from orchestrator.netcheck.checks import CheckResult
from orchestrator.netcheck.probes import IPERF_PORT_BASE


def answering(inv: Inventory, name: str, probe: Callable[[str], Any] = healthy_probe) -> Callable[..., Any]:
    def answer(request: dict[str, Any]) -> dict[str, Any]:
        facts = copy.deepcopy(healthy_facts(inv, name))
        facts["probes"] = {key: probe(key) for key in request.get("probes", {})}
        return facts
    return answer


def deep_probe(key: str) -> Any:
    return {"rc": 0, "out": PING_OK, "err": ""} if key.startswith("latency") else healthy_probe(key)


def iperf_json(gbps: float) -> str:
    return json.dumps({"end": {"sum_received": {"bits_per_second": gbps * 1e9}}})


def test_unreachable_nodes_and_failed_gatherers_are_failures(
        fake_cluster: Callable[..., FakeCluster]) -> None:
    inv = inventory(3)
    cluster = fake_cluster(inv, facts={"spark-a": answering(inv, "spark-a"),
                                       "spark-b": (0, "bash: python3: command not found", "")},
                           unreachable={"spark-c": "timed out"})

    results = cli_netcheck.run_netcheck(cluster.session("netcheck"), deep=False)

    connect = [r for r in results if r.check == "connect"]
    assert [(r.node, r.status) for r in connect] == [("spark-c", "fail")]
    assert connect[0].message == "cannot reach spark-c over SSH: timed out"
    facts = [r for r in results if r.check == "facts"]
    assert [(r.node, r.status) for r in facts] == [("spark-b", "fail")]
    assert "the facts gatherer printed no JSON" in facts[0].message
    assert facts[0].fix == "is python3 on the node? see the run log"
    assert not any(r.node == "spark-b" and r.check == "ping" for r in results)  # no facts, no judging
    assert len(cluster["spark-a"].calls) == 1


def test_deep_measures_each_link_once_one_at_a_time(fake_cluster: Callable[..., FakeCluster]) -> None:
    inv = inventory(2)
    cluster = fake_cluster(inv, facts={n.name: answering(inv, n.name, deep_probe) for n in inv.nodes})
    cluster["spark-a"].on("iperf3 -c", stdout=iperf_json(190.0), times=1)
    cluster["spark-a"].on("iperf3 -c", stdout=iperf_json(90.0))

    results = cli_netcheck.run_netcheck(cluster.session("netcheck"), deep=True)

    throughput = [r for r in results if r.check == "throughput"]
    links = throughput_links(inv)
    assert len(throughput) == len(links) == 2
    assert [(r.value, r.status) for r in throughput] == [(190.0, "pass"), (90.0, "fail")]
    assert all(r.unit == "Gb/s" and r.threshold == 184.0 for r in throughput)
    servers = [c for c in cluster.commands("spark-b") if "iperf3 -s" in c]
    assert [f"-p {IPERF_PORT_BASE + i}" in s for i, s in enumerate(servers)] == [True, True]
    # the server starts before its client, link after link
    kinds = [("server" if "iperf3 -s" in c else "client") for _, c in cluster.journal if "iperf3" in c]
    assert kinds == ["server", "client", "server", "client"]
    assert any(r.check == "latency" for r in results)


def test_deep_reports_a_server_that_would_not_start_and_skips_unreachable_ends(
        fake_cluster: Callable[..., FakeCluster]) -> None:
    inv = inventory(2)
    cluster = fake_cluster(inv)
    cluster["spark-b"].on("iperf3 -s", 127, "", "iperf3: command not found")

    results = cli_netcheck.measure_throughput(cluster.session("netcheck"), {})

    assert [r.status for r in results] == ["fail", "fail"]
    assert "did not run (exit 1)" in results[0].message and "iperf3: command not found" in results[0].message
    assert not any("iperf3 -c" in c for c in cluster.commands("spark-a"))

    cluster = fake_cluster(inv, unreachable={"spark-b": "down"})
    assert cli_netcheck.measure_throughput(cluster.session("netcheck"), {}) == []
    assert cluster.commands() == []


def test_values_are_shown_short() -> None:
    assert cli_netcheck._shown(None) == ""
    assert cli_netcheck._shown(0.052341) == "0.0523"
    assert cli_netcheck._shown(189.9876) == "190"
    assert cli_netcheck._shown(9000) == "9000"
    assert cli_netcheck._shown("x") == "x"


def many_results(fails: int = 1) -> list[CheckResult]:
    results = [CheckResult("ping", "spark-a", "pass", f"link {i} answers.", peer="spark-b",
                           interface="enp1s0f1np1", value=0.05, unit="ms", threshold=1.0)
               for i in range(41)]
    results += [CheckResult("mtu", "spark-b", "fail", "MTU 1500 [want] 9000.", interface="eth1",
                            value=1500, threshold=9000, fix="set fabric.mtu")] * fails
    results.append(CheckResult("speed", "spark-b", "warn", "slow link.", value=None))
    return results


def test_render_hides_passing_rows_on_large_clusters(capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    cli_netcheck.render(many_results(), 12.34, verbose=False)
    out = capsys.readouterr().out
    assert "link 0 answers." not in out
    assert "fail mtu spark-b eth1: MTU 1500 [want] 9000." in out  # markup in messages is escaped
    assert "    fix: set fabric.mtu" in out
    assert "warn speed spark-b: slow link." in out
    assert "FAILED netcheck: 41 pass, 1 warn, 1 fail in 12.3s (-v shows passing rows)" in out

    cli_netcheck.render(many_results(0), 1.0, verbose=True)
    out = capsys.readouterr().out
    assert "link 40 answers." in out and "0.05 ms" in out
    assert "OK netcheck: 41 pass, 1 warn, 0 fail in 1.0s" in out and "-v shows" not in out


def test_render_of_nothing_passing_hidden_prints_only_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    results = [CheckResult("ping", "spark-a", "pass", "ok.")] * 41
    cli_netcheck.render(results, 0.5, verbose=False)
    out = capsys.readouterr().out
    assert "sparkctl netcheck" not in out  # no table: every row was hidden
    assert "OK netcheck: 41 pass, 0 warn, 0 fail in 0.5s (-v shows passing rows)" in out
