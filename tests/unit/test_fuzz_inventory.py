"""Bad input never crashes: random and hostile inventories end in exit 2 with a message.

Hypothesis builds inventories from the valid one by mutation (wrong types, missing keys, odd
unicode, huge values, shell metacharacters) and from raw text (YAML anchors, duplicate keys,
garbage); every one must load or raise InputError naming the file: never a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from fuzzkit import COMMON_HOSTILE, mutate, paths, scalars, values
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import InputError
from orchestrator.inventory_checks import inventory_from_data, load_inventory

VALID: dict[str, Any] = {
    "cluster": {"name": "two-sparks", "user": "nvidia", "ssh_key": "/k"},
    "fabric": {"interfaces": ["enp1s0f1np1", "enP2p1s0f1np1"], "mtu": 9000},
    "container": {"image": "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12", "name": "trtllm-multinode"},
    "nodes": [
        {"name": "spark-a", "host": "10.0.0.1",
         "addresses": {"enp1s0f1np1": "192.168.200.12/24", "enP2p1s0f1np1": "192.168.201.12/24"}},
        {"name": "spark-b", "host": "10.0.0.2"},
    ],
}

HOSTILE_STRINGS = st.sampled_from([
    *COMMON_HOSTILE, "192.168.200.12/33", "::1/128", "0.0.0.0/0", "spark-a", "enp1s0f1np1",
])
SCALARS = scalars(HOSTILE_STRINGS)
VALUES = values(SCALARS)


ALL_PATHS = paths(VALID)


def assert_clean(data: Any, source: str = "fuzz.yml") -> None:
    try:
        inventory_from_data(data, source) if isinstance(data, dict) else None
    except InputError as exc:
        assert exc.exit_code == 2
        assert source in str(exc)
        assert "Traceback" not in str(exc)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.sampled_from(ALL_PATHS), st.sampled_from(["replace", "delete", "extra"]), VALUES)
def test_mutated_inventories_fail_cleanly(tally: Any, path: tuple[Any, ...], action: str,
                                          value: Any) -> None:
    tally.add("inputs fuzzed")
    assert_clean(mutate(VALID, path, action, value))


YAML_TEXTS = st.one_of(
    st.text(max_size=300),
    st.builds(lambda k: f"cluster: {{name: a}}\n{k}: 1\n{k}: 2\n", st.sampled_from(["nodes", "fabric"])),
    st.builds(lambda n: "x: &a [" + ", ".join(["1"] * 9) + "]\n" + "".join(
        f"y{i}: &y{i} [{', '.join(['*a' if i == 0 else f'*y{i-1}'] * 9)}]\n" for i in range(n)
    ), st.integers(min_value=1, max_value=8)),
    st.builds(lambda s: yaml.safe_dump(VALID).replace("spark-b", s), HOSTILE_STRINGS),
    st.just("a: &a [*a]\n"), st.just("!!python/object/apply:os.system ['id']\n"),
    st.just("cluster: !!binary aGVsbG8=\n"), st.just("? [1, 2]\n: x\n"),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(YAML_TEXTS)
def test_raw_yaml_fails_cleanly(tmp_path: Path, tally: Any, text: str) -> None:
    tally.add("inputs fuzzed")
    path = tmp_path / "fuzz.yml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass") if "\ud800" not in text else None
    if not path.exists():
        return
    try:
        load_inventory(path)
    except InputError as exc:
        assert exc.exit_code == 2
        assert str(path) in str(exc) or "fuzz.yml" in str(exc)
