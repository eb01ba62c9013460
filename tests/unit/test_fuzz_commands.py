"""The commands themselves never crash on bad input: mutated recipes, inventories and saved bench
results through `launch --dry-run`, `plan` and `bench compare`, in process (click's runner).

Every input either gets as far as connecting to the cluster (the session is replaced by a
marker: the input was accepted and everything derived from it before any node is touched was
derived without an exception) or ends in exit 2 with `sparkctl: ...` naming what is wrong:
never a traceback, never another exit code. The size is seeded and CI-affordable; a long run
(`SPARKCTL_FUZZ_EXAMPLES=2000` gives 5 x 2,000 inputs) is how the hostile pass measured it.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from fuzzkit import COMMON_HOSTILE, mutate, paths, scalars, values
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from orchestrator.cli import cli
from orchestrator.engines import recipe_files

EXAMPLES = int(os.environ.get("SPARKCTL_FUZZ_EXAMPLES", "60"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])
RECIPES = {name: yaml.safe_load(recipe_files()[name].read_text())
           for name in ("qwen3-235b", "qwen3-8b", "lab-tiny-llama", "gpt-oss-120b-vllm")}
INVENTORY: dict[str, Any] = {
    "cluster": {"name": "fuzz", "user": "nvidia", "ssh_key": "KEY"},
    "fabric": {"interfaces": ["enp1s0f1np1", "enP2p1s0f1np1"], "mtu": 9000},
    "nodes": [{"name": "spark-a", "host": "127.0.0.1",
               "addresses": {"enp1s0f1np1": "192.168.200.12/24"}},
              {"name": "spark-b", "host": "127.0.0.2"}],
}
FIGURE = {"mean": 12.5, "std": 0.5, "p50": 12.5, "p90": 13.0, "p99": 13.0, "values": [12.5]}
CELL = {"depth": 0, "pp": 512, "tg": 128, "concurrency": 1, "runs": 1,
        "figures": {"tg_throughput": FIGURE, "tg_req_throughput": FIGURE,
                    "pp_throughput": FIGURE, "peak_throughput": FIGURE, "ttft_ms": FIGURE,
                    "error_count": 0, "errors": []},
        "spec_decoding": {"draft_tokens": 10, "accepted_tokens": 6, "drafts": 5},
        "spec_note": None, "nodes": {"spark-a": {"power_w": 30.0}}}
SAVED: dict[str, Any] = {
    "schema": "sparkctl-bench/1", "interrupted": False, "started": "2026-11-28T01:00:00+0000",
    "settings": {"tg": [128], "pp": [512], "depth": [0], "concurrency": [1, 4], "runs": 1,
                 "warmup": True},
    "server": {"model": "m", "recipe": "r", "engine": "e", "config_hash": "abc"},
    "latency_ms": 1.5, "nodes_before": {"spark-a": {"power_w": 20.0}},
    "cells": [CELL, {**CELL, "concurrency": 4, "spec_decoding": {"acceptance_rate": 0.5}}],
}
HOSTILE = st.sampled_from([*COMMON_HOSTILE, "127.0.0.1", "0.0.0.0", "spark-a", "nan", "1e999",
                           "-1", "[]", "{}", "qwen3-8b", "sglang", "llamacpp"])
VALUES = values(scalars(HOSTILE, infinity=True))
ACTIONS = st.sampled_from(["replace", "delete", "extra"])


class Reached(BaseException):
    """The command got past every input check to the cluster (not an Exception: nothing in
    sparkctl catches it on the way out)."""


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from orchestrator.core import runner, session

    def no_cluster(*args: Any, **kwargs: Any) -> Any:
        raise Reached

    monkeypatch.setattr(session, "open_session", no_cluster)
    monkeypatch.setattr(runner, "open_session", no_cluster)
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("SPARKCTL_INVENTORY", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    (tmp_path / "key").write_text("not a key\n")
    (tmp_path / "key").chmod(0o600)
    return tmp_path


def dump(folder: Path, name: str, data: Any, as_json: bool = False) -> Path | None:
    """The document as a file a user could write, or None when no file can hold it."""
    try:
        text = (json.dumps(data, allow_nan=True) if as_json
                else yaml.safe_dump(data, allow_unicode=True))
        path = folder / name
        path.write_text(text, encoding="utf-8")
    except (yaml.YAMLError, UnicodeEncodeError, ValueError, TypeError, RecursionError):
        return None
    return path


def inventory_data(world: Path) -> dict[str, Any]:
    data = copy.deepcopy(INVENTORY)
    data["cluster"]["ssh_key"] = str(world / "key")
    return data


def run(world: Path, tally: Any, *args: str) -> None:
    """One command: accepted (reached the cluster, or done) or exit 2 with a message; nothing else."""
    tally.add("inputs fuzzed")
    try:
        result = CliRunner().invoke(cli, list(args), catch_exceptions=True)
    except Reached:
        return
    if isinstance(result.exception, Reached):
        return
    text = result.output
    if result.exit_code == 0 and result.exception is None:
        return  # accepted by a command that needs no cluster (bench compare)
    assert result.exit_code == 2, f"exit {result.exit_code} for {args}:\n{text}\n{result.exception!r}"
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in text and ("sparkctl:" in text or "Error:" in text), text


def mutated(base: dict[str, Any], data: st.DataObject, times: int = 1) -> dict[str, Any]:
    doc = base
    for _ in range(times):
        where = paths(doc)
        if not where:
            break
        try:
            doc = mutate(doc, data.draw(st.sampled_from(where)), data.draw(ACTIONS),
                         data.draw(VALUES))
        except (KeyError, IndexError, TypeError):
            continue
    return doc


@seed(41)
@SETTINGS
@given(st.sampled_from(sorted(RECIPES)), st.integers(1, 3), st.data())
def test_launch_dry_run_with_mutated_recipes(world: Path, tally: Any, recipe: str, times: int,
                                             data: st.DataObject) -> None:
    file = dump(world, "recipe.yml", mutated(RECIPES[recipe], data, times))
    inventory = dump(world, "inventory.yml", inventory_data(world))
    if file is None or inventory is None:
        return
    run(world, tally, "launch", str(file), "--inventory", str(inventory), "--dry-run")


@seed(41)
@SETTINGS
@given(st.integers(1, 3), st.data())
def test_plan_with_mutated_inventories(world: Path, tally: Any, times: int,
                                       data: st.DataObject) -> None:
    inventory = dump(world, "inventory.yml", mutated(inventory_data(world), data, times))
    if inventory is not None:
        run(world, tally, "plan", "--inventory", str(inventory))


@seed(41)
@SETTINGS
@given(st.sampled_from(sorted(RECIPES)), st.data())
def test_launch_dry_run_with_mutated_inventories(world: Path, tally: Any, recipe: str,
                                                 data: st.DataObject) -> None:
    inventory = dump(world, "inventory.yml", mutated(inventory_data(world), data))
    if inventory is not None:
        run(world, tally, "launch", recipe, "--inventory", str(inventory), "--dry-run")


@seed(41)
@SETTINGS
@given(st.integers(1, 3), st.booleans(), st.data())
def test_bench_compare_with_mutated_saved_runs(world: Path, tally: Any, times: int,
                                               as_json: bool, data: st.DataObject) -> None:
    first = dump(world, "a.json", mutated(SAVED, data, times), as_json=True)
    second = dump(world, "b.json", SAVED, as_json=True)
    if first is None or second is None:
        return
    files = [str(first), str(second)] if data.draw(st.booleans()) else [str(second), str(first)]
    run(world, tally, "bench", "compare", *files, *(["--json"] if as_json else []))


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@seed(41)
@SETTINGS
@given(st.one_of(
    st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.integers(1, 200_000).map(nested),
    st.builds(lambda cut: json.dumps(SAVED)[:cut], st.integers(0, len(json.dumps(SAVED)))),
    st.just('{"cells": [{"depth": 0}]}'), st.just('{"sweep": {"runs": 1}}'),
    st.just('{"cells": "x"}'), st.just('{"cells": [], "settings": {"pp": "x"}}'),
    st.just('{"cells": [' + json.dumps(CELL).replace("12.5", "NaN") + "]}"),
))
def test_bench_compare_with_raw_text(world: Path, tally: Any, text: str) -> None:
    path = world / "raw.json"
    path.write_text(text, encoding="utf-8", errors="replace")
    good = dump(world, "good.json", SAVED, as_json=True)
    assert good is not None
    run(world, tally, "bench", "compare", str(good), str(path))


@pytest.mark.parametrize(("raw", "said"), [
    (b'{"error": {"message": "max_tokens is too large", "code": 400}}', "max_tokens is too large"),
    (b'{"detail": "Not Found"}', "Not Found"),
    (b"plain \xff words", "plain \ufffd words"),
    (b"", "(empty answer)"),
])
def test_an_http_error_is_told_as_text_never_a_bytes_repr(raw: bytes, said: str) -> None:
    # issue 41: `chat` printed b'{"error": ...}' for a 400
    from orchestrator.core.output import http_error_text

    assert http_error_text(raw) == said
