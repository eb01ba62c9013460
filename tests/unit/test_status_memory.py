"""status's memory (MemAvailable, GPU where known, the guard's threshold), the engines' own
/metrics read by meaning, and `status --watch` (redrawn on a terminal, JSON lines off it)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import cluster_of
from conftest import node_facts as as_facts

from orchestrator.phases.memory import PLAN_FILE
from orchestrator.status import assess as status
from orchestrator.status import memory as status_memory
from orchestrator.status.memory import (
    attach_metrics,
    memory_text,
    metrics_text,
    node_memory,
    summarize_metrics,
)

MEMINFO = "MemTotal:       125419520 kB\nMemAvailable:   119537664 kB\n--gpu\n"
GB10 = "[N/A], [N/A], 35\n"


def facts(gpu: str = GB10, plan: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"commands": {"memory": {"rc": 0, "out": MEMINFO + gpu}}, "files": {}}
    if plan is not None:
        out["files"][PLAN_FILE] = {"exists": True, "content": json.dumps(plan)}
    return out


def test_a_gb10_reports_available_memory_and_utilisation_not_gpu_memory() -> None:
    memory = node_memory(as_facts(facts(plan={"guard_min_available_gb": 4.0})))
    assert memory == {"total_gb": 119.6, "available_gb": 114.0, "gpu_utilization_pct": 35.0,
                      "guard_min_available_gb": 4.0, "guard_source": "launch", "gpu": {}}
    assert memory_text(memory) == "114 of 119.6 GB available (guard: 4 GB), GPU 35 %"


def test_a_discrete_gpu_reports_its_memory_and_no_plan_means_the_default_guard() -> None:
    memory = node_memory(as_facts(facts(gpu="40960, 81920, 0\n")))
    assert memory["gpu_memory_used_gb"] == 40.0 and memory["gpu_memory_total_gb"] == 80.0
    assert memory["guard_min_available_gb"] == 2.0 and memory["guard_source"].startswith("default")
    assert "GPU memory 40/80 GB" in memory_text(memory)


def test_no_answer_is_unknown_not_zero() -> None:
    memory = node_memory(as_facts({"commands": {}}))
    assert "available_gb" not in memory and memory_text(memory) == "memory unknown"


VLLM = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
vllm:num_requests_waiting{model_name="m"} 1.0
vllm:kv_cache_usage_perc{model_name="m"} 0.25
vllm:spec_decode_num_drafts_total{model_name="m"} 100.0
vllm:spec_decode_num_draft_tokens_total{model_name="m"} 300.0
vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 150.0
"""
SGLANG = """sglang:num_running_reqs{tp_rank="0"} 2
sglang:num_queue_reqs{tp_rank="0"} 0
sglang:token_usage{tp_rank="0"} 0.5
sglang:spec_accept_length{tp_rank="0"} 2.7
"""


def test_metrics_by_meaning_whatever_the_prefix() -> None:
    assert summarize_metrics(VLLM) == {"requests_running": 3, "requests_waiting": 1,
                                       "kv_cache_usage": 0.25, "spec_acceptance_rate": 0.5,
                                       "spec_acceptance_length": 2.5}
    sg = summarize_metrics(SGLANG)
    assert sg == {"requests_running": 2, "requests_waiting": 0, "kv_cache_usage": 0.5,
                  "spec_acceptance_length": 2.7}
    assert metrics_text({"ok": True, **sg}) == ("2 request(s) running; 0 waiting; KV cache 50 %; "
                                                "acceptance length 2.70")
    idle = {"ok": True, "requests_running": 0, "spec_acceptance_length": 1.0,
            "spec_acceptance_rate": 0.0}  # no draft: the gauges say nothing
    assert metrics_text(idle) == "0 request(s) running"


def test_attach_reads_healthy_prometheus_servers_only() -> None:
    servers = [{"name": "v", "engine": "vllm", "node": "spark-a", "port": 8000, "state": "healthy"},
               {"name": "t", "engine": "trtllm", "node": "spark-a", "port": 8001, "state": "healthy"},
               {"name": "s", "engine": "sglang", "node": "spark-b", "port": 30000, "state": "loading"},
               {"name": "x", "engine": "sglang", "node": "spark-b", "port": 30001, "state": "healthy"}]
    servers[3].update(host="10.0.0.2", api_key_file="/var/lib/sparkctl/run/servers/x/api_key")
    ran: list[tuple[str, str, bool]] = []

    def run_on(node: str, command: str, sudo: bool = False) -> tuple[int, str]:
        ran.append((node, command, sudo))
        if command.endswith(" 8000 127.0.0.1"):
            return 0, "text/plain; version=0.0.4\n" + VLLM
        return 1, ""

    attach_metrics(servers, run_on)
    # where each server binds; a server with an API key: its node file, read by the fetch (sudo)
    assert [c.rsplit("' ", 1)[1] for _, c, _ in ran] == [
        "--metrics 8000 127.0.0.1", "--metrics 30001 10.0.0.2 /var/lib/sparkctl/run/servers/x/api_key"]
    assert [sudo for *_, sudo in ran] == [False, True]
    assert servers[0]["metrics"]["ok"] and servers[0]["metrics"]["requests_running"] == 3
    assert servers[1]["metrics"] == {"ok": False, "why": "this engine's /metrics is not Prometheus text"}
    assert "metrics" not in servers[2]
    assert servers[3]["metrics"]["ok"] is False and "metrics off" in metrics_text(servers[3]["metrics"])


def test_json_content_is_not_read_as_prometheus() -> None:
    assert status_memory.server_metrics(0, "application/json\n[]") == {"ok": False,
                                                                        "why": "not Prometheus text"}


def test_status_asks_for_memory_and_the_plan_and_assess_carries_it() -> None:
    from test_status import INVENTORY, node_facts

    request = status.status_facts(INVENTORY, INVENTORY.nodes[1])
    assert request["commands"]["memory"] == status_memory.MEMORY_CMD
    assert request["files"][PLAN_FILE] is True
    found = {name: {**node_facts(name), "commands": {"memory": {"rc": 0, "out": MEMINFO + GB10}}}
             for name in ("spark-a", "spark-b")}
    result = status.assess(INVENTORY, cluster_of(found), {})
    assert result["nodes"]["spark-b"]["memory"]["available_gb"] == 114.0


def test_watch_off_a_terminal_prints_each_look_and_ctrl_c_ends_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import status_watch

    looks: list[int] = []

    def look() -> int:
        looks.append(1)
        print(json.dumps({"look": len(looks)}))
        return 0

    def sleep(seconds: float) -> None:
        assert seconds == 2
        if len(looks) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(status_watch.time, "sleep", sleep)
    assert status_watch.watch_status(look, 2, as_json=True) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["look"] for line in lines] == [1, 2, 3]


def test_watch_on_a_terminal_redraws_what_status_renders(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.cli import status_watch
    from orchestrator.core import output

    drawn: list[str] = []

    class FakeLive:
        def __init__(self, *args: Any, **kwargs: Any) -> None: ...
        def __enter__(self) -> FakeLive:
            return self
        def __exit__(self, *exc: object) -> None: ...
        def update(self, text: Any, refresh: bool = False) -> None:
            drawn.append(text.plain)

    monkeypatch.setattr("rich.live.Live", FakeLive)
    monkeypatch.setattr(output.sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(status_watch.time, "sleep",
                        lambda s: (_ for _ in ()).throw(KeyboardInterrupt) if len(drawn) == 2 else None)
    count = iter(range(10))

    def look() -> int:
        output.print_table("t", ["node", "memory"], [["spark-a", f"{next(count)} GB"]])
        return 0

    assert status_watch.watch_status(look, 1, as_json=False) == 0
    assert len(drawn) == 2 and "0 GB" in drawn[0] and "1 GB" in drawn[1]
    assert "━" in drawn[0]  # a rich table, as on a terminal, not the plain lines of a pipe


def test_status_watch_json_is_one_object_per_line(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_cli import INVENTORY as INV_TEXT
    from test_cli import sparkctl

    from orchestrator.cli import status_watch

    inventory = tmp_path / "inv.yml"
    inventory.write_text(INV_TEXT)
    looks = iter(range(10))
    monkeypatch.setattr("orchestrator.status.assess.gather_status",
                        lambda inv: {"ok": True, "nodes": {}, "servers": [], "look": next(looks)})
    calls: list[float] = []

    def sleep(seconds: float) -> None:
        calls.append(seconds)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(status_watch.time, "sleep", sleep)
    result = sparkctl("status", "-i", str(inventory), "--json", "--watch")
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["look"] for line in result.stdout.splitlines()] == [0, 1]
    assert calls == [5.0, 5.0]  # --watch alone: every 5 s
    bad = sparkctl("status", "-i", str(inventory), "--watch", "0.1")
    assert bad.exit_code == 2
