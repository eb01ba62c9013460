"""Recipes: built-ins load, bad recipes are refused with the reason, memory estimate."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.engines import (
    builtin_names,
    check_against_inventory,
    config_hash,
    load_recipe,
)
from orchestrator.engines.trtllm.recipe import estimate_memory
from orchestrator.errors import InputError
from orchestrator.inventory import Inventory
from orchestrator.recipe import serving_nodes

GOOD = """
name: mine
model: org/model
tp_size: 2
port: 9000
speculative: {decoding_type: Eagle3, max_draft_len: 3, draft_model: org/draft}
memory: {weights_gb: 100}
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "recipe.yml"
    path.write_text(text)
    return str(path)


def inventory(nodes: int) -> Inventory:
    return Inventory.model_validate({
        "cluster": {"name": "lab"},
        "nodes": [{"name": f"spark-{i}", "host": f"10.0.0.{i + 1}",
                   "addresses": {"enp1s0f1np1": f"192.168.200.{12 + i}/24",
                                 "enP2p1s0f1np1": f"192.168.201.{12 + i}/24"}}
                  for i in range(nodes)],
    })


def test_builtins_are_the_mission_and_nvidias_single_node_recipes() -> None:
    assert builtin_names() == ["gpt-oss-120b", "gpt-oss-120b-gguf", "gpt-oss-120b-vllm",
                               "lab-tiny-llama", "lab-tiny-llama-rpc", "lab-tiny-llama-vllm",
                               "lab-tiny-llama-vllm-pp2", "lab-tiny-llama-vllm-tp2", "llama-3.3-70b",
                               "minimax-m2.7", "minimax-m2.7-mp", "nemotron-3-ultra-tp4",
                               "qwen3-235b", "qwen3-235b-fp8-pp3", "qwen3-235b-gguf-rpc",
                               "qwen3-8b", "qwen3.5-397b-fp8-tp4", "qwen3.5-397b-int4-pp3",
                               "qwen3.6-27b", "qwen3.6-27b-tp2"]
    qwen = load_recipe("qwen3-235b")
    assert (qwen.model, qwen.tp_size, qwen.node_count, qwen.port, qwen.max_num_tokens) == (
        "nvidia/Qwen3-235B-A22B-FP4", 2, 2, 8355, 1024)
    config = qwen.llm_api_config()
    assert config["speculative_config"] == {
        "decoding_type": "Eagle", "max_draft_len": 3,
        "speculative_model_dir": "/root/.cache/huggingface/drafts/Qwen3-235B-A22B-Eagle3"}
    assert config["kv_cache_config"] == {"enable_block_reuse": False, "free_gpu_memory_fraction": 0.9}
    assert config["cuda_graph_config"] == {"max_batch_size": 1}
    assert config["enable_attention_dp"] is False and config["enable_chunked_prefill"] is False
    gpt = load_recipe("gpt-oss-120b")
    assert gpt.speculative and (gpt.speculative.draft_model, gpt.speculative.max_draft_len, gpt.port) == (
        "nvidia/gpt-oss-120b-Eagle3-long-context", 5, 8000)
    llama = load_recipe("llama-3.3-70b")
    assert llama.speculative and (llama.speculative.decoding_type, llama.speculative.max_draft_len) == (
        "Draft_Target", 4)  # 1.3.0rc13 spelling
    assert llama.speculative.draft_model == "nvidia/Llama-3.1-8B-Instruct-FP4"


def test_user_recipe_from_a_path(tmp_path: Path) -> None:
    recipe = load_recipe(write(tmp_path, GOOD))
    assert recipe.name == "mine" and recipe.node_count == 2
    assert [r for r, _, _ in recipe.repos] == ["org/model", "org/draft"]


@pytest.mark.parametrize(("change", "reason"), [
    ("tp_size: 2\nnodes: 1", "tp_size 2 must equal the number of nodes 1"),
    ("decoding_type: Medusa2", "speculative.decoding_type"),
    ("draft_model: org/draft", "needs a draft model"),
    ("llm_api_options: {speculative_config: {}}", "llm_api_options must not set speculative_config"),
    ("serve_args: ['--port', '1']", "serve_args must not set --port"),
    ("memory: {weights_gb: 100, kv_cache_fraction: 1.5}", "memory.kv_cache_fraction"),
    ("unknown_key: 1", "unknown_key"),
])
def test_bad_recipes_are_refused_with_the_reason(tmp_path: Path, change: str, reason: str) -> None:
    text = GOOD
    if change.startswith("decoding_type"):
        text = text.replace("decoding_type: Eagle3", change)
    elif change.startswith("draft_model"):
        text = text.replace(", draft_model: org/draft", "")
    elif change.startswith("tp_size"):
        text = text.replace("tp_size: 2", change)
    elif change.startswith("memory"):
        text = text.replace("memory: {weights_gb: 100}", change)
    else:
        text += change + "\n"
    with pytest.raises(InputError) as caught:
        load_recipe(write(tmp_path, text))
    assert reason in str(caught.value)
    assert caught.value.exit_code == 2


def test_unknown_name_lists_the_builtins() -> None:
    with pytest.raises(InputError, match="qwen3-235b"):
        load_recipe("no-such-recipe")


def test_more_nodes_than_the_inventory_has_is_refused() -> None:
    recipe = load_recipe("qwen3-235b")
    with pytest.raises(InputError, match=r"needs 2 nodes .* has 1") as caught:
        check_against_inventory(recipe, inventory(1))
    assert caught.value.exit_code == 2
    check_against_inventory(recipe, inventory(3))
    assert serving_nodes(recipe, inventory(3)) == ["spark-0", "spark-1"]
    assert serving_nodes(load_recipe("gpt-oss-120b"), inventory(3)) == ["spark-0"]


def test_memory_estimate_splits_weights_by_tp_and_counts_the_draft_whole() -> None:
    estimate = estimate_memory(load_recipe("qwen3-235b"))
    assert estimate.weights_gb == 65.0 and estimate.draft_gb == 2.0
    # 128 - (65 + 2 + 6) = 55 left; the KV cache takes 0.9 of it
    assert estimate.kv_cache_gb == pytest.approx(49.5)
    assert estimate.fits and estimate.verdict == "fits"
    assert "fits" in estimate.explanation


def test_memory_estimate_says_no_when_the_weights_do_not_fit(tmp_path: Path) -> None:
    recipe = load_recipe(write(tmp_path, GOOD.replace("weights_gb: 100", "weights_gb: 250")))
    estimate = estimate_memory(recipe)
    assert not estimate.fits and estimate.verdict == "does not fit"
    assert "does NOT fit" in estimate.explanation


def test_a_greedy_kv_fraction_is_called_tight(tmp_path: Path) -> None:
    text = GOOD.replace("memory: {weights_gb: 100}", "memory: {weights_gb: 100, kv_cache_fraction: 1.0}")
    estimate = estimate_memory(load_recipe(write(tmp_path, text)))
    assert estimate.verdict == "tight" and not estimate.fits


def test_config_hash_changes_with_the_recipe(tmp_path: Path) -> None:
    one = load_recipe(write(tmp_path, GOOD))
    other = load_recipe(write(tmp_path, GOOD.replace("port: 9000", "port: 9001")))
    assert config_hash(one, ["a"], "x") == config_hash(one, ["a"], "x")
    assert config_hash(one, ["a"], "x") != config_hash(other, ["a"], "x")
    assert config_hash(one, ["a"], "x") != config_hash(one, ["a"], "y")


@pytest.mark.parametrize(("name", "engine", "nodes"), [
    ("qwen3.5-397b-int4-pp3", "vllm", 3), ("qwen3-235b-fp8-pp3", "sglang", 3),
    ("nemotron-3-ultra-tp4", "vllm", 4), ("qwen3.5-397b-fp8-tp4", "sglang", 4)])
def test_builtins_beyond_two_sparks_need_them_and_fit(name: str, engine: str, nodes: int) -> None:
    """Three (ring) and four (switch) Sparks, for two engines: each fits one rank per node, and
    one node fewer would leave its weights next to no KV cache (the model needs them)."""
    from orchestrator.engines import engine_of

    recipe = load_recipe(name)
    assert (recipe.engine, recipe.node_count) == (engine, nodes)
    check_against_inventory(recipe, inventory(nodes))
    with pytest.raises(InputError, match=f"needs {nodes} nodes"):
        check_against_inventory(recipe, inventory(nodes - 1))
    assert engine_of(recipe).estimate_memory(recipe).fits
    m = recipe.memory  # on one node fewer, under 10 GB of KV cache would be left
    assert m.weights_gb / (nodes - 1) + m.runtime_gb > m.kv_cache_fraction * 128 - 10
