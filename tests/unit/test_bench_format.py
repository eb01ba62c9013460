"""bench output people paste and look at: llama-benchy's markdown table (mean ± std, every
depth), CSV, statistics-based figures, the Prometheus parser, the quick/full defaults, the
duration said up front, and the plots (unknown values left out; saved runs and compare)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from orchestrator.bench import format as bench_format
from orchestrator.bench import plot as bench_plot
from orchestrator.bench.metrics import parse_prometheus
from orchestrator.bench.run import BenchConfig
from orchestrator.bench.stats import metric
from orchestrator.cli import cli
from orchestrator.cli.bench import choose_cells, expectation
from orchestrator.errors import InputError


def fig(mean: float, std: float = 1.0) -> dict[str, Any]:
    return {"mean": mean, "std": std, "values": [mean - std, mean + std]}


def doc(spec: bool = True) -> dict[str, Any]:
    """pp512 tg32 at depths 0 and 1024, one and four requests (the shape of a real result)."""
    cells = []
    for depth in (0, 1024):
        for c in (1, 4):
            cells.append({"depth": depth, "pp": 512, "tg": 32, "concurrency": c, "runs": 3,
                          "figures": {"pp_throughput": fig(1500.0 - depth / 10 + c, 12.5),
                                      "tg_throughput": fig(22.0 * c - depth / 1000, 0.25),
                                      "ttfr_ms": fig(340.0 + depth / 10),
                                      "est_ppt_ms": fig(338.0 + depth / 10),
                                      "e2e_ttft_ms": fig(341.0 + depth / 10),
                                      "error_count": 0},
                          "spec_decoding": {"acceptance_length": 2.5} if spec else None})
    return {"schema": "sparkctl-bench/1", "cells": cells, "started": "2026-11-25T16:00:00+0000",
            "settings": {"tg": [32], "pp": [512], "depth": [0, 1024], "concurrency": [1, 4],
                         "runs": 3, "warmup": True},
            "server": {"model": "Qwen/Qwen3-0.6B", "recipe": "qwen3-small", "engine": "vllm"},
            "interrupted": False, "ok": True}


def test_markdown_is_llama_benchys_table_with_every_depth() -> None:
    lines = bench_format.markdown(doc()).splitlines()
    assert lines[0] == "| model | test | t/s | ttfr (ms) | est_ppt (ms) | e2e_ttft (ms) |"
    assert lines[1] == "|:-----|-----:|-----:|-----:|-----:|-----:|"
    assert lines[2] == ("| Qwen/Qwen3-0.6B | pp512 | 1501.00 ± 12.50 | 340.00 ± 1.00 | "
                        "338.00 ± 1.00 | 341.00 ± 1.00 |")
    assert lines[3] == "| Qwen/Qwen3-0.6B | tg32 | 22.00 ± 0.25 |  |  |  |"
    tests = [line.split(" | ")[1] for line in lines[2:10]]
    assert tests == ["pp512", "tg32", "pp512 c4", "tg32 c4",
                     "pp512 @ d1024", "tg32 @ d1024", "pp512 @ d1024 c4", "tg32 @ d1024 c4"]
    assert "| tg32 @ d1024 | 20.98 ± 0.25 |" in lines[7]
    assert "recipe qwen3-small, engine vllm, 3 run(s) per test" in lines[-1]


def test_markdown_leaves_unmeasured_cells_empty_not_zero() -> None:
    data = doc()
    data["cells"][0]["figures"]["ttfr_ms"] = None
    row = bench_format.markdown(data).splitlines()[2]
    assert "| 1501.00 ± 12.50 |  | 338.00 ± 1.00 |" in row


def test_csv_has_mean_std_and_percentiles_per_row() -> None:
    data = doc()
    data["cells"][0]["figures"]["tg_throughput"] = metric([20.0, 22.0, 24.0])
    lines = bench_format.csv_text(data).splitlines()
    assert lines[0].startswith("model,test,kind,depth,concurrency,t_s_mean,t_s_std,t_s_p50,t_s_p90")
    tg = lines[2].split(",")
    assert tg[:5] == ["Qwen/Qwen3-0.6B", "tg32", "tg", "0", "1"]
    assert tg[5:9] == ["22.0000", "1.6330", "22.0000", "23.6000"] and tg[9] == ""


def test_sweep_formats_name_each_value() -> None:
    sweep = {"key": "speculative.max_draft_len", "runs": [{**doc(), "value": 2}, {**doc(), "value": 4}]}
    assert bench_format.sweep_markdown(sweep).count("| model | test |") == 2
    assert "### speculative.max_draft_len = 4" in bench_format.sweep_markdown(sweep)
    lines = bench_format.sweep_csv(sweep).splitlines()
    assert lines[0].startswith("speculative.max_draft_len,model,") and lines[-1].startswith("4,")


def test_metric_uses_population_std_and_percentiles() -> None:
    m = metric([1.0, 2.0, 3.0, 4.0], scale=1000)
    assert m is not None and m["mean"] == 2500 and round(m["std"], 3) == 1118.034
    assert m["p50"] == 2500 and m["p90"] == pytest.approx(3700)
    one = metric([5.0])
    assert one is not None and one["std"] == 0 and one["p99"] == 5.0
    assert metric([]) is None


def test_prometheus_parser_sums_label_sets_and_survives_a_bad_line() -> None:
    text = ('# TYPE vllm:num_requests_running gauge\n'
            'vllm:num_requests_running{model_name="a"} 2\n'
            'vllm:num_requests_running{model_name="b",x="q\\"uote"} 1\n'
            '# TYPE vllm:spec_decode_num_drafts counter\n'
            'vllm:spec_decode_num_drafts_total{model_name="a"} 7 1700000000000\n')
    values = parse_prometheus(text)
    assert values["vllm:num_requests_running"] == 3
    assert values["vllm:spec_decode_num_drafts_total"] == 7
    broken = parse_prometheus(text + "this is { not prometheus\n")
    assert broken["vllm:num_requests_running"] == 3


def test_quick_default_full_and_explicit_options() -> None:
    base = {"tg": None, "pp": None, "depth": None, "concurrency": None}
    assert choose_cells({**base, "full": False}) == {"tg": "32", "pp": "2048", "depth": "0",
                                                     "concurrency": "1"}
    full = choose_cells({**base, "full": True})
    assert full["concurrency"] == "1,4,8" and full["depth"] == "0,16384"
    assert choose_cells({**base, "tg": "64", "full": True})["tg"] == "64"


def test_the_duration_is_said_before_starting() -> None:
    quick = BenchConfig(tg=[32], pp=[2048], depth=[0], concurrency=[1], runs=3)
    assert quick.requests() == 4
    # 4 batches x (2048/1500 s prefill + 32/20 s generation)
    assert quick.estimate_seconds() == pytest.approx(4 * (2048 / 1500 + 1.6))
    assert "1 cell(s), 4 request(s): expect about 12 s" in expectation(quick)
    full = BenchConfig()
    assert "min" in expectation(full) and full.requests() == 208


def test_plot_path_is_checked_first(tmp_path: Path) -> None:
    bench_plot.check_plot_path(str(tmp_path / "ok.png"))
    for bad, why in ((tmp_path / "none" / "x.png", "does not exist"), (tmp_path, "a .png"),
                     (tmp_path / "x.txt", "a .png")):
        with pytest.raises(InputError, match=why):
            bench_plot.check_plot_path(str(bad))


def test_series_leave_unknown_values_out() -> None:
    data = doc()
    data["cells"][1]["figures"]["tg_throughput"] = None
    xs, ys, es = bench_plot._series(data, "tg_throughput", lambda c: c["depth"] == 0,
                                    lambda c: c["concurrency"])
    assert xs == [1] and ys == [22.0] and es == [0.25]


def test_title_names_model_engine_recipe_and_date() -> None:
    assert bench_plot.describe(doc()) == "Qwen/Qwen3-0.6B / vllm / recipe qwen3-small / 2026-11-25 16:00"


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, Path]:
    pytest.importorskip("matplotlib")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(doc()))
    b.write_text(json.dumps(doc(spec=False)))
    return a, b


def test_bench_plot_of_saved_runs(saved: tuple[Path, Path], tmp_path: Path) -> None:
    from PIL import Image

    out = tmp_path / "runs.png"
    result = CliRunner().invoke(cli, ["bench", "plot", str(saved[0]), str(saved[1]), "-o", str(out)])
    assert result.exit_code == 0, result.output
    with Image.open(out) as image:  # two depths + prefill + TTFT: a 2 x 2 grid
        assert image.size == (1040, 840)
    bad = CliRunner().invoke(cli, ["bench", "plot", str(saved[0]), "-o", str(tmp_path / "x.gif")])
    assert bad.exit_code == 2 and "a .png" in bad.output


def test_compare_plot_and_a_file_that_is_not_a_result(saved: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "cmp.png"
    result = CliRunner().invoke(cli, ["bench", "compare", str(saved[0]), str(saved[1]),
                                      "--plot", str(out)])
    assert result.exit_code == 0, result.output
    assert out.stat().st_size > 10_000 and "B/A" in result.output
    junk = tmp_path / "junk.json"
    junk.write_text("[1]")
    refused = CliRunner().invoke(cli, ["bench", "plot", str(junk)])
    assert refused.exit_code == 2 and "not a `sparkctl bench` result" in refused.output


def test_a_speed_that_could_not_be_measured_is_said_why() -> None:
    # issue 41: `bench --format md` left the pp t/s cell blank without a word
    from orchestrator.bench.format import markdown

    figure = {"mean": 20.0, "std": 1.0}
    doc = {"server": {"model": "m"}, "settings": {"runs": 1}, "started": "now", "cells": [
        {"depth": 0, "pp": 8, "tg": 32, "concurrency": 1,
         "figures": {"pp_throughput": None, "tg_throughput": figure, "ttfr_ms": figure,
                     "error_count": 0, "requests": 1}}]}
    text = markdown(doc)
    assert "| m | pp8 | n/a |" in text and "| m | tg32 | 20.00 ± 1.00 |" in text
    assert "n/a (pp8): the first token came back within the latency" in text
