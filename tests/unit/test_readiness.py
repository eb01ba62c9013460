"""engines/readiness.py's one wait loop, driven by TensorRT-LLM's readiness (engines/trtllm/
readiness.py): waiting for the server, and cleaning up when it never comes."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest

from orchestrator.engines import load_recipe, serverctl
from orchestrator.engines import readiness as shared
from orchestrator.engines.base import LaunchFailed, Ready
from orchestrator.engines.trtllm import readiness
from orchestrator.engines.trtllm.serve import LaunchSpec
from orchestrator.errors import EXIT_INTERRUPTED, SparkctlError
from orchestrator.recipe import LaunchOptions

RECIPE = load_recipe("qwen3-235b")
MODEL = RECIPE.model
ALIVE = {"mpirun.pid": {"alive": True}}


def action(name: str) -> str:
    return rf'\\"action\\": \\"{name}\\"|"action": "{name}"'


@pytest.fixture
def cluster(fake_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(readiness, "READINESS", dataclasses.replace(readiness.READINESS,
                                                                    poll_seconds=0.0))
    c = fake_cluster()
    for name in ("spark-a", "spark-b"):
        c[name].on(action("stop"), answer={"stopped": ["mpirun.pid"], "left": []})
        c[name].on("tail -n", 0, f"==> rank-0.log <==\n{name} says bye\n")
    return c


def called(c: Any, name: str, act: str) -> int:
    return sum(1 for command in c.commands(name) if re.search(action(act), command))


def statuses(c: Any, *answers: dict[str, Any]) -> None:
    queue = list(answers)
    c["spark-a"].on(action("status"), answer=lambda call: queue.pop(0) if len(queue) > 1 else queue[0])


def wait(c: Any, timeout: float = 60.0) -> tuple[Any, list[str]]:
    notes: list[str] = []
    spec = LaunchSpec(RECIPE, c.inventory, LaunchOptions())
    result = shared.wait_until_ready(c.transports, readiness.target(spec), readiness.READINESS,
                                     timeout, notes.append)
    return result, notes


def test_ready_after_loading_and_warming_up(cluster: Any) -> None:
    statuses(cluster, {"pids": ALIVE, "health": None},
             {"pids": ALIVE, "health": 200, "health_generate": 503},
             {"pids": ALIVE, "health": 200, "health_generate": 200, "models": [MODEL]})
    ready, notes = wait(cluster)
    assert isinstance(ready, Ready) and ready.models == [MODEL]
    assert "loading (/health no answer)" in notes[0]
    assert "warming up (/health_generate 503)" in notes[1]
    assert "ready: /health, /health_generate and /v1/models answer" in notes[-1]
    assert called(cluster, "spark-a", "status") == 3
    assert called(cluster, "spark-a", "stop") == called(cluster, "spark-b", "stop") == 0


def test_a_dead_mpirun_ends_the_wait_with_every_log_tail_and_stops_every_rank(cluster: Any) -> None:
    statuses(cluster, {"pids": {"mpirun.pid": {"alive": False}}, "health": None})
    with pytest.raises(LaunchFailed) as raised:
        wait(cluster)
    failure = raised.value
    assert "mpirun exited on spark-a while loading" in failure.reason
    assert "every rank was stopped" in failure.reason
    assert "spark-a says bye" in failure.details and "spark-b says bye" in failure.details
    assert called(cluster, "spark-a", "stop") == called(cluster, "spark-b", "stop") == 1
    # the server's own directory only: other servers in the container keep running
    stops = [c for c in cluster.commands("spark-b") if re.search(action("stop"), c)]
    assert "/var/lib/sparkctl/run/servers/qwen3-235b" in stops[0]


def test_the_deadline_ends_the_wait_and_names_the_last_state(cluster: Any) -> None:
    statuses(cluster, {"pids": ALIVE, "health": 200, "health_generate": None})
    with pytest.raises(LaunchFailed, match=r"not ready within 0s \(--timeout\); last state: warming up"):
        wait(cluster, timeout=0.0)


def test_ranks_that_will_not_stop_are_named(cluster: Any) -> None:
    statuses(cluster, {"pids": {}, "health": None})
    cluster["spark-b"].rules.clear()
    cluster["spark-b"].on(action("stop"), answer={"left": ["rank-1.pid"]})
    cluster["spark-b"].on("tail -n", 1, "", "", answer=SparkctlError("spark-b: lost"))
    with pytest.raises(LaunchFailed) as raised:
        wait(cluster)
    assert "NOT everything stopped: spark-b: still running: ['rank-1.pid']" in raised.value.reason
    assert "(could not read the logs: spark-b: lost)" in raised.value.details


def test_an_unreachable_rank_is_reported_as_not_stopped(cluster: Any) -> None:
    cluster["spark-b"].rules.clear()
    cluster["spark-b"].on(action("stop"), 1, "", "docker: not running")
    left = readiness.stop_everywhere(cluster.transports,
                                     LaunchSpec(RECIPE, cluster.inventory, LaunchOptions()))
    assert left["spark-a"] == "" and left["spark-b"].startswith("could not stop: spark-b")


def test_ctrl_c_stops_waiting_but_leaves_the_server(cluster: Any) -> None:
    cluster["spark-a"].on(action("status"), answer=KeyboardInterrupt())
    with pytest.raises(SparkctlError, match="qwen3-235b keeps loading on spark-a") as raised:
        wait(cluster)
    assert raised.value.exit_code == EXIT_INTERRUPTED
    assert called(cluster, "spark-a", "stop") == called(cluster, "spark-b", "stop") == 0


def test_smoke_test_summarises_one_completion(cluster: Any) -> None:
    body = {"choices": [{"message": {"content": " Paris is lovely. "}}], "usage": {"completion_tokens": 8}}
    cluster["spark-a"].on(action("chat"), answer={"code": 200, "body": json.dumps(body), "seconds": 2.0})
    summary = serverctl.smoke_test(cluster["spark-a"], "trtllm-multinode", MODEL, 8355)
    assert summary == "8 tokens in 2.00s (4.0 tok/s): 'Paris is lovely.'"


def test_a_failed_smoke_test_says_why(cluster: Any) -> None:
    cluster["spark-a"].on(action("chat"), answer={"code": 500, "body": "oom"})
    with pytest.raises(SparkctlError, match="smoke-test chat completion failed: HTTP 500: oom"):
        serverctl.smoke_test(cluster["spark-a"], "trtllm-multinode", MODEL, 8355)
