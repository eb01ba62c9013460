"""The memory preflight's judgement, the guard's node script and the lab's meminfo (pure)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.node import script
from orchestrator.phases.memory import NodePlan, guard_cmd, judge, parse_meminfo, usable_gb

PLAN = NodePlan(weights_gb=65, draft_gb=2, runtime_gb=6, kv_cache_fraction=0.9, tp_size=2,
                total_weights_gb=130)


def test_parse_meminfo_in_gb() -> None:
    info = parse_meminfo("MemTotal:       134217728 kB\nMemFree: 1048576 kB\nMemAvailable: 2097152 kB\n")
    assert info == {"MemTotal": 128.0, "MemFree": 1.0, "MemAvailable": 2.0}
    assert usable_gb(info, drop_caches=True) == 2.0 and usable_gb(info, drop_caches=False) == 1.0


def test_a_recipe_that_fits_leaves_the_guards_margin() -> None:
    verdict = judge(PLAN, total=128, usable=125, guard=4)
    assert verdict.fits and "leaving 5.2 GB available" in verdict.text


def test_refusal_names_the_numbers_and_the_options() -> None:
    verdict = judge(PLAN, total=128, usable=100, guard=4)
    assert not verdict.fits
    assert "MemAvailable 100.0 of 128.0 GB" in verdict.text
    options = " ".join(verdict.options)
    assert "kv_cache_fraction to 0.85" in options
    assert "more nodes: tp_size 3" in options and "fewer tokens" in options
    assert "28.0 GB are in use by other processes" in options


def test_the_replaced_servers_memory_counts_as_freed() -> None:
    assert not judge(PLAN, total=128, usable=40, guard=4).fits
    verdict = judge(PLAN, total=128, usable=40, guard=4, freed=85)
    assert verdict.fits and "85.0 GB the replaced server frees" in verdict.text


def test_guard_command_is_detached_in_the_container() -> None:
    cmd = guard_cmd("trtllm-multinode", "spark-b", 4.0)
    assert cmd.startswith("docker exec -d trtllm-multinode python3 -c ")
    assert "sparkctl-memguard" in cmd and '"min_available_gb": 4.0' in cmd


def test_the_guard_stops_the_recorded_processes_and_says_why(tmp_path: Path) -> None:
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    (tmp_path / "rank-1.pid").write_text(f"{victim.pid}\n")
    # a threshold above any real machine's MemAvailable: the guard fires at once
    args = {"run": str(tmp_path), "node": "spark-b", "min_available_gb": 1e6, "grace": 1}
    guard = subprocess.run([sys.executable, "-c", script("memguard.py"), "sparkctl-memguard",
                            json.dumps(args)], timeout=30)
    assert guard.returncode == 0
    assert victim.wait(timeout=10) == -signal.SIGTERM
    record = json.loads((tmp_path / "memguard-stopped.json").read_text())
    assert record["node"] == "spark-b" and record["state"] == "stopped"
    assert record["available_gb"] < record["min_available_gb"] and victim.pid in record["stopped"]
    assert int((tmp_path / "memguard.pid").read_text()) > 0


def test_the_guard_leaves_when_its_server_is_gone(tmp_path: Path) -> None:
    args = {"run": str(tmp_path), "node": "spark-a", "min_available_gb": 0, "start_timeout": 0.2}
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", script("memguard.py"), "sparkctl-memguard",
                    json.dumps(args)], timeout=30, check=True)
    assert time.monotonic() - started < 10
    assert not (tmp_path / "memguard-stopped.json").exists()
    assert os.path.exists(tmp_path / "memguard.pid")


def test_a_busy_docker_does_not_end_the_guard_of_a_running_container(tmp_path: Path) -> None:
    """Only a container docker says is stopped or gone ends the guard: a failed look (a busy
    daemon under load) used to read as 'server gone', and the guard left a running server."""
    calls = tmp_path / "calls"
    answers = ["c1 true", "ERR Cannot connect to the Docker daemon", "c1 true", "GONE"]
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    fake.write_text(f"""#!{sys.executable}
import sys
answers = {answers!r}
n = len(open({str(calls)!r}).read()) if __import__("os").path.exists({str(calls)!r}) else 0
open({str(calls)!r}, "a").write("x")
answer = answers[min(n, len(answers) - 1)]
if answer == "GONE":
    sys.stderr.write("Error: No such object: sparkctl-x\\n"); sys.exit(1)
if answer.startswith("ERR"):
    sys.stderr.write(answer[4:] + "\\n"); sys.exit(1)
print(answer)
""")
    fake.chmod(0o755)
    args = {"run": str(tmp_path), "node": "spark-b", "min_available_gb": 0, "interval": 0.05,
            "inspect_every": 0.05, "containers": ["sparkctl-x"]}
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run([sys.executable, "-c", script("memguard.py"), "sparkctl-memguard",
                    json.dumps(args)], timeout=30, check=True, env=env)
    assert len(calls.read_text()) == len(answers)  # it looked again after the failure, to the end
    assert not (tmp_path / "memguard-stopped.json").exists()


def test_lab_meminfo_is_fixed_width_and_scaled() -> None:
    from sparklab.node_supervisor import meminfo_text

    small = meminfo_text(2 * 1024**3, 1024**2, 0, 0, 64)
    big = meminfo_text(2 * 1024**3, 2 * 1024**3 - 4096, 10**6, 10**6, 64)
    assert len(small) == len(big)
    info = parse_meminfo(small)
    assert info["MemTotal"] == 128.0 and 127.9 < info["MemAvailable"] < 128.0


def test_lab_meminfo_shows_the_node_memory_not_the_cgroup_headroom(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cgroup's hard limit has room for the lab's unscaled processes (sparklab/memory.py):
    memory squeezed to within a GB of the node's total leaves MemAvailable under the guard's
    2 GB instead of OOM-killing the squeezer at the next `docker inspect`."""
    from sparklab import memory, node_supervisor

    root = tmp_path / "sparklab9"
    memory.create(root, ["spark-b"], 2 * 1024**3)
    limit = int((root / "spark-b" / "memory.limit_in_bytes").read_text())
    assert limit == 2 * 1024**3 + memory.PROCESS_HEADROOM
    squeezed = 2 * 1024**3 - 1024**3 // 64 + 8 * 1024**2  # a GB (scaled) short, + a process
    (root / "spark-b" / "memory.usage_in_bytes").write_text(f"{squeezed}\n")
    (root / "spark-b" / "memory.stat").write_text("total_cache 0\n")
    monkeypatch.setattr(node_supervisor, "MEMCG", str(root / "spark-b"))
    info = parse_meminfo(node_supervisor.cgroup_meminfo(64, 2 * 1024**3))
    assert info["MemTotal"] == 128.0 and info["MemAvailable"] < 2.0
    assert squeezed < limit  # within the hard limit: no OOM kill


def test_the_guard_threshold_is_the_option_then_the_recipe_then_the_default() -> None:
    """One rule for every engine (TensorRT-LLM's launch and every engine's boot plan): the
    vLLM and SGLang boot plans used to skip the recipe's own figure."""
    from orchestrator.engines import load_recipe
    from orchestrator.phases.memory import GUARD_DEFAULT_GB, guard_threshold

    for name in ("minimax-m2.7", "qwen3.6-27b", "qwen3-235b"):
        recipe = load_recipe(name)
        mine = recipe.model_copy(update={"memory": recipe.memory.model_copy(
            update={"guard_min_available_gb": 5.0})})
        assert guard_threshold(None, mine) == 5.0
        assert guard_threshold(3.0, mine) == 3.0
        assert guard_threshold(0.0, mine) == 0.0  # an explicit 0 (guard off) is kept
        assert guard_threshold(None, recipe) == (recipe.memory.guard_min_available_gb
                                                 or GUARD_DEFAULT_GB)
