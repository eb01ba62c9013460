"""Placement for every engine: --nodes / `placement` checked against the engine's rank rules
(tp x pp, one rank per Spark; where the first rank must run) before anything runs."""

from __future__ import annotations

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


@pytest.mark.parametrize("name", ["gpt-oss-120b", "gpt-oss-120b-vllm"])
def test_engines_whose_first_rank_runs_on_the_head_say_so(name: str) -> None:
    with pytest.raises(InputError, match="the head and the next nodes in inventory order: spark-a"):
        check_against_inventory(placed(name, ["spark-b"]), make_inventory())


def test_every_engine_has_the_placement_members() -> None:
    for name in REGISTRY:
        engine = get_engine(name)
        assert isinstance(engine.several_servers, bool)
        assert callable(engine.placement_problem)
