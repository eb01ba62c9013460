"""The inventory's `engines:` section: which engines a cluster serves, each engine's own
settings, the old top-level `container:`, and what `up` and `launch` do for an inventory that
names only engines without an `up` container."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import TWO_SPARKS, model_args
from conftest import node_facts as as_facts

from orchestrator.core.plan import build_up_plan
from orchestrator.engines import REGISTRY, check_against_inventory, load_recipe, up_container
from orchestrator.errors import InputError
from orchestrator.inventory import Inventory
from orchestrator.inventory_checks import inventory_from_data, load_inventory
from orchestrator.phases import models, preflight
from orchestrator.phases.registry import RegistryCheck

TRTLLM_IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc13"


def inventory(**extra: Any) -> Inventory:
    return inventory_from_data({**json.loads(json.dumps(TWO_SPARKS)), **extra}, "inv.yml")


def only_sglang() -> Inventory:
    return inventory(engines={"sglang": {}})


def test_left_out_every_engine_is_served_with_its_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    inv = inventory()
    assert inv.served_engines == sorted(REGISTRY) and inv.engines is None
    assert (inv.container.image, inv.container.name, inv.container.ssh_port) == (
        TRTLLM_IMAGE, "trtllm-multinode", 2233)
    assert inv.cluster.hf_cache == "~/.cache/huggingface"
    found = up_container(inv)
    assert found is not None and found.settings.name == "trtllm-multinode"
    assert capsys.readouterr().err == ""  # nothing deprecated here


def test_the_old_top_level_container_loads_with_a_one_line_note(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "old.yml"
    path.write_text(yaml.safe_dump({**TWO_SPARKS, "container": {
        "image": "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12", "name": "mine",
        "hf_cache": "/data/hf"}}))
    inv = load_inventory(path)
    assert inv.container.image.endswith("rc12") and inv.container.name == "mine"
    assert inv.container.ssh_port == 2233 and inv.cluster.hf_cache == "/data/hf"
    assert inv.served_engines == sorted(REGISTRY)  # it served every engine, and still does
    note = capsys.readouterr().err
    assert note.count("\n") == 1 and note.startswith(f"note: {path}: top-level `container:`")
    assert "engines: {trtllm: {container: ...}}" in note


def test_both_places_at_once_are_refused() -> None:
    with pytest.raises(InputError, match=r"both container: .* and engines\.trtllm\.container"):
        inventory(container={"name": "a"}, engines={"trtllm": {"container": {"name": "b"}}})


@pytest.mark.parametrize(("engines", "message"), [
    ({"tgi": {}}, "engines: 'tgi' is not an engine sparkctl knows; use one of: llamacpp, sglang"),
    ({"sglang": {"image": "x"}}, "engines: sglang.image: Extra inputs are not permitted (unknown key"),
    ({"trtllm": {"container": {"ssh_port": 0}}}, "engines: trtllm.container.ssh_port: Input should"),
    ({}, "engines: name at least one engine"),
])
def test_a_wrong_section_names_the_key(engines: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=r"inv\.yml: invalid inventory") as caught:
        inventory(engines=engines)
    assert message in str(caught.value)


def test_an_inventory_naming_only_sglang_keeps_no_up_container() -> None:
    inv = only_sglang()
    assert inv.served_engines == ["sglang"] and up_container(inv) is None
    names = [phase.name for phase in build_up_plan(inv).phases]
    assert names == ["preflight", "network"]  # no ssh trust, no container, no MPI
    assert [phase.name for phase in build_up_plan(inventory()).phases] == [
        "preflight", "network", "ssh-keys", "ssh-trust", "container", "mpi"]
    phase = preflight.phase(inv)
    assert not any(isinstance(step, RegistryCheck) for step in phase.steps)
    request = phase.facts(inv, inv.nodes[0])
    assert TRTLLM_IMAGE not in json.dumps(request)  # never asks about (or pulls) that image


def test_launch_refuses_an_engine_the_inventory_does_not_serve() -> None:
    with pytest.raises(InputError, match=r"recipe qwen3-235b is served by TensorRT-LLM, which the "
                                         r"inventory inv.yml does not list under engines: \(it "
                                         r"lists sglang\); add `trtllm: \{\}`"):
        check_against_inventory(load_recipe("qwen3-235b"), only_sglang())
    check_against_inventory(load_recipe("qwen3-8b"), only_sglang())


@pytest.mark.parametrize("recipe", ["qwen3-8b", "gpt-oss-120b-vllm", "lab-tiny-llama"])
def test_models_are_fetched_with_the_recipes_own_image(recipe: str) -> None:
    loaded = load_recipe(recipe)
    inv = inventory()
    nodes, tools = model_args(loaded, inv)
    assert tools.image == loaded.image
    request = models.phase(loaded, nodes, tools.image, inv).facts(inv, inv.nodes[0])
    # the look needs the image (what fetches next); the manifest itself is the node's python3
    assert request["gates"]["models"]["image"] == loaded.image
    assert shlex.split(request["commands"]["models"])[0] == "python3"
    fetch = shlex.split(models.download_cmd(tools, loaded.model, loaded.revision, None, False))
    run = fetch[:fetch.index("hf")]
    assert run[:3] == ["docker", "run", "--rm"] and run[-1] == loaded.image
    assert "trtllm-multinode" not in run and "exec" not in run


def test_tensorrt_llm_models_use_the_up_image() -> None:
    inv = inventory(engines={"trtllm": {"container": {"image": "registry.local/trt:1"}}})
    assert model_args(load_recipe("qwen3-235b"), inv)[1].image == "registry.local/trt:1"


def test_status_calls_a_set_up_node_up_without_an_up_container() -> None:
    from test_status import INVENTORY, node_facts

    from orchestrator.engines.capabilities import NoSettings
    from orchestrator.status.nodes import assess_node

    inv = INVENTORY.model_copy(update={"engines": {"sglang": NoSettings()}})
    facts = node_facts("spark-a")
    node = assess_node(inv, inv.node("spark-a"), as_facts(facts))
    assert node["container"] == {"name": None, "status": "absent", "digest": None}
    assert node["state"] == "up" and not node["problems"]


def test_netcheck_without_an_up_container_pings_the_links_only() -> None:
    from orchestrator.netcheck.checks import facts_request
    from orchestrator.netcheck.container import CONTAINER_CHECKS
    from orchestrator.netcheck.probes import build_probes

    inv = only_sglang()
    node = inv.node("spark-a")
    assert {p.kind for p in build_probes(inv, node, deep=False)} == {"ping", "mtu-ping"}
    assert {p.kind for p in build_probes(inventory(), node, deep=False)} == {
        "ping", "mtu-ping", "ssh-node", "ssh-container", "mpirun"}
    request = facts_request(inv, node)
    assert "containers" not in request and "images" not in request
    assert all(check(inv, node, {}) == [] for check in CONTAINER_CHECKS)


def test_the_models_cache_mount_is_the_users_home_and_inert(tmp_path: Path) -> None:
    """`~` is the cluster user's home on the node (as the shell expands ~USER), and the rest of
    cluster.hf_cache is one literal word, metacharacters and all."""
    import getpass
    import os
    import subprocess

    from orchestrator.phases.model_tools import ModelTools

    marker = tmp_path / "pwned"
    cache = f"~/.cache/hf $(touch {marker}) `touch {marker}` ; touch {marker} | x & y"
    user = getpass.getuser()
    command = ModelTools("img:1", cache, user).cmd(["true"])
    shown = subprocess.run(["bash", "-c", command.replace("docker", "printf '%s\\n'", 1)],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    home = os.path.expanduser(f"~{user}")
    assert shown[shown.index("-v") + 1] == f"{home}{cache[1:]}:/root/.cache/huggingface"
    assert not marker.exists()
    assert ModelTools("img:1", "/data/hf", user).cmd(["true"]).count("-v /data/hf:") == 1


def test_the_model_image_phase_checks_the_registry_then_brings_the_image() -> None:
    from orchestrator.phases.model_image import image_phase

    inv = inventory()
    placed = load_recipe("qwen3-8b").model_copy(update={"placement": ["spark-b"]})
    phase = image_phase(placed.image, ["spark-b"], inv)
    assert [s.name for s in phase.steps] == ["registry", "image", "image-share", "image-digest"]
    # the head fetches the models (and hashes, sends them) even when the server is elsewhere
    assert [n.name for n in phase.nodes(inv)] == ["spark-a", "spark-b"]
    assert phase.facts(inv, inv.nodes[0])["images"] == [placed.image]


LAUNCH_PATH = """
import json, sys
from orchestrator.inventory_checks import inventory_from_data
inventory = inventory_from_data(json.loads(sys.argv[1]), "inv.yml")
built = sorted(m for m in sys.modules if m.startswith("orchestrator.engines.")  # an engine's
               and m.count(".") == 3 and not m.endswith(".settings"))  # module, not its settings
from orchestrator.cli.launch_plan import checked_recipe, launch_plan
from orchestrator.engines import load_recipe
from orchestrator.recipe import LaunchOptions
recipe = checked_recipe(load_recipe("lab-tiny-llama"), inventory)
plan = launch_plan(recipe, inventory, LaunchOptions())
for phase in plan.phases:  # the facts requests, as the executor gathers them up front
    for node in phase.nodes(inventory):
        phase.facts(inventory, node)
print(json.dumps({"inventory": built, "launch": sorted(sys.modules)}))
"""


def test_a_llamacpp_launch_builds_no_engine_for_the_inventory_nor_what_only_other_commands_use(
) -> None:
    """Issue 40: the controller's import CPU competes with the nodes' gatherers. Loading an
    inventory that names every engine builds none (its sections' models are the folders'
    settings.py); the plan of a llama.cpp launch (with its facts requests: every engine's ready
    line and process words) imports no engine's advise, recipes-import or bench modules, and no
    other engine's option table."""
    import subprocess
    import sys

    data = json.loads(json.dumps(TWO_SPARKS))
    data["engines"] = {"trtllm": {"container": {"image": TRTLLM_IMAGE}}, "vllm": {},
                       "sglang": {}, "llamacpp": {}}
    out = subprocess.run([sys.executable, "-c", LAUNCH_PATH, json.dumps(data)],
                         capture_output=True, text=True, check=True).stdout
    found = json.loads(out.splitlines()[-1])
    assert found["inventory"] == []
    launch = found["launch"]
    assert "orchestrator.engines.llamacpp.serve" in launch  # (the test sees the engine it uses)
    only_elsewhere = [m for m in launch if m.rsplit(".", 1)[-1] in (
        "importer", "layouts", "meter", "metrics", "import_job", "importing", "foreign")
        or m.startswith(("orchestrator.advise", "orchestrator.bench"))
        or (m.endswith(".options") and m != "orchestrator.engines.llamacpp.options")]
    assert only_elsewhere == []
