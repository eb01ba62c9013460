"""netcheck --deep's NCCL test: the command, nccl-tests' output parsed, the bus bandwidth judged."""
# ruff: noqa: E501  (nccl-tests output lines are wider than the code)

from __future__ import annotations

import copy
import shlex
from typing import Any

from conftest import cluster_of
from test_netcheck import healthy_facts, inventory

from orchestrator.netcheck.nccl import (
    NOT_FOUND,
    all_gather_cmd,
    forwarded_env,
    judge_all_gather,
    parse_all_gather,
)

# nccl-tests 2.19.6 output shape (src/util.cu formats), two ranks
OUTPUT = """\
# nccl-tests version 2.19.6 nccl-headers=22707 nccl-library=22707
# Collective test starting: all_gather_perf
# nThread 1 nGpus 1 minBytes 8388608 maxBytes 268435456 step: 2(factor) warmup iters: 1 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0
#
# Using devices
#  Rank  0 Group  0 Pid   4242 on    spark-a device  0 [000f:01:00] NVIDIA GB10
#  Rank  1 Group  0 Pid   4343 on    spark-b device  0 [000f:01:00] NVIDIA GB10
#
#                                                       out-of-place                       in-place
#        size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#         (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
     8388608       1048576     float    none      -1   476.65   17.60    8.80       0   470.12   17.84    8.92       0
   134217728      16777216     float    none      -1  5900.10   22.75   11.37       0  5800.00   23.14   11.57       0
   268435456      33554432     float    none      -1  11327.0   23.70   11.85       0  11300.0   23.76   11.88       0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 10.6983
#
# Collective test concluded: all_gather_perf
#
"""


def _scaled(factor: float) -> str:
    """OUTPUT with every busbw column multiplied (a healthy run is ~2x the figures above)."""
    lines = []
    for line in OUTPUT.splitlines():
        tokens = line.split()
        if tokens and tokens[0].isdigit():
            tokens[7] = f"{float(tokens[7]) * factor:.2f}"
            tokens[11] = f"{float(tokens[11]) * factor:.2f}"
            line = "  ".join(tokens)
        lines.append(line)
    return "\n".join(lines)


def test_command_finds_the_binary_and_runs_one_rank_per_node_with_the_nccl_env() -> None:
    inv = inventory(2)
    cmd = all_gather_cmd(inv)
    words = shlex.split(cmd)
    assert words[:3] == ["docker", "exec", inv.container.name]
    script = words[-1]
    assert "command -v all_gather_perf" in script and "exit 127" in script
    assert "mpirun -np 2 -x NCCL_SOCKET_IFNAME -x NCCL_IB_HCA -x UCX_NET_DEVICES" in script
    assert '"$bin" -b 8M -e 256M -f 2 -g 1' in script


def test_ring_forwards_the_ring_settings() -> None:
    ring = inventory(3, topology="ring")
    assert {"NCCL_IB_MERGE_NICS", "NCCL_NET_PLUGIN", "NCCL_IB_SUBNET_AWARE_ROUTING"} <= set(
        forwarded_env(ring))
    assert "NCCL_NET_PLUGIN" not in forwarded_env(inventory(2))


def test_parse_reads_the_table_the_average_the_version_and_the_ranks() -> None:
    run = parse_all_gather(OUTPUT)
    assert [r.size for r in run.rows] == [8388608, 134217728, 268435456]
    assert run.peak is not None and run.peak.busbw == 11.88 and run.peak.busbw_out == 11.85
    assert run.avg_busbw == 10.6983 and run.version == "2.19.6"
    assert run.hosts == ["spark-a", "spark-b"]
    assert parse_all_gather("garbage\n# Avg bus bandwidth : x\n").peak is None


def _facts(inv: Any) -> dict[str, dict[str, Any]]:
    return {n.name: healthy_facts(inv, n.name) for n in inv.nodes}


def test_a_healthy_run_passes_and_shows_busbw_in_gb_and_gbit() -> None:
    inv = inventory(2)
    result = judge_all_gather(inv, 0, _scaled(2.0), "", cluster_of(_facts(inv)))
    assert result.status == "pass" and result.value == 23.76 and result.threshold == 21.875
    assert "23.76 GB/s (190 Gb/s) at 256M" in result.message
    assert "avg bus bandwidth 10.70 GB/s" in result.message and "spark-a, spark-b" in result.message


def test_low_busbw_names_a_half_nccl_ib_hca_with_the_fix() -> None:
    inv = inventory(2)
    facts = _facts(inv)
    env = facts["spark-a"]["containers"][inv.container.name]["Config"]["Env"]
    env[:] = [e for e in env if not e.startswith("NCCL_IB_HCA=")] + ["NCCL_IB_HCA=rocep1s0f1"]
    result = judge_all_gather(inv, 0, _scaled(0.25), "", cluster_of(facts))
    assert result.status == "fail" and result.value is not None and result.value < 21.875
    assert "NCCL_IB_HCA=rocep1s0f1" in result.message and "spark-a" in result.message
    assert "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1" in result.fix


def test_low_busbw_names_a_small_mtu_and_a_non_fabric_socket_interface() -> None:
    inv = inventory(2)
    facts = _facts(inv)
    facts["spark-b"]["links"]["enP2p1s0f1np1"]["mtu"] = 1500
    env = facts["spark-b"]["containers"][inv.container.name]["Config"]["Env"]
    env[:] = [e for e in env if not e.startswith("NCCL_SOCKET_IFNAME=")] + ["NCCL_SOCKET_IFNAME=eth0"]
    result = judge_all_gather(inv, 0, _scaled(0.5), "", cluster_of(facts))
    assert result.status == "fail"
    assert "enP2p1s0f1np1 MTU 1500 on spark-b" in result.message
    assert "NCCL_SOCKET_IFNAME=eth0 on spark-b" in result.message
    assert "fabric.mtu: 9000" in result.fix


def test_low_busbw_without_a_config_cause_points_at_cable_and_nccl_build() -> None:
    inv = inventory(2)
    result = judge_all_gather(inv, 0, _scaled(0.25), "", cluster_of(_facts(inv)))
    assert result.status == "fail" and "look right" in result.message
    assert "release build" in result.fix


def test_ring_threshold_is_ten() -> None:
    inv = inventory(3, topology="ring")
    facts = {n.name: copy.deepcopy(healthy_facts(inventory(2), "spark-a")) for n in inv.nodes}
    result = judge_all_gather(inv, 0, OUTPUT, "", cluster_of(facts))
    assert result.threshold == 10.0 and result.status == "pass"


def test_missing_binary_is_a_skip_with_the_build_steps() -> None:
    inv = inventory(2)
    result = judge_all_gather(inv, 127, "", NOT_FOUND + "\n", cluster_of(_facts(inv)))
    assert result.status == "skip" and "nccl-tests" in result.message
    assert "make MPI=1" in result.fix and "github.com/NVIDIA/nccl-tests" in result.fix


def test_a_failed_run_fails_with_its_error() -> None:
    inv = inventory(2)
    result = judge_all_gather(inv, 1, "", "NCCL error: remote process exited", cluster_of(_facts(inv)))
    assert result.status == "fail" and "remote process exited" in result.message
