"""The box guard (status/gpu.py): nvidia-smi's clock, temperature, power and throttle reasons
read from status's one memory answer, judged (stuck clock, hot, throttled), and named in
status's problems; and the lab's nvidia-smi answering those fields as a GB10 does, with faults."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import cluster_of
from conftest import node_facts as as_facts
from test_status import INVENTORY, node_facts

from orchestrator.status import assess as status
from orchestrator.status.gpu import GpuReading, gpu_text, judge, node_gpu, parse_reading
from orchestrator.status.memory import MEMORY_CMD, memory_text, node_memory

ROOT = Path(__file__).resolve().parents[2]
MEMINFO = "MemTotal:       125419520 kB\nMemAvailable:   119537664 kB\n--gpu\n"
QUERY = ("memory.used,memory.total,utilization.gpu,clocks.sm,clocks.max.sm,temperature.gpu,"
         "power.draw,clocks_throttle_reasons.active")


def with_gpu(facts: dict[str, Any], line: str) -> dict[str, Any]:
    facts["commands"]["memory"] = {"rc": 0, "out": MEMINFO + line + "\n"}
    return facts


def test_the_memory_command_asks_the_guard_fields_once_and_falls_back_without_them() -> None:
    assert f"--query-gpu={QUERY} --format=csv,noheader,nounits" in MEMORY_CMD
    # a driver that refuses one field fails the whole query: the memory figures still come
    assert MEMORY_CMD.count("nvidia-smi ") == 2 and " || nvidia-smi --query-gpu=memory.used," \
        "memory.total,utilization.gpu --format" in MEMORY_CMD


def test_a_gb10_answer_is_read_with_n_a_left_out() -> None:
    facts = with_gpu({"commands": {}}, "[N/A], [N/A], 97, 702, 3003, 58, 31.05, 0x0000000000000000")
    gpu = node_gpu(as_facts(facts))
    assert gpu == GpuReading(97.0, 702.0, 3003.0, 58.0, 31.05, 0)
    memory = node_memory(as_facts(facts))
    assert memory["gpu"] == {"sm_clock_mhz": 702.0, "max_sm_clock_mhz": 3003.0,
                             "temperature_c": 58.0, "power_w": 31.05, "throttle_reasons": 0}
    assert memory_text(memory).endswith("GPU 97 %, SM 702/3003 MHz, 58 °C, 31.05 W")
    # the fallback answer (three fields) and no answer: nothing known, nothing judged
    assert node_gpu(as_facts(with_gpu({"commands": {}}, "[N/A], [N/A], 35"))) == GpuReading(35.0)
    assert node_gpu(as_facts({"commands": {}})) == GpuReading() and judge(GpuReading()) == []
    assert parse_reading(["[N/A]", "[N/A]", "[N/A]", "[N/A]", "[N/A]", "[N/A]"]) == GpuReading()
    assert gpu_text({}) == ""


@pytest.mark.parametrize(("reading", "kinds"), [
    (GpuReading(97, 702, 3003, 58, 31, 0), ["stuck-clock"]),
    (GpuReading(3, 702, 3003, 40, 4, 0x1), []),           # idle: a low clock is on purpose
    (GpuReading(97, 2400, 3003, 70, 80, 0), []),          # busy and boosting: fine
    (GpuReading(98, 1995, 3003, 93, 68, 0x20), ["thermal-throttle"]),
    (GpuReading(98, 2400, 3003, 86, 90, 0), ["hot"]),
    (GpuReading(98, 900, 3003, 60, 30, 0x4), ["power-throttle"]),  # explained: no stuck verdict
    (GpuReading(98, 600, 3003, 91, 30, 0x40 | 0x80), ["thermal-throttle", "power-throttle"]),
    (GpuReading(None, 702, 3003, None, None, None), []),  # busy unknown: no verdict
])
def test_the_guard_judges(reading: GpuReading, kinds: list[str]) -> None:
    assert [p.kind for p in judge(reading)] == kinds


def test_status_names_the_node_what_is_wrong_and_what_to_do() -> None:
    facts = {"spark-a": with_gpu(node_facts("spark-a"), "[N/A], [N/A], 12, 2418, 3003, 45, 20.1, 0x0"),
             "spark-b": with_gpu(node_facts("spark-b"),
                                 "[N/A], [N/A], 97, 702, 3003, 58, 31.05, 0x0000000000000000")}
    result = status.assess(INVENTORY, cluster_of(facts), {})
    assert not result["ok"] and result["state"] == "degraded"
    assert result["nodes"]["spark-a"]["problems"] == []
    b = result["nodes"]["spark-b"]
    assert b["state"] == "problem" and b["gpu_problems"] == ["stuck-clock"]
    assert b["problems"] == [
        "GPU clock stuck at 702 of 3003 MHz while 97 % busy, with no throttle reason (the GB10's "
        "low-power state: decode runs at about half speed): power-cycle the box fully: shut it "
        "down, unplug the power adapter from the wall and from the box, wait 60 s, plug it back "
        "in (a reboot does not clear this state)"]
    hot = status.assess(INVENTORY, cluster_of({"spark-a": facts["spark-a"], "spark-b": with_gpu(
        node_facts("spark-b"), "[N/A], [N/A], 98, 1995, 3003, 93, 68.4, 0x0000000000000020")}), {})
    assert hot["nodes"]["spark-b"]["problems"][0].startswith(
        "GPU thermal slowdown is active (1995 MHz, 93 °C): give it air")


# ---------------------------------------------------------------- the lab's nvidia-smi

@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    path = ROOT / "lab/sparklab/node_tools/nvidia-smi"
    loader = importlib.machinery.SourceFileLoader("sparklab_nvidia_smi", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    (tmp_path / "faults").mkdir()
    monkeypatch.setattr(module, "FAULTS", str(tmp_path / "faults"))
    return module


def ask(smi: ModuleType, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = smi.main(list(args))
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


def test_the_lab_gpu_answers_the_guard_fields_and_its_faults(
        smi: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    query = f"--query-gpu={QUERY}"
    assert ask(smi, capsys, query, "--format=csv,noheader,nounits") == (
        0, "[N/A], [N/A], 0, 2418, 3003, 41, 4.12, 0x0000000000000001\n")
    (tmp_path / "faults" / "gpu-throttle").touch()
    rc, out = ask(smi, capsys, query, "--format=csv,noheader,nounits")
    assert rc == 0 and [p.kind for p in judge(node_gpu(as_facts(with_gpu({"commands": {}}, out))))] == [
        "stuck-clock"]
    (tmp_path / "faults" / "gpu-throttle").unlink()
    (tmp_path / "faults" / "gpu-hot").touch()
    assert ask(smi, capsys, "--query-gpu=temperature.gpu,clocks_event_reasons.sw_thermal_slowdown,"
               "clocks_throttle_reasons.active", "--format=csv") == (
        0, "temperature.gpu, clocks_event_reasons.sw_thermal_slowdown, "
           "clocks_throttle_reasons.active\n93, Active, 0x0000000000000020\n")
    assert "93C" in ask(smi, capsys)[1]
    # as strict as the real one: one unknown field fails the whole query
    assert ask(smi, capsys, "--query-gpu=clocks.sm,temperature.gpu.limit", "--format=csv") == (
        2, 'Field "temperature.gpu.limit" is not a valid field to query.\n')


# ---------------------------------------------------------------- engines' latency histograms

def test_latency_quantiles_as_prometheus_computes_them() -> None:
    from orchestrator.status.latency import latency_figures, quantile

    inf = float("inf")
    # 100 observations: 50 at <= 0.1 s, 40 in (0.1, 0.2], 10 in (0.2, 0.4]
    buckets = [(0.1, 50.0), (0.2, 90.0), (0.4, 100.0), (inf, 100.0)]
    assert quantile(0.5, buckets) == pytest.approx(0.1)
    assert quantile(0.95, buckets) == pytest.approx(0.3)
    assert quantile(0.5, [(0.1, 0.0), (inf, 0.0)]) is None  # no request yet: no figure
    assert quantile(0.5, [(0.1, 0.0), (inf, 4.0)]) == 0.1  # all above the last bound
    text = "".join(
        f'vllm:time_to_first_token_seconds_bucket{{model_name="m",le="{le}"}} {n}\n'
        for le, n in (("0.1", 5), ("0.2", 9), ("+Inf", 10)))
    text = "# TYPE vllm:time_to_first_token_seconds histogram\n" + text
    assert latency_figures(text) == {"ttft_p50_s": pytest.approx(0.1),
                                     "ttft_p95_s": pytest.approx(0.2)}
    assert latency_figures("not prometheus {") == {}


def test_the_lab_engine_publishes_what_status_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulated SGLang's /metrics (token counters, TTFT and ITL histograms) read back by
    status's summary: the figures the dashboard shows per server."""
    import sys

    monkeypatch.syspath_prepend(str(ROOT / "lab/sparklab/image"))
    from sparklab_engine.token_stats import TokenStats

    from orchestrator.status.memory import summarize_metrics

    stats = TokenStats()
    stats.first_token(12, 0.05)
    stats.first_token(30, 0.3)
    stats.tokens(4, 0.08)  # 4 tokens 80 ms after the previous ones: 20 ms each
    figures = summarize_metrics(stats.prometheus("sglang", 'model_name="m"'))
    assert figures["prompt_tokens"] == 42 and figures["generation_tokens"] == 6
    assert 0.04 < figures["ttft_p50_s"] <= 0.06 and 0.25 < figures["ttft_p95_s"] <= 0.5
    assert 0.015 < figures["itl_p50_s"] <= 0.02
    assert "sparklab_engine.token_stats" in sys.modules


def test_the_model_cache_free_space_is_asked_where_the_inventory_keeps_it() -> None:
    from orchestrator.status.memory import facts_request, model_cache_cmd

    command = facts_request(INVENTORY)["commands"]["model_cache"]
    assert command == model_cache_cmd("~/.cache/huggingface", "nvidia")
    assert command.startswith('p="$(getent passwd nvidia | cut -d: -f6)"/.cache/huggingface;')
    assert model_cache_cmd("/data/my hf", "nvidia").startswith("p='/data/my hf';")
    facts = with_gpu(node_facts("spark-a"), "[N/A], [N/A], 0")
    facts["commands"]["model_cache"] = {"rc": 0, "out": "74723581952\n"}
    assert node_memory(as_facts(facts))["model_cache_free_gb"] == 74.7
    facts["commands"]["model_cache"] = {"rc": 1, "out": ""}
    assert "model_cache_free_gb" not in node_memory(as_facts(facts))
