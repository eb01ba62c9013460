"""Bad recipes never crash: random and hostile recipe files end in exit 2 with a message.

Hypothesis mutates the built-in qwen3-235b recipe (wrong types, missing keys, extra keys, odd
unicode, huge values, shell metacharacters) and writes raw YAML text (anchors, bombs, duplicate
keys, tags, garbage). Every file must either load, and then render everything launch derives
from it (LLM API config, serve argv, memory estimate, config hash) without an exception, or
raise InputError (exit 2) naming the file: never a traceback. The CLI checks run the real
`sparkctl` on a few hostile files of each kind (recipe, inventory) and read its stderr.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from fuzzkit import COMMON_HOSTILE, mutate, paths, scalars, values
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.commands import join
from orchestrator.engines import config_hash, load_recipe, recipe_files
from orchestrator.engines.trtllm.recipe import estimate_memory
from orchestrator.engines.trtllm.serve import render_llm_api_config, serve_argv
from orchestrator.errors import InputError

REPO = Path(__file__).resolve().parents[2]
VALID: dict[str, Any] = yaml.safe_load(recipe_files()["qwen3-235b"].read_text())

HOSTILE_STRINGS = st.sampled_from([
    *COMMON_HOSTILE, "$(touch /tmp/sparkctl-pwned)", "--host=0.0.0.0", "--port",
    "nvidia/Qwen3-235B-A22B-FP4", "Eagle", "nan", "1e999", "~", "*",
    "org/model; id", "org/../model", "/etc/sparkctl", "{{ 7*7 }}", "%s%n", "\ud7ff\ue000",
])
SCALARS = scalars(HOSTILE_STRINGS, infinity=True)
VALUES = values(SCALARS)


# every key of the recipe, plus the optional ones the built-in leaves out
ALL_PATHS = [*paths(VALID), ("serve_args",), ("speculative", "draft_dir"),
             ("speculative", "options"), ("speculative", "draft_revision"),
             ("memory", "runtime_gb"), ("memory", "parallel_weight_loading")]


def load_and_use(path: Path) -> bool:
    """Load like `launch` does and derive what it derives; True when the recipe was accepted."""
    try:
        recipe = load_recipe(str(path))
    except InputError as exc:
        assert exc.exit_code == 2
        assert str(path) in str(exc), str(exc)
        assert "Traceback" not in str(exc)
        return False
    config = render_llm_api_config(recipe)
    argv = serve_argv(recipe, "127.0.0.1")
    assert yaml.safe_load(config) is not None
    assert join(argv)
    config_hash(recipe, argv, config)
    estimate = estimate_memory(recipe)
    assert not math.isnan(estimate.total_gb)
    return True


def write_yaml(tmp_path: Path, data: Any) -> Path | None:
    try:
        text = yaml.safe_dump(data, allow_unicode=True)
    except (yaml.YAMLError, UnicodeEncodeError):
        return None  # not representable as a YAML file: nothing a user could write
    path = tmp_path / "fuzz-recipe.yml"
    try:
        path.write_text(text, encoding="utf-8")
    except UnicodeEncodeError:
        return None  # lone surrogates: no UTF-8 file can hold them
    return path


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.sampled_from(ALL_PATHS), st.sampled_from(["replace", "delete", "extra"]), VALUES)
def test_mutated_recipes_fail_cleanly(tmp_path: Path, tally: Any, path: tuple[Any, ...],
                                      action: str, value: Any) -> None:
    file = write_yaml(tmp_path, mutate(VALID, path, action, value))
    if file is None:
        return
    tally.add("inputs fuzzed")
    load_and_use(file)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(ALL_PATHS), VALUES), min_size=2, max_size=6))
def test_many_mutations_at_once_fail_cleanly(tmp_path: Path, tally: Any,
                                             changes: list[tuple[tuple[Any, ...], Any]]) -> None:
    data = VALID
    for path, value in changes:
        try:
            data = mutate(data, path, "replace", value)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change replaced this path's parent
    file = write_yaml(tmp_path, data)
    if file is None:
        return
    tally.add("inputs fuzzed")
    load_and_use(file)


def bomb(levels: int) -> str:
    return "name: bomb\nx: &a [" + ", ".join(["1"] * 9) + "]\n" + "".join(
        f"y{i}: &y{i} [{', '.join(['*a' if i == 0 else f'*y{i - 1}'] * 9)}]\n"
        for i in range(levels))


VALID_TEXT = recipe_files()["qwen3-235b"].read_text()
YAML_TEXTS = st.one_of(
    st.text(max_size=300),
    st.builds(lambda k: VALID_TEXT + f"{k}: 1\n", st.sampled_from(["name", "model", "memory"])),
    st.builds(bomb, st.integers(min_value=1, max_value=8)),
    st.builds(lambda s: VALID_TEXT.replace("qwen3-235b", s), HOSTILE_STRINGS.map(repr)),
    st.builds(lambda s: VALID_TEXT.replace("Qwen3-235B-A22B-FP4", s), HOSTILE_STRINGS),
    st.builds(lambda cut: VALID_TEXT[:cut], st.integers(min_value=0, max_value=len(VALID_TEXT))),
    st.just("a: &a [*a]\n"), st.just("!!python/object/apply:os.system ['id']\n"),
    st.just("name: !!binary aGVsbG8=\n"), st.just("? [1, 2]\n: x\n"), st.just("- 1\n- 2\n"),
    st.just(VALID_TEXT.replace("memory:", "memory: &m\n  weights_gb: 1\nmem2: *m\nx:")),
    st.just(VALID_TEXT + "llm_api_options: {}\n"),
    st.just("name: x\nmodel: a/b\nmemory: {weights_gb: .nan}\n"),
    st.just("name: x\nmodel: a/b\nmemory: {weights_gb: .inf}\n"),
    st.just("name: x\nmodel: a/b\nmemory: {weights_gb: 1}\ntp_size: 99999999999999999999999\n"),
    st.just("name: x\nmodel: a/b\nmemory: {weights_gb: 1}\nllm_api_options: {1: 2, null: 3}\n"),
    st.just("name: x\nmodel: a/b\nmemory: {weights_gb: 1}\nserve_args: [1, null, [2]]\n"),
    st.just("\ufeff" + VALID_TEXT), st.just(VALID_TEXT.replace("\n", "\r\n")),
)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(YAML_TEXTS)
def test_raw_recipe_yaml_fails_cleanly(tmp_path: Path, tally: Any, text: str) -> None:
    path = tmp_path / "fuzz-recipe.yml"
    try:
        path.write_text(text, encoding="utf-8")
    except UnicodeEncodeError:
        return
    tally.add("inputs fuzzed")
    load_and_use(path)


def test_bytes_that_are_not_utf8_fail_cleanly(tmp_path: Path, tally: Any) -> None:
    path = tmp_path / "latin1.yml"
    path.write_bytes(VALID_TEXT.replace("Qwen3", "Qw\xe9n3").encode("latin-1"))
    tally.add("inputs fuzzed")
    with pytest.raises(InputError, match="not UTF-8"):
        load_recipe(str(path))


def test_a_deep_alias_bomb_is_refused(tmp_path: Path, tally: Any) -> None:
    path = tmp_path / "bomb.yml"
    path.write_text(bomb(9))
    tally.add("inputs fuzzed")
    with pytest.raises(InputError, match="YAML bomb"):
        load_recipe(str(path))


# --- the real command line -------------------------------------------------------------

BAD_FILES = {
    "bomb": bomb(9),
    "duplicate-key": VALID_TEXT + "port: 9000\n",
    "wrong-type": VALID_TEXT.replace("tp_size: 2", "tp_size: [2]"),
    "list-at-top": "- name: x\n",
    "python-tag": "!!python/object/apply:os.system ['touch /tmp/sparkctl-pwned']\n",
    "garbage": "{{{: ][\n\t\x01",
    "empty": "",
}
INVENTORY_TEXT = """\
cluster: {name: fuzz, user: nvidia, ssh_key: /nonexistent/key}
fabric: {interfaces: [enp1s0f1np1, enP2p1s0f1np1], mtu: 9000}
nodes:
  - {name: spark-a, host: 127.0.0.1}
  - {name: spark-b, host: 127.0.0.2}
"""
BAD_INVENTORIES = {
    **{k: v for k, v in BAD_FILES.items() if k not in ("duplicate-key", "wrong-type")},
    "duplicate-key": INVENTORY_TEXT + "fabric: {mtu: 1500}\n",
    "wrong-type": INVENTORY_TEXT.replace("mtu: 9000", "mtu: jumbo"),
    "metachar-name": INVENTORY_TEXT.replace("spark-b", "'spark-b; touch /tmp/sparkctl-pwned'"),
}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent-home",
                               "SPARKCTL_STATE_DIR": "/nonexistent-state"})


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_recipes_show_refuses_a_bad_recipe_file(tmp_path: Path, tally: Any, kind: str) -> None:
    path = tmp_path / f"{kind}.yml"
    path.write_text(BAD_FILES[kind])
    result = run_cli("recipes", "show", str(path))
    tally.add("inputs fuzzed")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and str(path) in result.stderr, result.stderr
    assert not Path("/tmp/sparkctl-pwned").exists()


@pytest.mark.parametrize("kind", sorted(BAD_INVENTORIES))
def test_up_dry_run_refuses_a_bad_inventory_file(tmp_path: Path, tally: Any, kind: str) -> None:
    path = tmp_path / f"{kind}.yml"
    path.write_text(BAD_INVENTORIES[kind])
    result = run_cli("up", "--inventory", str(path), "--dry-run")
    tally.add("inputs fuzzed")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and str(path) in result.stderr, result.stderr
    assert not Path("/tmp/sparkctl-pwned").exists()


def test_launch_refuses_a_bad_recipe_before_connecting(tmp_path: Path, tally: Any) -> None:
    recipe = tmp_path / "bad.yml"
    recipe.write_text(BAD_FILES["wrong-type"])
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(INVENTORY_TEXT)
    result = run_cli("launch", str(recipe), "--inventory", str(inventory), "--dry-run")
    tally.add("inputs fuzzed")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "tp_size" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("value", ["e", "[1, 2]", "7"])
def test_a_kv_cache_config_that_is_not_a_mapping_is_refused(tmp_path: Path, tally: Any,
                                                             value: str) -> None:
    # found by the fuzzer: llm_api_config() called dict() on it and raised ValueError
    path = tmp_path / "kv.yml"
    path.write_text(VALID_TEXT.replace("  kv_cache_config:\n    enable_block_reuse: false",
                                       f"  kv_cache_config: {value}"))
    tally.add("inputs fuzzed")
    with pytest.raises(InputError, match="kv_cache_config must be a mapping"):
        load_recipe(str(path))
