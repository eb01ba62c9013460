"""bench: engines' metric formats, nodes' state, the sweep (with fakes), compare and plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.bench import render as bench_render
from orchestrator.bench.metrics import parse_node_state, parse_prometheus
from orchestrator.bench.sweep import (
    best_value,
    parse_sweep,
    resolve_key,
    run_sweep,
    write_variants,
)
from orchestrator.engines import REGISTRY, get_engine
from orchestrator.engines.sglang.meter import SglangMeter
from orchestrator.engines.trtllm.meter import TrtllmMeter, trtllm_counts
from orchestrator.engines.vllm.meter import VllmMeter
from orchestrator.errors import InputError

# ------------------------------------------------------------------ engines' metrics

TRTLLM = json.dumps([
    {"iter": 1, "numActiveRequests": 1, "specDecodingStats": {
        "numDraftTokens": 0, "numAcceptedTokens": 0, "numRequestsWithDraftTokens": 0,
        "acceptanceLength": 0.0, "iterLatencyMS": 30.0, "draftOverhead": 0.0}},
    {"iter": 2, "numActiveRequests": 2, "specDecodingStats": {
        "numDraftTokens": 6, "numAcceptedTokens": 4, "numRequestsWithDraftTokens": 2,
        "acceptanceLength": 3.0, "iterLatencyMS": 40.0, "draftOverhead": 0.2}},
    {"iter": 3, "numActiveRequests": 1, "specDecodingStats": {
        "numDraftTokens": 3, "numAcceptedTokens": 1, "numRequestsWithDraftTokens": 1,
        "acceptanceLength": 2.0, "iterLatencyMS": 40.0, "draftOverhead": 0.2}},
])

VLLM_BEFORE = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0
"""
VLLM_AFTER = VLLM_BEFORE.replace("} 10.0", "} 110.0").replace("} 30.0", "} 330.0") \
    .replace("} 20.0", "} 170.0")

SGLANG = """# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="m"} 2.75
sglang:spec_accept_rate{model_name="m"} 0.583
sglang:num_running_reqs{model_name="m"} 0.0
"""


class Feed:
    """A /metrics that answers the given bodies in turn (the last one forever)."""

    def __init__(self, *bodies: str) -> None:
        self.bodies = list(bodies)

    def __call__(self) -> str:
        return self.bodies.pop(0) if len(self.bodies) > 1 else self.bodies[0]


def test_trtllm_iteration_stats_are_summed_across_drains() -> None:
    assert trtllm_counts(TRTLLM) == {"drafted": 9, "accepted": 5, "requests": 3, "iterations": 2}
    meter = TrtllmMeter(Feed("[]", TRTLLM, TRTLLM, "[]"))
    meter.begin()  # drains what came before
    meter.poll()
    spec = meter.end()
    assert spec is not None
    assert spec["acceptance_rate"] == pytest.approx(10 / 18)
    assert spec["acceptance_length"] == pytest.approx((10 + 6) / 6)  # TRT-LLM's definition
    assert spec["draft_tokens"] == 18


def test_trtllm_without_iteration_stats_says_why() -> None:
    meter = TrtllmMeter(Feed("[]"))
    meter.begin()
    assert meter.end() is None
    assert "enable_iter_perf_stats" in (meter.note or "")


def test_vllm_counters_are_deltas_over_the_cell() -> None:
    values = parse_prometheus(VLLM_BEFORE)
    assert values["vllm:spec_decode_num_drafts_total"] == 10.0
    meter = VllmMeter(Feed(VLLM_BEFORE, VLLM_AFTER))
    meter.begin()
    spec = meter.end()
    assert spec is not None
    assert spec["acceptance_rate"] == pytest.approx(150 / 300)
    assert spec["acceptance_length"] == pytest.approx(1 + 150 / 100)
    assert spec["drafts"] == 100


def test_vllm_counters_without_the_total_suffix_too() -> None:
    before = VLLM_BEFORE.replace("_total{", "{")
    after = VLLM_AFTER.replace("_total{", "{")
    meter = VllmMeter(Feed(before, after))
    meter.begin()
    assert (meter.end() or {})["acceptance_rate"] == pytest.approx(0.5)


def test_sglang_gauges_are_read_at_the_end() -> None:
    meter = SglangMeter(Feed(SGLANG))
    meter.begin()
    assert meter.end() == {"acceptance_rate": 0.583, "acceptance_length": 2.75,
                           "source": SglangMeter.source}
    empty = SglangMeter(Feed("sglang:num_running_reqs 0\n"))
    assert empty.end() is None and "spec_accept" in (empty.note or "")


def test_every_engine_has_a_meter() -> None:
    meters = {name: get_engine(name).spec_meter for name in REGISTRY}
    assert {k: meters[k] for k in ("trtllm", "vllm", "sglang")} == {
        "trtllm": TrtllmMeter, "vllm": VllmMeter, "sglang": SglangMeter}
    assert set(meters) == set(REGISTRY)


def test_node_state_from_nvidia_smi_and_meminfo() -> None:
    spark = "2418, 3003, 41, 4.12, [N/A], 0\n--meminfo\nMemTotal:  127535104 kB\nMemAvailable: 27535104 kB\n"
    state = parse_node_state(spark)
    assert state["sm_clock_mhz"] == 2418 and state["temperature_c"] == 41 and state["power_w"] == 4.12
    assert state["gpu_memory_used_mib"] is None
    assert state["memory_used_gb"] == pytest.approx(95.37, abs=0.01)  # unified memory: meminfo
    discrete = parse_node_state("1980, 1980, 60, 300.5, 40960, 99\n--meminfo\n")
    assert discrete["memory_used_gb"] == 40.0


# ------------------------------------------------------------------ sweep

RECIPE = {"name": "r", "model": "org/m", "tp_size": 2, "nodes": 2,
          "speculative": {"decoding_type": "Eagle", "max_draft_len": 3, "draft_model": "org/d"},
          "memory": {"weights_gb": 10}}


def test_sweep_values_and_key_paths() -> None:
    assert parse_sweep("speculative.max_draft_len=1, 2,4") == ("speculative.max_draft_len", [1, 2, 4])
    assert parse_sweep("memory.kv_cache_fraction=0.8,0.9")[1] == [0.8, 0.9]
    assert resolve_key(RECIPE, "max_draft_len") == ["speculative", "max_draft_len"]
    assert resolve_key(RECIPE, "speculative.max_draft_len") == ["speculative", "max_draft_len"]
    for bad in ("nope=1", "max_draft_len", "x="):
        with pytest.raises(InputError):
            key, _ = parse_sweep(bad)
            resolve_key(RECIPE, key)


def test_variants_are_written_and_validated_before_any_relaunch(tmp_path: Path) -> None:
    seen: list[Path] = []
    key, files = write_variants(RECIPE, "max_draft_len", [1, 8], tmp_path, seen.append)
    assert key == "speculative.max_draft_len" and seen == files
    import yaml

    assert yaml.safe_load(files[1].read_text())["speculative"]["max_draft_len"] == 8
    assert RECIPE["speculative"]["max_draft_len"] == 3  # the original is untouched

    def refuse(path: Path) -> None:
        raise InputError("invalid recipe")

    with pytest.raises(InputError):
        write_variants(RECIPE, "max_draft_len", [1], tmp_path, refuse)


def fake_doc(rate: float, accept: float = 0.5) -> dict[str, Any]:
    figure = {"mean": rate, "std": 0.0, "values": [rate]}
    return {"settings": {"tg": [8], "pp": [16], "depth": [0], "concurrency": [1, 2], "runs": 1,
                         "warmup": False},
            "cells": [{"depth": 0, "pp": 16, "tg": 8, "concurrency": c, "runs": 1,
                       "figures": {"tg_throughput": {**figure, "mean": rate * c},
                                   "tg_req_throughput": figure, "peak_throughput": figure,
                                   "pp_throughput": figure, "ttft_ms": figure},
                       "spec_decoding": {"acceptance_rate": accept, "acceptance_length": 1 + accept,
                                         "draft_tokens": 100, "accepted_tokens": round(accept * 100),
                                         "drafts": 100},
                       "nodes": {"spark-a": {"sm_clock_mhz": 2418.0}}}
                      for c in (1, 2)],
            "interrupted": False, "server": {"recipe": "r", "config_hash": "abc"}}


def test_sweep_measures_each_value_restores_and_marks_the_best(tmp_path: Path) -> None:
    launched: list[str] = []
    rates = {1: 40.0, 2: 55.0, 4: 50.0}
    result = run_sweep([1, 2, 4], [tmp_path / f"{v}.yml" for v in (1, 2, 4)],
                       lambda f: launched.append(Path(f).name), lambda v: fake_doc(rates[v]),
                       "qwen3-235b", lambda line: None)
    assert launched == ["1.yml", "2.yml", "4.yml", "qwen3-235b"]
    assert result["best"] == 2 and result["restored"] and result["error"] is None
    assert best_value(result["runs"]) == 2


def test_sweep_restores_the_original_after_a_failed_relaunch(tmp_path: Path) -> None:
    launched: list[str] = []

    def relaunch(recipe: Path | str) -> None:
        launched.append(Path(recipe).name)
        if Path(recipe).name == "2.yml":
            raise RuntimeError("launch failed: not ready within 120 s")

    result = run_sweep([1, 2, 4], [tmp_path / f"{v}.yml" for v in (1, 2, 4)], relaunch,
                       lambda v: fake_doc(10.0 * v), "qwen3-235b", lambda line: None)
    assert launched == ["1.yml", "2.yml", "qwen3-235b"]
    assert "not ready" in result["error"] and result["restored"]
    assert [r["value"] for r in result["runs"]] == [1]


def test_sweep_restores_the_original_after_ctrl_c(tmp_path: Path) -> None:
    launched: list[str] = []

    def measure(value: Any) -> dict[str, Any]:
        raise KeyboardInterrupt

    result = run_sweep([1, 2], [tmp_path / "1.yml", tmp_path / "2.yml"],
                       lambda f: launched.append(Path(f).name), measure, "orig", lambda line: None)
    assert launched == ["1.yml", "orig"] and result["interrupted"] and result["restored"]


def test_a_failed_restore_is_reported(tmp_path: Path) -> None:
    def relaunch(recipe: Path | str) -> None:
        if recipe == "orig":
            raise RuntimeError("head unreachable")

    result = run_sweep([1], [tmp_path / "1.yml"], relaunch, lambda v: fake_doc(1.0), "orig",
                       lambda line: None)
    assert not result["restored"] and "unreachable" in result["restore_error"]


# ------------------------------------------------------------------ compare, table, plot

def test_compare_shows_ratios_cell_by_cell() -> None:
    rows = bench_render.compare_rows(fake_doc(20.0), fake_doc(30.0, accept=0.75))
    tg = [r for r in rows if r[0] == "pp16 tg8 d0 c1" and r[1] == "t/s"]
    assert tg == [["pp16 tg8 d0 c1", "t/s", "20.0", "30.0", "1.50x"]]
    assert ["whole run", "acceptance rate", "0.50", "0.75", "1.50x"] in rows


def test_result_table_rows_like_the_owners_table() -> None:
    rows = bench_render.result_rows(fake_doc(20.0))
    assert rows[0] == ["tg8 (t/s)", "20.0", "40.0 (20.0/req)"]
    assert rows[1][0] == "pp16, depth 0" and "TTFT 20 ms" in rows[1][1]
    assert rows[-1][1] == "0.50 / 1.50"


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from PIL import Image

    from orchestrator.bench import plot as bench_plot

    path = tmp_path / "bench.png"
    assert bench_plot.plot(fake_doc(20.0), str(path)) == [str(path)]
    with Image.open(path) as image:  # one depth: generation, prefill, TTFT side by side
        assert image.format == "PNG" and image.size == (1560, 420)
    runs = [{**fake_doc(10.0 * v), "value": v} for v in (1, 2, 4)]
    sweep = {"sweep": {"key": "speculative.max_draft_len", "runs": runs, "best": 4}}
    written = bench_plot.plot(sweep, str(tmp_path / "sweep.png"))
    assert written == [str(tmp_path / "sweep.png"), str(tmp_path / "sweep-sweep.png")]
    with Image.open(tmp_path / "sweep-sweep.png") as image:
        assert image.size == (700, 420)
