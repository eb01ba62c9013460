"""Typed facts: requests merge exactly (conflicts raise), answers read as types."""

from __future__ import annotations

import pytest

from orchestrator.engines import builtin_names
from orchestrator.errors import SparkctlError
from orchestrator.remote.facts import (
    Command,
    CommandResult,
    FactConflict,
    File,
    FileInfo,
    merge_requests,
    request_of,
)
from orchestrator.remote.gathered import NodeFacts
from orchestrator.remote.node_facts import DockerContainer, DockerImage


def test_requests_merge_section_by_section() -> None:
    merged = merge_requests([
        {"files": {"/a": False}, "containers": ["c1"], "links": True, "timeout": 30},
        {"files": {"/a": True, "/b": False}, "containers": ["c1", "c2"], "timeout": 90},
        {"commands": {"home": "getent passwd nvidia"}, "ibdev2netdev": True},
    ])
    assert merged == {
        "files": {"/a": True, "/b": False},  # asking for content wins
        "containers": ["c1", "c2"],
        "links": True,
        "timeout": 90,
        "commands": {"home": "getent passwd nvidia"},
        "ibdev2netdev": True,
    }


def test_merging_never_changes_the_inputs() -> None:
    first = {"containers": ["c1"]}
    merge_requests([first, {"containers": ["c2"]}])
    assert first == {"containers": ["c1"]}


def test_one_command_key_with_two_commands_is_a_bug_not_a_guess() -> None:
    with pytest.raises(FactConflict, match="'serve'"):
        merge_requests([{"commands": {"serve": "a"}}, {"commands": {"serve": "b"}}])
    # the same command twice is fine
    assert merge_requests([{"commands": {"x": "a"}}, {"commands": {"x": "a"}}]) == {
        "commands": {"x": "a"}}


def test_unknown_sections_must_agree() -> None:
    with pytest.raises(FactConflict):
        merge_requests([{"lock": {"token": "1"}}, {"lock": {"token": "2"}}])


def test_typed_reads() -> None:
    answer = NodeFacts.parse({
        "commands": {"home": {"rc": 0, "out": "/home/nvidia\n", "err": ""}},
        "files": {"/etc/x": {"exists": True, "mode": 0o644, "uid": 0, "size": 3,
                             "sha256": "abc", "content": "hi\n"}, "/etc/y": {"exists": False}},
        "containers": {"c1": {"State": {"Running": True}}, "c2": None},
        "images": {"img": {"error": "permission denied"}},
    }, "spark-a")
    home = Command("home", "getent passwd nvidia").read(answer)
    assert home == CommandResult(0, "/home/nvidia\n", "") and home.ok
    assert Command("absent", "true").read(answer) is None
    assert File("/etc/x", content=True).read(answer) == FileInfo(True, 0o644, 0, 3, "abc", "hi\n")
    assert File("/etc/y").read(answer) == FileInfo(False)
    found = DockerContainer("c1").read(answer)
    assert found is not None and found.running
    assert DockerContainer("c2").read(answer) is None
    with pytest.raises(SparkctlError, match="spark-a: `docker image inspect img` failed"):
        DockerImage("img").read(answer)
    assert DockerImage("img").read(answer, strict=False) is None


def test_request_of_builds_one_request_for_many_facts() -> None:
    request = request_of(Command("home", "getent passwd u"), File("/etc/x", content=True),
                         DockerContainer("c1"), DockerImage("i"))
    assert request == {"commands": {"home": "getent passwd u"}, "files": {"/etc/x": True},
                       "containers": ["c1"], "images": ["i"]}


@pytest.mark.parametrize("recipe_name", builtin_names())
@pytest.mark.parametrize("replace", [False, True])
def test_every_plan_of_every_recipe_merges_its_facts_without_conflict(recipe_name: str,
                                                                       replace: bool) -> None:
    """The executor merges every phase's facts into one request per node before the first
    phase: two phases naming one command differently would fail every launch of that recipe
    (it did: SGLang's check and serve phases asked for `servers` probed and not)."""
    from conftest import make_inventory

    from orchestrator.core.plan import build_up_plan
    from orchestrator.engines import get_engine, load_recipe
    from orchestrator.recipe import LaunchOptions

    inventory = make_inventory()
    recipe = load_recipe(recipe_name)
    engine = get_engine(recipe.engine)
    plans = [engine.launch_phases(recipe, inventory, LaunchOptions(replace=replace)),
             build_up_plan(inventory).phases]
    for phases in plans:
        for node in inventory.nodes:
            requests = [p.facts(inventory, node) for p in phases if node in p.nodes(inventory)]
            merge_requests(requests)  # raises FactConflict on a conflict
