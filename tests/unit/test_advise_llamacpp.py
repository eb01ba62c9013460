"""`sparkctl advise` with llama.cpp: its layouts (single, the RPC layer split, replicas) and the
recipe of each, its slots capping the batch a server decodes at once, and `--memory-bandwidth
measure` (orchestrator/node/membw.py run for real, through a fake transport)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from orchestrator.advise.advice import advise
from orchestrator.cli import cli
from orchestrator.engines import engine_of, load_recipe
from orchestrator.engines.layouts import Layout, support_of
from orchestrator.node import script


def test_llamacpp_offers_single_the_rpc_split_and_replicas() -> None:
    recipe = load_recipe("lab-tiny-llama-rpc")
    support = support_of(engine_of(recipe))
    assert support is not None
    advice = advise(recipe, engine_of(recipe), 2)
    assert [a.layout.label for a in advice.layouts] == ["single", "pp2", "replicas x2"]
    assert advice.facts.layers == 8 and all(a.fits for a in advice.layouts)
    split = support.recipe_for(recipe, Layout("pp", pp=2), ["spark-a", "spark-b"])
    assert split.node_count == 2 and split.placement == ["spark-a", "spark-b"]
    one = support.recipe_for(recipe, Layout("single"), ["spark-b"])
    assert one.node_count == 1 and one.placement == ["spark-b"]


def test_a_server_decodes_at_most_its_slots_at_once() -> None:
    recipe = load_recipe("lab-tiny-llama-rpc")  # parallel: 1 (-np 1)
    advice = advise(recipe, engine_of(recipe), 2, goal="throughput", concurrency=4)
    single, _split, replicas = advice.layouts
    # four requests on one slot: one at a time, the aggregate is one request's speed
    assert single.predicted.tg_aggregate == pytest.approx(single.predicted.tg_c1)
    assert replicas.predicted.tg_aggregate == pytest.approx(2 * single.predicted.tg_c1)
    assert "1 at a time (1 slot(s) per server)" in "\n".join(single.predicted.lines)
    assert advice.pick is replicas
    wider = recipe.model_copy(update={"parallel": 4})
    more = advise(wider, engine_of(wider), 2, goal="throughput", concurrency=4)
    assert more.layouts[0].predicted.tg_aggregate > 2 * more.layouts[0].predicted.tg_c1


class LocalTransport:
    """Runs the command here (the node script is the real one, on this machine's python3)."""

    def run(self, command: str, *, stdin: str | None = None, timeout: float | None = None,
            **_: Any) -> Any:
        done = subprocess.run(command.replace("python3", sys.executable, 1), shell=True,
                              input=stdin, capture_output=True, text=True, timeout=timeout)
        return SimpleNamespace(exit_status=done.returncode, stdout=done.stdout, stderr=done.stderr)


@pytest.fixture
def first_node(monkeypatch: pytest.MonkeyPatch, inventory: Callable[..., Any]) -> Any:
    inv = inventory()

    @contextlib.contextmanager
    def session(inventory: Any, command: str, quiet: bool = False) -> Iterator[Any]:
        yield SimpleNamespace(transports={inv.ordered_nodes()[0].name: LocalTransport()})

    monkeypatch.setattr("orchestrator.core.runner.load_inventory_option", lambda option: (inv, "i.yml"))
    monkeypatch.setattr("orchestrator.core.session.open_session", session)
    return inv


def test_memory_bandwidth_measure_times_a_copy_on_the_first_node(first_node: Any) -> None:
    result = CliRunner().invoke(cli, ["advise", "lab-tiny-llama-rpc", "--memory-bandwidth",
                                      "measure", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    node = first_node.ordered_nodes()[0].name
    assert doc["hardware"]["bandwidth_gbs"] > 0 and doc["hardware"]["bandwidth_gbs"] != 273.0
    assert f"(measured on {node}: one core copying 64 MB)" in doc["hardware"]["sources"][0]
    text = CliRunner().invoke(cli, ["advise", "lab-tiny-llama-rpc", "--explain"]).output
    assert "/ 273 GB/s" in text  # without it: the Spark's


def test_the_copy_script_reports_bytes_read_and_written_per_second() -> None:
    done = subprocess.run([sys.executable, "-", json.dumps({"mb": 8, "rounds": 2})],
                          input=script("membw.py"), capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)["gbs"] > 0 and json.loads(done.stdout)["mb"] == 8


@pytest.mark.parametrize("value", ["fast", "0", "-3", "inf", "nan", "1e999"])
def test_a_bad_memory_bandwidth_is_bad_input(value: str) -> None:
    result = CliRunner().invoke(cli, ["advise", "lab-tiny-llama-rpc", "--memory-bandwidth", value])
    assert result.exit_code == 2 and "give GB/s (a number from 1 to 100,000) or `measure`" in result.output
