"""The lab's simulated all_gather_perf: nccl-tests' formats and the documented model."""

from __future__ import annotations

import sys
from pathlib import Path

IMAGE = Path(__file__).resolve().parents[2] / "lab" / "sparklab" / "image"
sys.path.insert(0, str(IMAGE))

from sparklab_engine import nccl_tests as sim  # noqa: E402

from orchestrator.netcheck.nccl import parse_all_gather  # noqa: E402

BOTH = ["rocep1s0f1", "roceP2p1s0f1"]


def test_sizes_follow_nccl_tests_parsesize_and_step_factor() -> None:
    opts = sim.parse_args(["-b", "8M", "-e", "256M", "-f", "2", "-g", "1"])
    assert opts["b"] == 8 << 20 and opts["e"] == 256 << 20
    assert sim.sizes(opts) == [(8 << 20) * 2**i for i in range(6)]
    assert sim.sizes(sim.parse_args([])) == [32 << 20]  # nccl-tests' default: 32M once


def test_nccl_ib_hca_selection_like_nccl() -> None:
    assert sim.used_devices(BOTH, "") == BOTH
    assert sim.used_devices(BOTH, "rocep1s0f1") == ["rocep1s0f1"]
    assert sim.used_devices(BOTH, "=rocep1s0f1:1,roceP2p1s0f1:1") == BOTH
    assert sim.used_devices(BOTH, "^rocep1s0f1") == ["roceP2p1s0f1"]
    assert sim.hca_factor(BOTH, BOTH) == 1.0
    assert round(sim.SPARK_BUSBW * sim.hca_factor(BOTH, BOTH[:1]), 2) == 3.0


def test_mtu_factor_follows_the_roce_path_mtu() -> None:
    assert sim.roce_mtu(9000) == 4096 and sim.roce_mtu(1500) == 1024
    assert sim.mtu_factor(9000) == 1.0 and sim.mtu_factor(1500) == 0.25


def test_figures_saturate_at_the_spark_figure_and_follow_all_gather_busbw() -> None:
    usec, algbw, busbw = sim.figures(256 << 20, 5.0, 2, 1.0, 1.0)
    assert busbw == sim.SPARK_BUSBW and algbw == 2 * busbw
    assert abs(usec - (256 << 20) / (algbw * 1e9) * 1e6) < 1e-6
    assert sim.figures(256 << 20, 0.5, 2, 1.0, 1.0)[2] == sim.SPARK_BUSBW / 2  # a slow link
    assert sim.figures(8 << 20, 5.0, 1, 1.0, 1.0) == (0.0, 0.0, 0.0)


def test_printed_output_parses_with_sparkctls_parser() -> None:
    opts = sim.parse_args(["-b", "8M", "-e", "16M", "-f", "2"])
    lines = sim.header(opts, [sim.device_line(0, 7, "spark-a"), sim.device_line(1, 8, "spark-b")])
    half = sim.figures(8 << 20, 5.0, 2, 1.0, 1.0)
    lines += [sim.row(8 << 20, 2, [half, half]), *sim.footer(23.7)]
    text = "\n".join(lines)
    assert "     8388608       1048576     float    none      -1" in text
    run = parse_all_gather(text)
    assert run.peak is not None and run.peak.busbw == 23.7 and run.avg_busbw == 23.7
    assert run.hosts == ["spark-a", "spark-b"] and run.version == "2.19.6"
    assert sim.float_str(44739.2, 7) == "44739.2" and sim.float_str(2.999, 6) == "  3.00"
