"""One server model for every engine: the typed record, the one judgement of a relaunch, and
the memory guard for servers that are their containers (node/memguard.py's container mode)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.engines.lifecycle import Running, ServerRecord, decide, refusal, restart_reason
from orchestrator.node import script


def record(**over: object) -> ServerRecord:
    base = {"name": "q", "engine": "sglang", "recipe": "qwen3.6-27b", "model": "M", "port": 30000,
            "nodes": ["spark-b"], "config_hash": "h1"}
    return ServerRecord.from_dict({**base, **over})


def test_a_record_round_trips_and_keeps_engine_fields_flat() -> None:
    r = record(tp_size=2, dist_port=20000, ready_at=None)
    data = r.to_dict()
    assert data["tp_size"] == 2 and data["dist_port"] == 20000 and "extra" not in data
    assert "ready_at" not in data  # None is not written
    assert ServerRecord.from_dict(data) == r


def test_a_record_without_a_name_is_named_after_its_recipe() -> None:
    old = ServerRecord.from_dict({"recipe": "qwen3-235b", "model": "M", "port": 8355,
                                  "config_hash": "x", "started": "2025-06-15T14:00:00+00:00"})
    assert (old.name, old.nodes) == ("qwen3-235b", [])


@pytest.mark.parametrize(("alive", "digest", "health", "ready", "dead", "replace", "expected"), [
    (False, "h1", None, None, (), False, "start"),
    (True, "h1", 200, None, (), False, "noop"),
    (True, "h1", 503, None, (), False, "loading"),
    (True, "h1", 503, "2025-06-15T14:02:00+00:00", (), False, "restart"),  # stalled
    (True, "h1", 200, None, ("rank-1 on spark-b (pid 9)",), False, "restart"),  # dead rank
    (True, "other", 200, None, (), False, "refuse"),
    (True, "other", 200, None, (), True, "replace"),
])
def test_one_judgement_for_every_engine(alive: bool, digest: str, health: int | None,
                                        ready: str | None, dead: tuple[str, ...], replace: bool,
                                        expected: str) -> None:
    running = Running(record(ready_at=ready), alive, health)
    assert decide(running, digest, replace, dead) == expected


def test_refusal_and_restart_reason_name_what_runs() -> None:
    running = Running(record(ready_at="T"), True, 503)
    assert restart_reason(running) == "stalled: ready at T, /health now 503"
    assert restart_reason(running, ("rank-1",)) == "dead: rank ended (rank-1)"
    text = refusal(running, "other")
    assert "qwen3.6-27b (M, engine sglang" in text and "--replace" in text


def test_running_from_a_status_answer() -> None:
    status = {"server": {"recipe": "r", "config_hash": "h"}, "pids": {"vllm.pid": {"alive": True}},
              "health": 200, "ready_log": True}
    running = Running.from_status(status, "vllm.pid")
    assert running.alive and running.record is not None and running.ready == "(its log says so)"
    assert not Running.from_status({}, "vllm.pid").alive


def test_the_container_guard_docker_stops_the_servers_containers(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    docker = tmp_path / "bin" / "docker"
    docker.parent.mkdir()
    docker.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n"
                      "[ \"$1\" = inspect ] && echo 5eed true\nexit 0\n")
    docker.chmod(0o755)
    run = tmp_path / "servers" / "q"
    run.mkdir(parents=True)
    args = {"run": str(run), "node": "spark-b", "min_available_gb": 1e6, "grace": 1,
            "containers": ["sparkctl-sglang-q"]}
    env = {**os.environ, "PATH": f"{docker.parent}:{os.environ['PATH']}"}
    guard = subprocess.run([sys.executable, "-c", script("memguard.py"), "sparkctl-memguard",
                            json.dumps(args)], timeout=60, env=env)
    assert guard.returncode == 0
    assert "stop -t 1 5eed" in calls.read_text()  # the guarded container, by its ID
    stopped = json.loads((run / "memguard-stopped.json").read_text())
    assert stopped["node"] == "spark-b" and stopped["stopped"] == ["sparkctl-sglang-q"]
    assert stopped["available_gb"] < stopped["min_available_gb"]
    assert int((run / "memguard.pid").read_text()) > 0
