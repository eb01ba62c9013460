"""Placement for every engine: --nodes / `placement` checked against the engine's rank rules
(tp x pp, one rank per Spark; where the first rank must run) before anything runs."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import make_inventory

from orchestrator.engines import REGISTRY, check_against_inventory, get_engine, load_recipe
from orchestrator.errors import InputError


def placed(name: str, nodes: list[str]) -> object:
    return load_recipe(name).model_copy(update={"placement": nodes})


def test_a_tp2_recipe_on_one_node_is_refused_naming_recipe_nodes_and_rule() -> None:
    with pytest.raises(InputError) as refused:
        check_against_inventory(placed("qwen3.6-27b-tp2", ["spark-b"]), make_inventory())
    message = str(refused.value)
    assert "recipe qwen3.6-27b-tp2 on spark-b" in message
    assert "tp_size 2 x pp_size 1 = 2 rank(s)" in message and "not 1 (spark-b)" in message
    assert refused.value.exit_code == 2


def test_every_engines_default_nodes_and_a_fitting_placement_pass() -> None:
    inv = make_inventory()
    for name in ("gpt-oss-120b", "gpt-oss-120b-vllm", "qwen3.6-27b", "qwen3.6-27b-tp2"):
        check_against_inventory(load_recipe(name), inv)
    check_against_inventory(placed("gpt-oss-120b", ["spark-a"]), inv)
    check_against_inventory(placed("qwen3.6-27b", ["spark-b"]), inv)
    check_against_inventory(placed("qwen3.6-27b-tp2", ["spark-b", "spark-a"]), inv)


def test_vllm_runs_on_any_nodes_its_first_node_the_ray_head_and_checks_tp_x_pp() -> None:
    inv = make_inventory()
    check_against_inventory(placed("gpt-oss-120b-vllm", ["spark-b"]), inv)
    check_against_inventory(placed("minimax-m2.7", ["spark-b", "spark-a"]), inv)
    with pytest.raises(InputError, match=r"minimax-m2.7 needs 2 node\(s\) but is placed on 1"):
        check_against_inventory(placed("minimax-m2.7", ["spark-b"]), inv)
    # the engine's own rule, as launch states it for the chosen nodes
    problem = get_engine("vllm").placement_problem(load_recipe("minimax-m2.7"), ["spark-b"], inv)
    assert problem is not None and problem.startswith(
        "tensor_parallel_size 2 x pipeline_parallel_size 1 = 2 rank(s), one per Spark")


def test_a_tensorrt_llm_server_runs_on_any_nodes_one_rank_each() -> None:
    """mpirun runs in the first node's `up` container with the server's own hostfile: no head
    rule, only tp_size ranks, one per Spark."""
    inv = make_inventory()
    check_against_inventory(placed("gpt-oss-120b", ["spark-b"]), inv)
    check_against_inventory(placed("qwen3-235b", ["spark-b", "spark-a"]), inv)
    with pytest.raises(InputError, match="recipe qwen3-235b needs 2 node"):
        check_against_inventory(placed("qwen3-235b", ["spark-b"]), inv)


def test_every_engine_has_the_placement_members() -> None:
    for name in REGISTRY:
        engine = get_engine(name)
        assert callable(engine.placement_problem)


def test_the_node_guard_command_starts_one_detached_guard_watching_the_containers() -> None:
    import json
    import shlex

    from orchestrator.phases.memory import node_guard_cmd

    command = node_guard_cmd("/var/lib/sparkctl/run/servers/q", "spark-b", 2.0, ["sparkctl-sglang-q"])
    assert "rm -f /var/lib/sparkctl/run/servers/q/memguard-stopped.json" in command
    assert "grep -qsa sparkctl-memguard" in command and "setsid python3 -c" in command
    assert command.endswith("& }")
    args = json.loads(shlex.split(command.split("setsid ", 1)[1].split(" </dev/null")[0])[-1])
    assert args == {"run": "/var/lib/sparkctl/run/servers/q", "node": "spark-b",
                    "min_available_gb": 2.0, "containers": ["sparkctl-sglang-q"]}


def test_a_relaunch_stops_the_guard_an_earlier_launch_left_running(tmp_path: Any) -> None:
    # issue 41: a relaunch left the previous memory guard running beside the new one
    import subprocess
    import sys

    from orchestrator.phases.memory import stop_guard_cmd

    guard = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                              "sparkctl-memguard", "{}"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "memguard.pid").write_text(f"{guard.pid}\n")
        subprocess.run(["sh", "-c", stop_guard_cmd(str(tmp_path))], check=True, timeout=30)
        assert guard.wait(timeout=10) != 0 and not (tmp_path / "memguard.pid").exists()
        (tmp_path / "memguard.pid").write_text(f"{other.pid}\n")  # a pid reused: not a guard
        subprocess.run(["sh", "-c", stop_guard_cmd(str(tmp_path))], check=True, timeout=30)
        assert other.poll() is None
    finally:
        for process in (guard, other):
            process.kill()
            process.wait()


def test_the_default_nodes_named_are_the_same_server_as_none_named() -> None:
    from orchestrator.engines import config_hash, default_placement

    inv = make_inventory()
    plain = load_recipe("qwen3-235b")
    named = default_placement(placed("qwen3-235b", ["spark-a", "spark-b"]), inv)
    assert config_hash(named, [], "") == config_hash(plain, [], "")
    elsewhere = default_placement(placed("qwen3.6-27b", ["spark-b"]), inv)
    assert elsewhere.placement == ["spark-b"]
