"""The glue of `advise --measure`, with the launches, benches and the cluster's servers faked:
which servers each layout launches (replicas: one per node, named), that the same cells are
benched each time and replicas' aggregates add up, that a failed layout is reported and the
others still measured, that every started server is stopped and what ran before relaunched,
and that it never runs unattended without --yes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import as_servers

from orchestrator.advise.advice import advise
from orchestrator.cli import advise_measure
from orchestrator.engines import engine_of, load_recipe
from orchestrator.errors import InputError, SparkctlError

OPTS = {"inventory_path": None, "tg": 16, "pp": 64, "runs": 1, "timeout": 60.0, "yes": True}


class Cluster:
    def __init__(self, inventory: Any, before: list[dict[str, Any]], fail: str | None = None) -> None:
        self.inventory = inventory
        self.running: list[dict[str, Any]] = list(before)
        self.launched: list[tuple[str, list[str] | None, int, int]] = []
        self.configs: list[Any] = []
        self.stopped: list[str] = []
        self.persisted: list[str] = []
        self.restored_as: list[tuple[str, str, str | None, Any]] = []
        self.keys: dict[str, Any] = {}
        self.fail = fail

    def launch(self, inventory: Any, recipe: Any, name: str | None, timeout: float, token: Any,
               note: Callable[[str], None], persist: bool = False, host: str | None = None,
               key: Any = None) -> None:
        server = name or recipe.name
        self.persisted += [server] if persist else []
        self.restored_as.append((server, recipe.source, host, key))
        if self.fail and recipe.tp_size == 2:
            raise SparkctlError(self.fail)
        nodes = recipe.placement or [n.name for n in inventory.ordered_nodes()][:recipe.world_size]
        self.launched.append((server, recipe.placement, recipe.tp_size, recipe.pp_size))
        self.running.append({"name": server, "recipe": recipe.name, "nodes": nodes,
                             "port": recipe.port, "tp": recipe.tp_size})

    def bench(self, inventory: Any, server: str, config: Any, note: Callable[[str], None]) -> dict[str, Any]:
        self.configs.append(config)
        tp = next(s["tp"] for s in self.running if s["name"] == server)
        return {"cells": [{"concurrency": c, "figures": {"tg_throughput": {"mean": 10.0 * tp * c}}}
                          for c in config.concurrency]}

    def stop(self, inventory: Any, wanted: Callable[[Any], bool], note: Any) -> None:
        self.stopped += [str(s["name"]) for s in self.running if wanted(typed(s))]
        self.running = [s for s in self.running if not wanted(typed(s))]


def typed(server: dict[str, Any]) -> Any:
    """A fake's running server as the readers get it (a record node/servers.py listed)."""
    return as_servers([{k: v for k, v in server.items() if k != "tp"}])[0]


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch, inventory: Callable[..., Any]) -> Callable[..., Cluster]:
    def build(before: list[dict[str, Any]], fail: str | None = None) -> Cluster:
        fake = Cluster(inventory(), before, fail)
        monkeypatch.setattr("orchestrator.core.runner.load_inventory_option",
                            lambda option: (fake.inventory, "inv.yml"))
        monkeypatch.setattr(advise_measure, "_launch", fake.launch)
        monkeypatch.setattr(advise_measure, "_bench", fake.bench)
        monkeypatch.setattr(advise_measure, "_servers",
                            lambda inv, nodes: ([typed(s) for s in fake.running], dict(fake.keys)))
        monkeypatch.setattr(advise_measure, "_stop", fake.stop)
        monkeypatch.setattr("orchestrator.cli.launch.read_hf_token", lambda path: None)
        return fake
    return build


def test_each_layout_is_launched_benched_alike_and_what_ran_is_restored(cluster: Any) -> None:
    recipe = load_recipe("qwen3-8b")
    nodes = [n.name for n in cluster([]).inventory.ordered_nodes()]
    fake = cluster([{"name": "keep", "recipe": "qwen3-8b", "nodes": [nodes[1]], "port": 30001,
                     "persistent": True}])
    advice = advise(recipe, engine_of(recipe), 2, "throughput", 4)
    notes: list[str] = []
    assert advise_measure.measure(advice, OPTS, notes.append) == 0
    assert fake.launched[:5] == [
        ("qwen3-8b", [nodes[0]], 1, 1), ("qwen3-8b", nodes[:2], 2, 1),
        ("qwen3-8b", nodes[:2], 1, 2),
        ("qwen3-8b-r1", [nodes[0]], 1, 1), ("qwen3-8b-r2", [nodes[1]], 1, 1)]
    # the server that ran before: stopped first, relaunched last, as it was
    assert fake.stopped[0] == "keep" and fake.launched[-1] == ("keep", [nodes[1]], 1, 1)
    assert [s["name"] for s in fake.running] == ["keep"] and fake.persisted == ["keep"]
    assert fake.running[0]["port"] == 30001
    assert {tuple(c.concurrency) for c in fake.configs} == {(1, 4), (1, 2)}
    assert {(tuple(c.tg), tuple(c.pp), tuple(c.depth)) for c in fake.configs} == {((16,), (64,), (0,))}
    by = {a.layout.label: a.measured for a in advice.layouts}
    assert (by["tp2"].tg_c1, by["tp2"].tg_aggregate) == (20.0, 80.0)
    assert (by["replicas x2"].tg_c1, by["replicas x2"].tg_aggregate) == (10.0, 40.0)
    assert advice.pick is not None and advice.pick.layout.label == "tp2" and advice.measured
    assert advice.to_json()["layouts"][1]["measured"]["tg_aggregate"] == 80.0
    assert "restored: keep run again" in advice.notes[-1]
    assert "measured / predicted: single" in advice.notes[-2]


def test_a_layout_that_fails_is_reported_and_the_others_measured(cluster: Any) -> None:
    recipe = load_recipe("qwen3-8b")
    fake = cluster([], fail="launch of qwen3-8b failed: spark-b: NCCL timeout")
    advice = advise(recipe, engine_of(recipe), 2)
    notes: list[str] = []
    assert advise_measure.measure(advice, OPTS, notes.append) == 0
    by = {a.layout.label: a.measured for a in advice.layouts}
    assert by["tp2"] is not None and "NCCL timeout" in str(by["tp2"].error)
    assert by["single"] is not None and by["single"].error is None
    assert advice.pick is not None and advice.pick.layout.label != "tp2"
    assert any("tp2: launch of qwen3-8b failed" in n for n in notes)
    assert fake.running == [] and "nothing ran before" in advice.notes[-1]


def test_it_never_changes_the_cluster_unattended_without_yes(cluster: Any, monkeypatch: Any) -> None:
    recipe = load_recipe("qwen3-8b")
    fake = cluster([])
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    with pytest.raises(InputError, match="pass --yes"):
        advise_measure.measure(advise(recipe, engine_of(recipe), 2), {**OPTS, "yes": False},
                               lambda line: None)
    assert fake.launched == []


def test_more_nodes_than_the_inventory_has_is_bad_input(cluster: Any) -> None:
    recipe = load_recipe("qwen3-8b")
    cluster([])
    with pytest.raises(InputError, match="--nodes 5"):
        advise_measure.measure(advise(recipe, engine_of(recipe), 5), OPTS, lambda line: None)


def test_the_text_shows_predicted_beside_measured_and_a_failed_layout(cluster: Any) -> None:
    from orchestrator.advise.render import lines

    recipe = load_recipe("qwen3-8b")
    cluster([], fail="launch of qwen3-8b failed: spark-b: NCCL timeout")
    advice = advise(recipe, engine_of(recipe), 2, "throughput", 2)
    advise_measure.measure(advice, OPTS, lambda line: None)
    text = "\n".join(lines(advice))
    assert "pred c2" in text and "meas c1" in text and "meas c2" in text
    single = next(line for line in text.splitlines() if line.startswith("single"))
    assert single.split()[-2:] == ["10.0", "20.0"]  # measured c1, c2 after the predictions
    assert "launch of qwen3-8b failed" in next(line for line in text.splitlines()
                                                 if line.startswith("tp2"))
    assert "measured aggregate tg at 2 requests" in text


def test_ctrl_c_keeps_what_was_measured_stops_and_restores(cluster: Any, monkeypatch: Any) -> None:
    recipe = load_recipe("qwen3-8b")
    fake = cluster([{"name": "keep", "recipe": "qwen3-8b", "nodes": ["spark-b"], "port": 30000}])
    bench = fake.bench

    def interrupted(inventory: Any, server: str, config: Any, note: Any) -> dict[str, Any]:
        if any(s.get("tp") == 2 for s in fake.running):
            raise KeyboardInterrupt
        return bench(inventory, server, config, note)

    monkeypatch.setattr(advise_measure, "_bench", interrupted)
    advice = advise(recipe, engine_of(recipe), 2)
    assert advise_measure.measure(advice, OPTS, lambda line: None) == 130
    by = {a.layout.label: a.measured for a in advice.layouts}
    assert by["single"] is not None and by["single"].tg_c1 == 10.0
    assert by["tp2"] is not None and by["tp2"].error == "interrupted" and by["pp2"] is None
    assert [s["name"] for s in fake.running] == ["keep"] and "interrupted" in advice.notes[-1]


def test_servers_elsewhere_keep_running_and_requests_are_dealt_evenly(cluster: Any) -> None:
    recipe = load_recipe("qwen3-8b")
    fake = cluster([{"name": "other", "recipe": "qwen3-8b", "nodes": ["spark-z"], "port": 30000}])
    advice = advise(recipe, engine_of(recipe), 2, "throughput", 3)
    assert advise_measure.measure(advice, OPTS, lambda line: None) == 0
    assert "other" not in fake.stopped and [s["name"] for s in fake.running] == ["other"]
    assert not any(name == "other" for name, *_ in fake.launched)
    # 3 requests over 2 replicas: 2 and 1; the aggregate is their sum (20 + 10)
    by = {a.layout.label: a.measured for a in advice.layouts}
    assert by["replicas x2"] is not None and by["replicas x2"].tg_aggregate == 30.0
    assert {tuple(c.concurrency) for c in fake.configs} >= {(1, 2), (1,), (1, 3)}


def test_each_launch_of_advise_measure_runs_launchs_own_plan_with_every_check(
        monkeypatch: pytest.MonkeyPatch, inventory: Callable[..., Any]) -> None:
    """Issue 39: `advise --measure` launched with the engine's phases alone (no token, port or
    model-image check, no default placement); it runs cli/launch_plan.py's plan now, the one
    `sparkctl launch` runs."""
    import contextlib

    from orchestrator.cli.launch_plan import launch_plan
    from orchestrator.core.report import Report
    from orchestrator.recipe import LaunchOptions

    inv = inventory()
    ran: list[Any] = []

    class Session:
        transports = {n.name: object() for n in inv.nodes}
        unreachable: list[str] = []
        report = Report("launch")

    class Lock:
        def __init__(self, *args: Any) -> None:
            pass

        def release(self) -> None:
            pass

    monkeypatch.setattr("orchestrator.core.session.open_session",
                        lambda *args, **kwargs: contextlib.nullcontext(Session()))
    monkeypatch.setattr("orchestrator.core.session.run_plan",
                        lambda session, plan, options, lock: ran.append((plan, options)))
    monkeypatch.setattr("orchestrator.core.lock.ClusterLock", Lock)
    recipe = load_recipe("minimax-m2.7")
    # the default nodes named: launched as without --nodes (the same server, no replacement)
    placed = recipe.model_copy(update={"placement": [n.name for n in inv.ordered_nodes()[:2]]})
    advise_measure._launch(inv, placed, "m-r1", 60.0, None, lambda line: None)
    (plan, options), = ran
    names = [p.name for p in plan.phases]
    for check in ("port-check", "model-image", "hf-token"):
        assert check in names, names
    assert names.index("port-check") < names.index("model-image") < names.index("hf-token")
    expected = launch_plan(recipe, inv, LaunchOptions(replace=True, timeout=60.0, name="m-r1"))
    assert names == [p.name for p in expected.phases]
    assert options.command == "launch" and options.hf_token is None


def test_a_ctrl_c_inside_a_launch_exits_130_and_measures_no_more(cluster: Any,
                                                                monkeypatch: Any) -> None:
    # issue 41: a Ctrl-C during a layout's launch came back as the plan's Interrupted (a
    # SparkctlError): counted as a failed layout, the next ones measured, exit 1
    from orchestrator.core.executor import Interrupted

    recipe = load_recipe("qwen3-8b")
    fake = cluster([])
    launch = fake.launch

    def interrupted(*args: Any, **kwargs: Any) -> None:
        if args[1].tp_size == 2:
            raise Interrupted("interrupted by the user; changes made: none")
        launch(*args, **kwargs)

    monkeypatch.setattr(advise_measure, "_launch", interrupted)
    advice = advise(recipe, engine_of(recipe), 2)
    assert advise_measure.measure(advice, OPTS, lambda line: None) == 130
    by = {a.layout.label: a.measured for a in advice.layouts}
    assert by["tp2"] is not None and by["tp2"].error == "interrupted" and by["pp2"] is None


def test_what_ran_comes_back_from_its_recipe_file_bound_and_keyed_as_it_was(
        cluster: Any, tmp_path: Any) -> None:
    # issue 41: a server launched from a recipe file came back from the built-in recipe, on
    # loopback and without its key
    from orchestrator.commands import Secret

    file = tmp_path / "mine.yml"
    recipe = load_recipe("qwen3-8b")
    file.write_text(Path(recipe.source).read_text())
    fake = cluster([{"name": "mine", "recipe": "qwen3-8b", "recipe_file": str(file),
                     "nodes": ["spark-a"], "port": 30001, "host": "192.168.200.12",
                     "api_key_file": "/run/k", "persistent": True}])
    fake.keys = {"mine": Secret("sk-recorded-1")}
    advice = advise(recipe, engine_of(recipe), 2)
    advise_measure.measure(advice, OPTS, lambda line: None)
    name, source, host, key = fake.restored_as[-1]
    assert (name, source, host) == ("mine", str(file), "192.168.200.12")
    assert key is not None and key.reveal() == "sk-recorded-1" and "mine" in fake.persisted


def test_a_record_names_the_recipe_file_a_server_was_launched_from(tmp_path: Path) -> None:
    from orchestrator.engines import recipe_origin

    built_in = load_recipe("qwen3-8b")
    file = tmp_path / "mine.yml"
    file.write_text(Path(built_in.source).read_text())
    assert recipe_origin(built_in) == {}
    assert recipe_origin(load_recipe(str(file))) == {"recipe_file": str(file.resolve())}
