"""Launch planning: faked facts in, decisions and commands out (no nodes needed)."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest
from conftest import cluster_of, model_args

from orchestrator.core.step import Change, NodeContext, RunOptions, RunState, Unchanged
from orchestrator.engines import load_recipe
from orchestrator.engines.trtllm import serve, steps
from orchestrator.errors import SparkctlError
from orchestrator.inventory import Inventory
from orchestrator.phases import models
from orchestrator.recipe import LaunchOptions

INVENTORY = Inventory.model_validate({
    "cluster": {"name": "lab"},
    "nodes": [
        {"name": "spark-a", "host": "10.0.0.1",
         "addresses": {"enp1s0f1np1": "192.168.200.12/24", "enP2p1s0f1np1": "192.168.201.12/24"}},
        {"name": "spark-b", "host": "10.0.0.2",
         "addresses": {"enp1s0f1np1": "192.168.200.13/24", "enP2p1s0f1np1": "192.168.201.13/24"}},
    ],
})
RECIPE = load_recipe("qwen3-235b")


def spec(replace: bool = False, host: str = "127.0.0.1", name: str | None = None,
         recipe: Any = RECIPE) -> serve.LaunchSpec:
    return serve.LaunchSpec(recipe, INVENTORY, LaunchOptions(host=host, replace=replace,
                                                             drop_caches=False, name=name))


def ctx(node: str, facts: dict[str, dict[str, Any]]) -> NodeContext:
    cluster = cluster_of(facts)
    return NodeContext(inventory=INVENTORY, node=INVENTORY.node(node), facts=cluster[node],
                       cluster_facts=cluster, transport=None, options=RunOptions(), shared=RunState())


def status_facts(server: dict[str, Any] | None, alive: bool, health: int | None = None) -> dict[str, Any]:
    answer = {"pids": {"mpirun.pid": {"pid": 7, "alive": alive}} if server else {},
              "server": server, "health": health}
    return {"commands": {"serve": {"rc": 0, "out": json.dumps(answer), "err": ""}}}


DIR = "/var/lib/sparkctl/run/servers/qwen3-235b"


def test_serve_command_spans_the_nodes_and_keeps_each_ranks_log_in_the_servers_dir() -> None:
    argv = serve.serve_argv(RECIPE, "127.0.0.1")
    assert argv[:3] == ["mpirun", "-np", "2"]
    assert "HF_HUB_OFFLINE=1" in argv and "NCCL_SOCKET_IFNAME" in argv
    tail = argv[argv.index("trtllm-llmapi-launch"):]
    assert tail[:3] == ["trtllm-llmapi-launch", "trtllm-serve", "nvidia/Qwen3-235B-A22B-FP4"]
    flags = dict(zip(tail[3::2], tail[4::2], strict=False))
    assert flags["--tp_size"] == "2" and flags["--port"] == "8355" and flags["--host"] == "127.0.0.1"
    assert flags["--extra_llm_api_options"] == f"{DIR}/extra-llm-api-config.yml"
    assert flags["--max_num_tokens"] == "1024"
    wrapper = argv[argv.index("bash") + 2]
    assert f'{DIR}/rank-"$r".pid' in wrapper and f'{DIR}/rank-"$r".log' in wrapper
    named = serve.serve_argv(RECIPE, "127.0.0.1", name="q2")
    assert "/servers/q2/extra-llm-api-config.yml" in " ".join(named)


def test_start_is_detached_logs_to_the_servers_dir_and_reads_its_hostfile() -> None:
    command = serve.start_cmd("trtllm-multinode", ["mpirun", "x y"], DIR)
    words = shlex.split(command)
    assert words[:3] == ["docker", "exec", "-d"]
    assert "HF_HUB_OFFLINE=1" in words
    # both Open MPI generations' name for the default hostfile: the server's own
    assert f"OMPI_MCA_orte_default_hostfile={DIR}/hostfile" in words
    assert f"PRTE_MCA_prte_default_hostfile={DIR}/hostfile" in words
    assert any(f"{DIR}/server.log" in w and f"{DIR}/mpirun.pid" in w for w in words)
    assert words[-2:] == ["mpirun", "x y"]


def test_the_hostfile_lists_the_servers_nodes_in_rank_order() -> None:
    assert spec().hostfile.splitlines()[1:] == ["192.168.200.12 slots=1", "192.168.200.13 slots=1"]
    placed = RECIPE.model_copy(update={"placement": ["spark-b", "spark-a"]})
    reverse = spec(recipe=placed)
    assert reverse.first == "spark-b" and reverse.nodes == ["spark-b", "spark-a"]
    assert reverse.hostfile.splitlines()[1:] == ["192.168.200.13 slots=1", "192.168.200.12 slots=1"]
    files = reverse.files()
    assert json.loads(files[f"{DIR}/processes.json"]) == {
        "container": "trtllm-multinode", "ours": list(serve.OURS)}


@pytest.mark.parametrize(("server", "alive", "health", "replace", "expected"), [
    (None, False, None, False, "start"),
    ({"config_hash": "SAME"}, True, 200, False, "noop"),
    ({"config_hash": "SAME"}, True, 503, False, "loading"),
    ({"config_hash": "SAME"}, False, None, False, "start"),
    ({"config_hash": "OTHER"}, True, 200, True, "replace"),
])
def test_decision(server: dict[str, Any] | None, alive: bool, health: int | None, replace: bool,
                  expected: str) -> None:
    launch = spec(replace=replace)
    if server:
        server = {**server, "config_hash": launch.digest if server["config_hash"] == "SAME"
                  else "other"}
    facts = {"spark-a": status_facts(server, alive, health), "spark-b": status_facts(None, False)}
    assert launch.decision(ctx("spark-a", facts)) == expected


def test_a_dead_rank_restarts_the_same_server_at_once() -> None:
    launch = spec()
    facts = {"spark-a": status_facts({"config_hash": launch.digest}, True, 503),
             "spark-b": {"commands": {"serve": {"rc": 0, "out": json.dumps(
                 {"pids": {"rank-1.pid": {"alive": False, "pid": 9}}})}}}}
    assert launch.decision(ctx("spark-a", facts)) == "restart"
    # in the words status uses for the same fact (engines/liveness.py)
    assert serve.dead_ranks(cluster_of(facts), ["spark-b"]) == ("rank-1 on spark-b (pid 9)",)


def test_relaunch_of_the_same_server_is_a_noop() -> None:
    launch = spec()
    facts = {"spark-a": status_facts({"config_hash": launch.digest}, True, 200),
             "spark-b": status_facts(None, False)}
    assert isinstance(steps.StartServer(launch).check(ctx("spark-a", facts)), Unchanged)
    assert isinstance(steps.StopPrevious(launch).check(ctx("spark-b", facts)), Unchanged)


def test_another_configuration_is_refused_without_replace_and_replaced_with_it() -> None:
    facts = {"spark-a": status_facts({"config_hash": "old", "recipe": "gpt"}, True, 200),
             "spark-b": status_facts(None, False)}
    with pytest.raises(SparkctlError, match="--replace"):
        steps.StartServer(spec()).check(ctx("spark-a", facts))
    change = steps.StartServer(spec(replace=True)).check(ctx("spark-a", facts))
    assert isinstance(change, Change) and change.summary.startswith("replace")
    assert isinstance(steps.StopPrevious(spec(replace=True)).check(ctx("spark-a", facts)), Change)


def test_config_hash_covers_the_bind_address_and_the_name() -> None:
    assert spec().digest != spec(host="0.0.0.0").digest
    assert spec().digest != spec(name="q2").digest


def manifest(present: bool, files: dict[str, list[Any]] | None = None) -> dict[str, Any]:
    """A node-side manifest (node/fanout.py): names -> blob paths, blobs with size and sha256."""
    files = files if files is not None else {"config.json": [10, "abc"]}
    if not present:
        files = {}
    return {"present": present, "commit": "c0ffee" if present else None,
            "files": {name: f"models--x/blobs/{name}" for name in files},
            "blobs": {f"models--x/blobs/{name}": {"size": size, "sha256": sha}
                      for name, (size, sha) in files.items()},
            "root": models.HUB_DIR, "links": {}, "refs": {}, "partial": [], "bytes": 10,
            "free": 10**12}


def model_facts(head: dict[str, Any], peer: dict[str, Any], token: bool = False) -> dict[str, Any]:
    def one(entries: dict[str, Any]) -> dict[str, Any]:
        return {"commands": {"models": {"rc": 0, "out": json.dumps(entries), "err": ""}},
                "files": {models.TOKEN_PATH: {"exists": token}}}
    return {"spark-a": one(head), "spark-b": one(peer)}


def test_models_download_only_what_the_head_lacks() -> None:
    repos = [r for r, _, _ in RECIPE.repos]
    facts = model_facts({repos[0]: manifest(True), repos[1]: manifest(False)},
                        {repos[0]: manifest(True), repos[1]: manifest(True)})
    change = models.Download(RECIPE, *model_args(RECIPE)).check(ctx("spark-a", facts))
    assert isinstance(change, Change) and change.payload == [repos[1]]
    facts = model_facts({r: manifest(True) for r in repos}, {r: manifest(True) for r in repos})
    assert isinstance(models.Download(RECIPE, *model_args(RECIPE)).check(ctx("spark-a", facts)), Unchanged)
    assert isinstance(models.Distribute(RECIPE, *model_args(RECIPE)).check(ctx("spark-a", facts)), Unchanged)


def test_a_leftover_token_file_is_removed_even_when_nothing_is_downloaded() -> None:
    repos = [r for r, _, _ in RECIPE.repos]
    facts = model_facts({r: manifest(True) for r in repos}, {r: manifest(True) for r in repos},
                        token=True)
    change = models.Download(RECIPE, *model_args(RECIPE)).check(ctx("spark-a", facts))
    assert isinstance(change, Change) and change.payload == []


def test_a_peer_with_different_files_gets_a_copy() -> None:
    repos = [r for r, _, _ in RECIPE.repos]
    facts = model_facts({r: manifest(True) for r in repos},
                        {repos[0]: manifest(True, {"config.json": [11, "abd"]}), repos[1]: manifest(True)})
    change = models.Distribute(RECIPE, *model_args(RECIPE)).check(ctx("spark-a", facts))
    assert isinstance(change, Change) and change.payload == ["spark-b"]
    assert repos[0] in change.summary and repos[1] not in change.summary


def test_a_stopped_container_is_a_clear_error() -> None:
    facts = {"spark-a": {"commands": {"models": {"rc": 1, "out": "", "err": "not running"}}}}
    with pytest.raises(SparkctlError, match=r"cannot look at the models with .*: not running"):
        models.Download(RECIPE, *model_args(RECIPE)).check(ctx("spark-a", facts))


def test_download_reads_the_token_from_a_file_never_from_argv() -> None:
    from orchestrator.phases.model_tools import ModelTools

    tools = ModelTools("img:1", "~/.cache/huggingface", "nvidia")
    command = models.download_cmd(tools, "org/m", "main", None, with_token=True)
    assert f"HF_TOKEN_PATH={models.TOKEN_PATH}" in shlex.split(command)
    assert "HF_TOKEN=" not in command and "--token" not in command
    assert "HF_TOKEN_PATH" not in models.download_cmd(tools, "org/m", "main", None, with_token=False)
    assert "0700" in models.token_write_cmd() and models.token_write_cmd().endswith(" write")
    assert models.token_remove_cmd().endswith(" undo")


def test_llm_api_config_file_is_managed_and_names_the_draft() -> None:
    text = serve.render_llm_api_config(RECIPE)
    assert text.startswith("# Managed by sparkctl")
    assert "speculative_model_dir: /root/.cache/huggingface/drafts/Qwen3-235B-A22B-Eagle3" in text
