"""vLLM's multi-node executor follows the image: Ray where the image ships it, else vLLM's own
multi-node (mp: --nnodes/--node-rank/--master-addr/--master-port, --headless on the ranks > 0).
A recipe may force either; forcing Ray on an image without it is refused before anything runs;
what an image holds is probed once per image ID; a Ray launch refuses nodes whose RoCE device
names differ from the head's (vLLM copies the head's NCCL_IB_HCA onto its Ray workers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeTransport
from conftest import make_context as context
from conftest import make_inventory as inventory
from test_vllm import IBDEV, node_facts, recipe_file

from orchestrator.core.step import Change, Unchanged
from orchestrator.engines import load_recipe
from orchestrator.engines.vllm import images, multinode, ray, serve
from orchestrator.errors import SparkctlError

HEAD_IP, WORKER_IP = "192.168.200.12", "192.168.200.13"


@pytest.mark.parametrize(("image", "executor", "backend"), [
    ("nvcr.io/nvidia/vllm:26.10-py3", "auto", "mp"),
    ("vllm/vllm-openai:v0.31.0", "auto", "mp"),
    ("nvcr.io/nvidia/vllm:26.03-py3", "auto", "ray"),
    ("nvcr.io/nvidia/vllm:26.03-py3", "mp", "mp"),
    ("example.org/own/vllm:1", "auto", "mp"),  # not known: vLLM's own needs nothing more
    ("example.org/own/vllm:1", "ray", "ray"),  # the probe decides whether it may
])
def test_executor_follows_the_image(tmp_path: Path, image: str, executor: str, backend: str) -> None:
    recipe = load_recipe(recipe_file(tmp_path, image=image, executor=executor))
    assert recipe.backend == backend


def test_forcing_ray_on_an_image_without_it_is_refused_naming_the_image_and_the_fix(
        tmp_path: Path) -> None:
    with pytest.raises(SparkctlError) as raised:
        load_recipe(recipe_file(tmp_path, executor="ray"))
    text = str(raised.value)
    assert raised.value.exit_code == 2
    assert "nvcr.io/nvidia/vllm:26.10-py3 ships no Ray" in text and "executor: mp" in text
    assert images.RAY_IMAGE in text


def test_mp_serve_commands_carry_the_rendezvous_and_headless_on_the_other_ranks() -> None:
    recipe = load_recipe("minimax-m2.7-mp")
    inv = inventory()
    from orchestrator.recipe import LaunchOptions

    spec = serve.ServeSpec(recipe, inv, LaunchOptions())
    argv = spec.argv
    for flag, value in (("--distributed-executor-backend", "mp"), ("--nnodes", "2"),
                        ("--node-rank", "0"), ("--master-addr", HEAD_IP), ("--master-port", "29501"),
                        ("--port", "8000")):
        assert argv[argv.index(flag) + 1] == value
    assert "--headless" not in argv
    facts = {"spark-a": node_facts("spark-a"), "spark-b": node_facts("spark-b")}
    head = multinode.mp_spec_for(spec)(context(inv, "spark-a", facts))
    worker = multinode.mp_spec_for(spec)(context(inv, "spark-b", facts))
    assert head is not None and worker is not None
    assert head.command == ["sleep", "infinity"]  # rank 0 is started in it by the serve phase
    master = worker.command[worker.command.index("sparkctl-rank") + 1:][:2]
    assert master == [HEAD_IP, "29501"]  # the loop's own: is rank 0 still there?
    rank1 = worker.command[worker.command.index("sparkctl-rank") + 3:]
    assert rank1[:3] == ["vllm", "serve", recipe.model] and "--headless" in rank1
    assert rank1[rank1.index("--node-rank") + 1] == "1" and rank1[rank1.index("--nnodes") + 1] == "2"
    assert rank1[rank1.index("--master-addr") + 1] == HEAD_IP and "--port" not in rank1
    assert worker.env["VLLM_HOST_IP"] == WORKER_IP and worker.env["HF_HUB_OFFLINE"] == "1"
    # no Ray anywhere: no Ray settings, no object store
    for env in (head.env, worker.env):
        assert not [k for k in env if k.startswith("RAY_") or k == "VLLM_DISTRIBUTED_EXECUTOR_CONFIG"]
    assert worker.labels["sparkctl.role"] == "vllm-headless"
    assert (worker.name, worker.labels["sparkctl.server"], worker.labels["sparkctl.rank"]) == (
        "sparkctl-vllm-minimax-m2.7-mp", "minimax-m2.7-mp", "1")
    # placed the other way round: spark-b is rank 0 (the master), spark-a its headless rank
    flipped = serve.ServeSpec(recipe.model_copy(update={"placement": ["spark-b", "spark-a"],
                                                        "port": 8002}), inv, LaunchOptions())
    assert flipped.argv[flipped.argv.index("--master-addr") + 1] == WORKER_IP
    assert flipped.argv[flipped.argv.index("--master-port") + 1] == "29503"
    rank1 = multinode.mp_spec_for(flipped)(context(inv, "spark-a", facts))
    assert rank1 is not None and rank1.command[rank1.command.index("--master-addr") + 1] == WORKER_IP
    assert multinode.mp_spec_for(flipped)(context(inv, "spark-b", facts)).command == [  # type: ignore[union-attr]
        "sleep", "infinity"]
    from orchestrator.engines.vllm import ENGINE

    names = [p.name for p in ENGINE.launch_phases(recipe, inv, LaunchOptions())]
    assert "nodes" in names and "ray" not in names


def test_ray_on_one_gpu_nodes_spreads_its_placement_group() -> None:
    recipe = load_recipe("minimax-m2.7")
    env = ray.engine_env(inventory(), inventory().head, ["rocep1s0f1", "roceP2p1s0f1"], recipe)
    assert json.loads(env["VLLM_DISTRIBUTED_EXECUTOR_CONFIG"]) == {
        "placement_group_options": {"strategy": "SPREAD"}}


def test_worker_nccl_device_names_must_match_the_heads_before_a_ray_launch() -> None:
    recipe = load_recipe("minimax-m2.7")
    inv = inventory()
    facts = {"spark-a": node_facts("spark-a"), "spark-b": node_facts("spark-b")}
    from orchestrator.recipe import LaunchOptions

    step = multinode.SameNcclDevices(serve.ServeSpec(recipe, inv, LaunchOptions()))
    assert isinstance(step.check(context(inv, "spark-a", facts)), Unchanged)
    other = {k: {**v, "device": v["device"].replace("roce", "mlx5_")} for k, v in IBDEV.items()}
    facts["spark-b"]["ibdev2netdev"] = {"rc": 0, "devices": other}
    with pytest.raises(SparkctlError) as raised:
        step.check(context(inv, "spark-a", facts))
    assert raised.value.exit_code == 2
    assert "spark-b" in str(raised.value) and "executor: mp" in str(raised.value)


IMAGE_ID = "sha256:" + "7" * 64


def probe_facts(image: str, record: dict[str, Any] | None) -> dict[str, Any]:
    facts = node_facts("spark-a")
    facts["images"] = {image: {"Id": IMAGE_ID}}
    facts["commands"][images.FACT_KEY] = {"rc": 0, "out": json.dumps(record) if record else ""}
    return facts


def test_the_image_is_probed_once_per_image_id_and_ray_refused_where_it_is_missing() -> None:
    image = "example.org/own/vllm:1"
    inv = inventory()
    # not recorded yet, vLLM's own multi-node: one probe after the pull, then the record
    fresh = images.RayInImage(image, "mp").check(
        context(inv, "spark-a", {"spark-a": probe_facts(image, None)}))
    assert isinstance(fresh, Change) and "command -v ray" in fresh.summary
    answer = json.dumps({"image": image, "image_id": IMAGE_ID, "ray": None})
    transport = FakeTransport("spark-a", [(0, answer + "\n", "")])
    ctx = context(inv, "spark-a", {"spark-a": probe_facts(image, None)},
                  transports={"spark-a": transport})
    assert "no Ray in example.org/own/vllm:1" in str(images.RayInImage(image, "mp").apply(ctx, fresh))
    assert images.record_path(image) in transport.commands[0]
    # recorded for this image ID: no probe again
    recorded = {"image": image, "image_id": IMAGE_ID, "ray": "2.54.0"}
    ok = images.RayInImage(image, "ray").check(
        context(inv, "spark-a", {"spark-a": probe_facts(image, recorded)}))
    assert isinstance(ok, Unchanged) and "Ray 2.54.0" in ok.reason
    # a record made for another image ID (the tag moved) is probed again
    stale = dict(recorded, image_id="sha256:" + "8" * 64)
    again = images.RayInImage(image, "mp").check(
        context(inv, "spark-a", {"spark-a": probe_facts(image, stale)}))
    assert isinstance(again, Change)


def test_ray_forced_on_an_image_already_on_the_node_is_refused_in_the_plan() -> None:
    """The image is on the node but not recorded: Ray's check probes it while planning and
    refuses there, before any change, saying nothing changed."""
    image = "example.org/own/vllm:1"
    answer = json.dumps({"image": image, "image_id": IMAGE_ID, "ray": None})
    transport = FakeTransport("spark-a", [(0, answer + "\n", "")])
    ctx = context(inventory(), "spark-a", {"spark-a": probe_facts(image, None)},
                  transports={"spark-a": transport})
    with pytest.raises(SparkctlError, match=r"ships no Ray \(probed.*Nothing was changed") as raised:
        images.RayInImage(image, "ray").check(ctx)
    assert raised.value.exit_code == 2
    assert "docker run --rm --network none" in transport.commands[0]


def test_ray_forced_on_an_image_pulled_for_it_says_the_pull_is_the_only_change() -> None:
    image = "example.org/own/vllm:1"
    facts = probe_facts(image, None)
    facts["images"] = {image: {"error": "No such image"}}  # gathered before this run's pull
    answer = json.dumps({"image": image, "image_id": IMAGE_ID, "ray": None})
    transport = FakeTransport("spark-a", [(0, answer + "\n", "")])
    ctx = context(inventory(), "spark-a", {"spark-a": facts},
                  shared={"image_facts": {"spark-a": {"Id": IMAGE_ID}}},
                  transports={"spark-a": transport})
    with pytest.raises(SparkctlError, match=r"pulled example.org/own/vllm:1 on spark-a to look "
                                            r"inside it: that pull is the only change made; no "
                                            r"container was created"):
        images.RayInImage(image, "ray").check(ctx)


@pytest.mark.parametrize(("image", "executor", "probed"), [
    ("example.org/own/vllm:1", "ray", True),
    ("example.org/own/vllm:1", "mp", False),
    ("nvcr.io/nvidia/vllm:26.03-py3", "ray", False),  # known to ship Ray
])
def test_an_unknown_image_forced_to_ray_is_looked_into_before_the_models(
        tmp_path: Path, image: str, executor: str, probed: bool) -> None:
    from orchestrator.engines import get_engine
    from orchestrator.recipe import LaunchOptions

    recipe = load_recipe(recipe_file(tmp_path, image=image, executor=executor))
    names = [p.name for p in get_engine("vllm").launch_phases(recipe, inventory(), LaunchOptions())]
    assert ("ray-check" in names) is probed
    if probed:
        assert names.index("ray-check") < names.index("models")


def test_a_step_refusing_the_input_makes_the_run_exit_2() -> None:
    """RayInImage's refusal carries exit 2 through the executor's report (other failures: 1)."""
    from orchestrator.core.executor import Executor
    from orchestrator.core.progress import Progress
    from orchestrator.core.report import Report
    from orchestrator.core.step import Phase, Plan, RunOptions

    image = "example.org/own/vllm:1"
    inv = inventory()
    answer = json.dumps({"image": image, "image_id": IMAGE_ID, "ray": None})
    transport = FakeTransport("spark-a", facts=probe_facts(image, None)).on("docker run", 0,
                                                                          answer + "\n")
    phase = Phase("ray-check", [images.RayInImage(image, "ray")], lambda i, n: {}, head_only=True)
    report = Report("launch")
    Executor(inv, {"spark-a": transport}, RunOptions(), report,  # type: ignore[dict-item]
             Progress(quiet=True)).run(Plan("launch", [phase]))
    assert not report.ok and report.exit_code == 2
    assert "Nothing was changed" in report.hosts["spark-a"].steps[-1].message
    assert Report("up").exit_code == 0
