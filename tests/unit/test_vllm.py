"""The vLLM engine: recipe validation against vLLM's option table, the Ray containers' specs, the
serve command, the memory estimate and the Ray-cluster judgement (faked facts, no I/O)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeTransport
from conftest import make_context as context
from conftest import make_inventory as inventory

from orchestrator.core.step import Change, Unchanged
from orchestrator.engines import engine_of, load_recipe
from orchestrator.engines.optiontable import load_table
from orchestrator.engines.vllm import ray, serve
from orchestrator.errors import InputError, SparkctlError
from orchestrator.phases import container as c
from orchestrator.recipe import LaunchOptions

IBDEV = {
    "enp1s0f1np1": {"device": "rocep1s0f1", "state": "Up"},
    "enP2p1s0f1np1": {"device": "roceP2p1s0f1", "state": "Up"},
}


def recipe_file(tmp_path: Path, **fields: Any) -> str:
    data = {"engine": "vllm", "name": "r", "model": "org/model", "tensor_parallel_size": 2,
            "memory": {"weights_gb": 100}, **fields}
    path = tmp_path / "r.yml"
    path.write_text(json.dumps(data))
    return str(path)


def test_minimax_recipe_is_two_sparks_over_ray() -> None:
    recipe = load_recipe("minimax-m2.7")
    assert engine_of(recipe).name == "vllm"
    assert (recipe.model, recipe.tensor_parallel_size, recipe.node_count) == (
        "nvidia/MiniMax-M2.7-NVFP4", 2, 2)
    argv = serve.serve_argv(recipe, "127.0.0.1")
    assert argv[:3] == ["vllm", "serve", "nvidia/MiniMax-M2.7-NVFP4"]
    assert "--distributed-executor-backend" in argv and argv[argv.index("--host") + 1] == "127.0.0.1"
    assert load_table("vllm").check_flags(argv[2:]) == []  # the whole command line is valid
    estimate = engine_of(recipe).estimate_memory(recipe)
    assert estimate.fits and estimate.weights_gb == 65.5  # ~130.6 GB NVFP4 build / 2
    single = load_recipe("gpt-oss-120b-vllm")
    assert single.node_count == 1 and engine_of(single).estimate_memory(single).fits


def test_unknown_flag_names_the_flag_the_version_and_the_nearest(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        load_recipe(recipe_file(tmp_path, serve_args=["--max-modle-len", "4096"]))
    message = str(err.value)
    assert "--max-modle-len" in message and "vLLM 0.31.0" in message
    assert "did you mean --max-model-len" in message


def test_bad_values_and_reserved_flags_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"kv-cache-dtype.*fp9"):
        load_recipe(recipe_file(tmp_path, serve_args=["--kv-cache-dtype", "fp9"]))
    with pytest.raises(InputError, match="must not set --port"):
        load_recipe(recipe_file(tmp_path, serve_args=["--port", "9000"]))
    with pytest.raises(InputError, match="one node per rank"):
        load_recipe(recipe_file(tmp_path, nodes=3))
    with pytest.raises(InputError, match="looks like a secret"):
        load_recipe(recipe_file(tmp_path, env={"HF_TOKEN": "x"}))


def test_memory_estimate_counts_utilization_and_the_object_store(tmp_path: Path) -> None:
    recipe = load_recipe(recipe_file(tmp_path, memory={"weights_gb": 100, "kv_cache_fraction": 0.9},
                                     ray={"object_store_gb": 10}, image="nvcr.io/nvidia/vllm:26.03-py3"))
    estimate = engine_of(recipe).estimate_memory(recipe)
    # 0.9 x 128 = 115.2 for vLLM, + 10 object store: 2.8 GB left < half the 8 GB reserve
    assert estimate.verdict == "tight" and estimate.total_gb == 125.2
    # without Ray (the default image has none: vLLM's own multi-node) there is no object store
    no_ray = load_recipe(recipe_file(tmp_path, memory={"weights_gb": 100, "kv_cache_fraction": 0.9},
                                     ray={"object_store_gb": 10}))
    assert no_ray.backend == "mp" and engine_of(no_ray).estimate_memory(no_ray).total_gb == 115.2
    too_big = load_recipe(recipe_file(tmp_path, memory={"weights_gb": 250, "kv_cache_fraction": 0.8}))
    assert engine_of(too_big).estimate_memory(too_big).verdict == "does not fit"


def node_facts(name: str) -> dict[str, Any]:
    return {"hostname": name, "images": {}, "containers": {}, "files": {c.INFINIBAND: {"exists": False}},
            "ibdev2netdev": {"rc": 0, "devices": IBDEV},
            "commands": {"home": {"rc": 0, "out": "/home/nvidia\n", "err": ""}}}


def server(recipe: Any, **options: Any) -> serve.ServeSpec:
    """The server a launch of RECIPE makes (engines/vllm/serve.py), on the test inventory."""
    return serve.ServeSpec(recipe, inventory(), LaunchOptions(**options))


def specs(recipe: Any, **options: Any) -> dict[str, Any]:
    inv = inventory()
    facts = {"spark-a": node_facts("spark-a"), "spark-b": node_facts("spark-b")}
    out = {}
    spec = server(recipe, **options)
    for node in ("spark-a", "spark-b"):
        ctx = context(inv, node, facts)
        out[node] = (ray.spec_for(spec, "head")(ctx), ray.spec_for(spec, "worker")(ctx))
    return out


def test_ray_containers_bind_to_the_fabric_never_the_management_network() -> None:
    recipe = load_recipe("minimax-m2.7")
    by_node = specs(recipe)
    head, none = by_node["spark-a"]
    none2, worker = by_node["spark-b"]
    assert none is None and none2 is None
    assert head.command[:8] == ["ray", "start", "--head", "--node-ip-address", "192.168.200.12",
                                "--port", "6379", "--include-dashboard=false"]
    assert worker.command[:6] == ["ray", "start", "--address", "192.168.200.12:6379",
                                  "--node-ip-address", "192.168.200.13"]
    for spec, ip in ((head, "192.168.200.12"), (worker, "192.168.200.13")):
        assert spec.command[-1] == "--block" and "--object-store-memory" in spec.command
        assert spec.command[spec.command.index("--num-gpus") + 1] == "1"
        assert spec.env["VLLM_HOST_IP"] == ip
        assert spec.env["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1,enP2p1s0f1np1"
        assert spec.env["GLOO_SOCKET_IFNAME"] == "enp1s0f1np1"
        assert spec.env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
        assert ("/home/nvidia/.cache/huggingface", "/root/.cache/huggingface", False) in spec.mounts
        assert spec.labels["sparkctl.engine"] == "vllm" and spec.name == "sparkctl-vllm-minimax-m2.7"
        assert spec.labels["sparkctl.server"] == "minimax-m2.7"
        assert spec.command[spec.command.index("--dashboard-agent-listen-port") + 1] == "25000"
        assert "--network" in spec.run_args() and not any("TOKEN" in a for a in spec.run_args())
    # a new head means a new Ray cluster: the worker's hash follows the head's
    assert worker.hashed["head"] == head.digest()


def test_worker_start_failure_names_the_head_address_and_a_fix() -> None:
    recipe = load_recipe("minimax-m2.7")
    inv = inventory()
    facts = {"spark-a": node_facts("spark-a"), "spark-b": node_facts("spark-b")}
    ctx = context(inv, "spark-b", facts,
                  transports={"spark-b": FakeTransport("spark-b", [(4, "", "did not join; log")])})
    step = c.Container(ray.spec_for(server(recipe), "worker"), name="ray-worker")
    change = step.check(ctx)
    assert isinstance(change, Change)
    expected = r"(?s)spark-b: container/ray-worker.*192\.168\.200\.12:6379.*netcheck"
    with pytest.raises(SparkctlError, match=expected):
        step.apply(ctx, change)


def test_ray_cluster_step_waits_only_for_missing_nodes() -> None:
    recipe = load_recipe("minimax-m2.7")
    inv = inventory()
    both = {"nodes": [{"ip": "192.168.200.12", "alive": True}, {"ip": "192.168.200.13", "alive": True}]}
    one = {"nodes": [{"ip": "192.168.200.12", "alive": True}, {"ip": "192.168.200.13", "alive": False}]}

    def facts(probe: dict[str, Any]) -> dict[str, Any]:
        return {"spark-a": {"commands": {"ray": {"rc": 0, "out": "noise\n" + json.dumps(probe)}}}}

    spec = server(recipe)
    assert isinstance(ray.RayCluster(spec).check(context(inv, "spark-a", facts(both))), Unchanged)
    assert isinstance(ray.RayCluster(spec).check(context(inv, "spark-a", facts(one))), Change)
    assert [n.name for n in ray.missing_nodes(spec, one)] == ["spark-b"]
    # the Ray head is the server's first node: the other node does not wait
    assert isinstance(ray.RayCluster(spec).check(context(inv, "spark-b", {**facts(one), "spark-b": {}})),
                      Unchanged)


def test_a_fabric_link_down_is_refused_before_ray_starts() -> None:
    recipe = load_recipe("minimax-m2.7")
    inv = inventory()
    facts = {"spark-a": node_facts("spark-a"), "spark-b": node_facts("spark-b")}
    facts["spark-b"]["links"] = {"enp1s0f1np1": {"operstate": "DOWN", "up": True, "carrier": False,
                                                 "addresses": []}}
    step = c.Container(ray.spec_for(server(recipe), "worker"), name="ray-worker")
    with pytest.raises(SparkctlError, match=r"spark-b: its Ray worker would use 192\.168\.200\.13 "
                                            r"on enp1s0f1np1, but enp1s0f1np1 has no link"):
        step.check(context(inv, "spark-b", facts))
    facts["spark-b"]["links"]["enp1s0f1np1"].update(carrier=True, operstate="UP",
                                                    addresses=["192.168.200.13/24"])
    assert isinstance(step.check(context(inv, "spark-b", facts)), Change)
