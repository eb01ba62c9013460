"""SGLang: recipe checks (the option table, ServerArgs' own refusals), the launch command, the
placement rules for several servers (port, memory, same name) and `down --server`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import as_servers, make_context, make_inventory

from orchestrator.core.step import Change, Unchanged
from orchestrator.engines import load_recipe, servers
from orchestrator.engines.placed import Placement
from orchestrator.engines.sglang.recipe import Recipe
from orchestrator.engines.sglang.serve import ServeSpec, launch_argv
from orchestrator.errors import InputError, SparkctlError
from orchestrator.recipe import LaunchOptions, serving_nodes
from orchestrator.records import Server

IMAGE = Path(__file__).resolve().parents[2] / "lab" / "sparklab" / "image"


def recipe(**over: Any) -> Recipe:
    data = {"name": "t", "engine": "sglang", "model": "Qwen/Qwen3-8B",
            "memory": {"weights_gb": 16}, **over}
    return Recipe.model_validate(data)


def test_the_builtin_recipe_is_the_asked_command_bound_to_localhost() -> None:
    r = load_recipe("qwen3.6-27b")
    argv = launch_argv(r, "127.0.0.1")
    assert argv[:5] == ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3.6-27B-FP8"]
    text = " ".join(argv)
    for part in ("--tp-size 1", "--speculative-algorithm NEXTN", "--speculative-num-steps 5",
                 "--speculative-eagle-topk 4", "--speculative-num-draft-tokens 20",
                 "--mem-fraction-static 0.75", "--trust-remote-code",
                 "--host 127.0.0.1"):
        assert part in text
    assert "--tp " not in text and "0.0.0.0" not in text


def test_multi_node_argv_names_rank_and_the_first_nodes_fabric_address() -> None:
    inv = make_inventory()
    r = load_recipe("qwen3.6-27b-tp2")
    spec = ServeSpec(r, inv, LaunchOptions())
    assert spec.nodes == ["spark-a", "spark-b"] and spec.dist_addr() == "192.168.200.12:20000"
    argv = launch_argv(r, "127.0.0.1", 1, spec.dist_addr())
    assert " --nnodes 2 --node-rank 1 --dist-init-addr 192.168.200.12:20000" in " ".join(argv)


@pytest.mark.parametrize(("over", "words"), [
    # a unique abbreviation is the option itself to argparse: --tp is --tp-size, which sparkctl sets
    ({"serve_args": ["--tp", "2"]}, ["must not set --tensor-parallel-size"]),
    ({"serve_args": ["--tp-size", "2"]}, ["must not set --tensor-parallel-size"]),
    ({"serve_args": ["--pp", "2"]}, ["--pp: ambiguous option: could match --pp-async-batch-depth, "
                                     "--pp-max-micro-batch-size, --pp-size", "SGLang 0.5.12"]),
    ({"serve_args": ["--host", "0.0.0.0"]}, ["must not set --host"]),
    ({"tp_size": 2, "nodes": 1}, ["one node per rank"]),
    ({"speculative": {"algorithm": "EAGLE", "eagle_topk": 4}}, ["num_steps", "l.3808"]),
    ({"tp_size": 1, "pp_size": 2, "speculative": {"algorithm": "NEXTN", "num_steps": 3}},
     ["l.7250"]),
    ({"speculative": {"algorithm": "NEXTN", "num_steps": 3, "eagle_topk": 4},
      "serve_args": ["--attention-backend", "trtllm_mha"]}, ["trtllm_mha", "l.3822"]),
    ({"speculative": {"algorithm": "NEXTN", "num_steps": 3, "eagle_topk": 4},
      "serve_args": ["--page-size", "16"]}, ["flashinfer", "l.3837"]),
])
def test_what_sglang_refuses_is_refused_with_the_reason(over: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ValueError) as caught:
        recipe(**over)
    for word in words:
        assert word in str(caught.value)


def test_eagle_trees_without_draft_tokens_are_refused_naming_the_value(tmp_path: Path) -> None:
    # SGLang 0.5.12 fills num_draft_tokens only for topk 1: topk 4 without it is max(20, None)
    # in tokenizer_manager.py l.281 at start-up (issue 35); the refusal names the value to set
    for algorithm in ("NEXTN", "EAGLE", "eagle3"):
        with pytest.raises(ValueError) as caught:
            recipe(speculative={"algorithm": algorithm, "num_steps": 5, "eagle_topk": 4})
        text = str(caught.value)
        assert "needs num_draft_tokens" in text and "speculative.num_draft_tokens: 20" in text
        assert "tokenizer_manager.py l.281" in text
    with pytest.raises(ValueError, match="needs eagle_topk"):
        recipe(speculative={"algorithm": "NEXTN", "num_steps": 5})
    with pytest.raises(ValueError, match="set at most 69"):
        recipe(speculative={"algorithm": "NEXTN", "num_steps": 5, "eagle_topk": 4,
                            "num_draft_tokens": 70})
    # what SGLang accepts: topk 1 (it sets num_steps + 1 itself), no num_steps (it picks all
    # three), STANDALONE (not an EAGLE tree in the tokenizer), or the tokens given
    recipe(speculative={"algorithm": "NEXTN", "num_steps": 5, "eagle_topk": 1})
    recipe(speculative={"algorithm": "NEXTN"})
    recipe(speculative={"algorithm": "NEXTN", "num_steps": 5, "eagle_topk": 4, "num_draft_tokens": 69})
    drafted = recipe(speculative={"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1,
                                  "draft_model": "org/draft"})
    assert drafted.repos == [("Qwen/Qwen3-8B", "main", None), ("org/draft", "main", None)]
    # a recipe file: exit 2, naming the key
    path = tmp_path / "r.yml"
    path.write_text(json.dumps({"name": "r", "engine": "sglang", "model": "Qwen/Qwen3.6-27B-FP8",
                                "memory": {"weights_gb": 28}, "speculative": {
                                    "algorithm": "NEXTN", "num_steps": 5, "eagle_topk": 4}}))
    with pytest.raises(InputError) as refused:
        load_recipe(str(path))
    assert refused.value.exit_code == 2 and "num_draft_tokens: 20" in str(refused.value)


def test_the_builtin_nextn_recipes_leave_room_for_the_draft_worker() -> None:
    from orchestrator.engines.sglang.recipe import estimate_memory

    for name in ("qwen3.6-27b", "qwen3.6-27b-tp2"):
        r = load_recipe(name)
        assert r.speculative and r.speculative.num_draft_tokens == 20
        estimate = estimate_memory(r)
        assert estimate.verdict == "fits" and estimate.free_after_kv_gb >= 8, estimate.explanation
    # the seed's 0.82 with what SGLang allocates outside the pool for NEXTN (draft worker,
    # its KV pool, CUDA graphs: runtime 18 GB) leaves less than the system's reserve
    builtin = load_recipe("qwen3.6-27b")
    seed = builtin.model_copy(update={"memory": builtin.memory.model_copy(
        update={"kv_cache_fraction": 0.82})})
    assert estimate_memory(seed).free_after_kv_gb < seed.memory.system_reserve_gb
    text = estimate_memory(load_recipe("qwen3.6-27b")).explanation
    assert "+ 0 GB draft + 18 GB runtime outside it" in text


def test_placement_picks_the_nodes_and_unknown_nodes_are_refused() -> None:
    from orchestrator.engines import check_against_inventory

    inv = make_inventory()
    placed = recipe(placement=["spark-b"])
    check_against_inventory(placed, inv)
    assert serving_nodes(placed, inv) == ["spark-b"] and serving_nodes(recipe(), inv) == ["spark-a"]
    with pytest.raises(InputError, match="spark-z not in the inventory"):
        check_against_inventory(recipe(placement=["spark-z"]), inv)


def wanted(name: str = "new", nodes: list[str] | None = None, port: int = 30000,
           gb: float = 42.4) -> servers.Wanted:
    return servers.Wanted(name, "sglang", "m", nodes or ["spark-b"], [port], gb, "h1")


def running(name: str, nodes: list[str], port: int = 30000, gb: float = 109.0,
            engine: str = "sglang", digest: str = "h0") -> Server:
    """A live server as node/servers.py listed it, read as the placement rules get it."""
    (found,) = as_servers([{"name": name, "engine": engine, "model": "M", "nodes": nodes,
                            "port": port, "memory_gb": gb, "config_hash": digest, "alive": True}])
    return found


def test_a_taken_port_on_a_shared_node_is_named() -> None:
    with pytest.raises(SparkctlError, match="port 30000 on spark-b is taken by server big"):
        servers.judge(wanted(), [running("big", ["spark-b"])], False, False)
    # another node, or the same node on another port with room: fine, whatever the engine
    assert servers.judge(wanted(), [running("big", ["spark-a"], engine="trtllm")], False, False)[0] == "start"
    assert servers.judge(wanted(port=30010), [running("big", ["spark-b"], gb=60)], False, False)[0] == "start"


def test_memory_next_to_a_running_server_is_refused_with_the_numbers() -> None:
    with pytest.raises(SparkctlError) as caught:
        servers.judge(wanted(port=30010), [running("big", ["spark-b"])], False, False)
    assert "109.0 GB (big) already running + 42.4 GB (new) = 151.4 GB > 128 GB" in str(caught.value)
    assert caught.value.exit_code == 2  # a refusal, like the memory step's (issue 27)
    assert servers.judge(wanted(port=30010), [running("big", ["spark-b"])], False, True)[0] == "start"


def test_the_same_name_is_the_same_server_or_needs_replace() -> None:
    same = running("new", ["spark-b"], digest="h1")
    assert servers.judge(wanted(), [same], False, False) == ("same", same)
    other = running("new", ["spark-b"], digest="old")
    with pytest.raises(SparkctlError, match="already runs"):
        servers.judge(wanted(), [other], False, False)
    assert servers.judge(wanted(), [other], True, False) == ("replace", other)


def test_pick_needs_a_name_when_several_run() -> None:
    two = [running("a", ["spark-a"]), running("b", ["spark-b"])]
    assert servers.pick(two, "b").name == "b"
    with pytest.raises(InputError, match="--server NAME"):
        servers.pick(two, None)
    with pytest.raises(SparkctlError, match="no server named 'c'"):
        servers.pick(two, "c")


def facts_with(records: dict[str, list[Server]]) -> dict[str, dict[str, Any]]:
    """Each node's node/servers.py answer listing those servers."""
    def listed(found: list[Server]) -> str:
        return json.dumps({"servers": [{**s.record.to_dict(), "alive": s.alive} for s in found]})
    return {node: {"commands": {"servers": {"rc": 0, "out": listed(found)}}}
            for node, found in records.items()}


def test_placement_step_judges_from_every_nodes_facts() -> None:
    inv = make_inventory()
    r = load_recipe("qwen3-8b").model_copy(update={"placement": ["spark-b"]})
    spec = ServeSpec(r, inv, LaunchOptions(name="extra"))
    cluster = facts_with({"spark-a": [], "spark-b": [running("qwen3.6-27b", ["spark-b"])]})
    with pytest.raises(SparkctlError, match="port 30000 on spark-b"):
        Placement(spec).check(make_context(inv, "spark-a", cluster))
    cluster = facts_with({"spark-a": [running("qwen3.6-27b", ["spark-a"])], "spark-b": []})
    assert isinstance(Placement(spec).check(make_context(inv, "spark-a", cluster)), Unchanged)


def test_down_server_stops_it_on_its_nodes_only() -> None:
    inv = make_inventory()
    cluster = facts_with({"spark-a": [running("tp2", ["spark-a", "spark-b"])], "spark-b": []})
    step = servers.StopNamed("tp2")
    for node in ("spark-a", "spark-b"):
        outcome = step.check(make_context(inv, node, cluster))
        assert isinstance(outcome, Change) and "label=sparkctl.server=tp2" in outcome.commands[0]
    lonely = facts_with({"spark-a": [running("small", ["spark-a"])], "spark-b": []})
    assert isinstance(servers.StopNamed("small").check(make_context(inv, "spark-b", lonely)), Unchanged)
    with pytest.raises(SparkctlError, match="no server named 'nope'"):
        servers.StopNamed("nope").check(make_context(inv, "spark-a", lonely))


def test_the_simulated_launch_server_rejects_what_sglang_rejects(tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(IMAGE / "pylib") + ":" + str(Path(__file__).resolve().parents[2]),
           "SPARKLAB_LAB_DIR": str(tmp_path), "HF_HOME": str(tmp_path / "hf"), "PATH": "/usr/bin:/bin"}
    def launch(*words: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sglang.launch_server", "--model-path", "x/y",
                               *words], capture_output=True, text=True, env=env, timeout=60)

    assert launch("--tpp", "2").returncode == 2
    assert "unrecognized arguments: --tpp" in launch("--tpp", "2").stderr
    ambiguous = launch("--pp", "2")
    assert ambiguous.returncode == 2 and "ambiguous option: --pp could match --pp-async-batch-depth, " \
        "--pp-max-micro-batch-size, --pp-size" in ambiguous.stderr
    # --tp is --tp-size (the seed blog's own flag): parsing passes, the missing model stops it
    abbreviated = launch("--tp", "1")
    assert abbreviated.returncode == 1 and "x/y" in abbreviated.stderr


def sim(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(IMAGE / "pylib") + ":" + str(IMAGE) + ":"
           + str(Path(__file__).resolve().parents[2]),
           "SPARKLAB_LAB_DIR": str(tmp_path), "HF_HOME": str(tmp_path / "hf"),
           "PATH": "/usr/bin:/bin", "SPARKLAB_OUTBOX": str(tmp_path)}
    (tmp_path / "config").mkdir(exist_ok=True)
    (tmp_path / "config" / "lab.json").write_text('{"engine_load_seconds": 0}')
    for repo in ("Qwen/Qwen3.6-27B-FP8", "Qwen/Qwen3-8B"):
        subprocess.run([sys.executable, "-c", "import sys; from sparklab_engine.hf_cli import main; "
                        "sys.exit(main(sys.argv[1:]))", "download", repo],
                       capture_output=True, env=env, timeout=60, check=False)
    return subprocess.run([sys.executable, "-m", "sglang.launch_server", *argv, "--port", "1"],
                          capture_output=True, text=True, env={**env, "HF_HUB_OFFLINE": "1"},
                          timeout=60)


def test_the_simulated_server_fails_as_sglang_fails(tmp_path: Path) -> None:
    no_mtp = sim(tmp_path, "--model-path", "Qwen/Qwen3-8B", "--speculative-algorithm", "nextn",
                 "--speculative-num-steps", "3")
    assert no_mtp.returncode == 1 and "MTP (NextN) layers" in no_mtp.stderr, no_mtp.stderr
    radix = sim(tmp_path, "--model-path", "Qwen/Qwen3.6-27B-FP8", "--speculative-algorithm",
                "NEXTN", "--speculative-num-steps", "3")
    assert "not compatible with radix cache" in radix.stderr, radix.stderr
    nextn = ("--model-path", "Qwen/Qwen3.6-27B-FP8", "--speculative-algorithm", "NEXTN",
             "--speculative-num-steps", "5", "--speculative-eagle-topk", "4",
             "--disable-radix-cache")
    tree = sim(tmp_path, *nextn)  # the seed blog's command (issue 35)
    assert tree.returncode == 1, tree.stderr
    assert "tokenizer_manager.py\", line 281" in tree.stderr
    assert "TypeError: '>' not supported between instances of 'NoneType' and 'int'" in tree.stderr
    no_topk = sim(tmp_path, *nextn[:6], "--disable-radix-cache")
    assert "server_args.py\", line 3838" in no_topk.stderr and "TypeError" in no_topk.stderr
    given = sim(tmp_path, *nextn, "--speculative-num-draft-tokens", "20",
                "--mem-fraction-static", "0.01")
    assert "TypeError" not in given.stderr and "Not enough memory" in given.stderr, given.stderr
    small = sim(tmp_path, "--model-path", "Qwen/Qwen3.6-27B-FP8", "--mem-fraction-static", "0.2")
    assert "Not enough memory. Please try to increase --mem-fraction-static" in small.stderr


def test_the_one_wait_loop_waits_for_sglangs_ready_line_and_a_dead_rank_stops_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's readiness as data: /health 200 is not enough until its log says it is fired up
    (its warm-up request went through); a rank's container that ends stops the server."""
    import dataclasses

    from conftest import FakeTransport

    from orchestrator.engines import readiness
    from orchestrator.engines.base import LaunchFailed
    from orchestrator.engines.sglang import ready

    fast = dataclasses.replace(ready.READINESS, poll_seconds=0.0)
    recipe = load_recipe("qwen3.6-27b-tp2")
    spec = ServeSpec(recipe, make_inventory(), LaunchOptions())
    assert spec.nodes == ["spark-a", "spark-b"]
    up = json.dumps({"health": 200, "models": [recipe.model]})
    answers = iter([f"running=true\nfired=0\n{up}\n", f"running=true\nfired=1\n{up}\n"])
    head = FakeTransport("spark-a").on("/health", answer=lambda call: (0, next(answers), ""))
    other = FakeTransport("spark-b").on("State.Running", stdout="true\n")
    notes: list[str] = []
    done = readiness.wait_until_ready({"spark-a": head, "spark-b": other}, ready.target(spec),
                                      fast, 60, notes.append)
    assert done.models == [recipe.model]
    assert 'not yet "The server is fired up and ready to roll!"' in notes[0]
    assert "fired up" in notes[-1] and len([c for c in head.commands if "fired=" in c]) == 2
    gone = FakeTransport("spark-b").on("State.Running", stdout="gone\n")
    head = FakeTransport("spark-a").on("/health", stdout='running=true\nfired=0\n{"health": 503}\n')
    with pytest.raises(LaunchFailed, match=r"SGLang's rank exited on spark-b while spark-a loaded"):
        readiness.wait_until_ready({"spark-a": head, "spark-b": gone}, ready.target(spec), fast,
                                   60, lambda line: None)
    assert any("label=sparkctl.server=" in c for c in gone.commands)  # stopped on every node
