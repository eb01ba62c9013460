"""What the input fuzzers share: hostile values, key paths of a document, and mutations."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

COMMON_HOSTILE = [
    "", " ", "a" * 5000, "$(touch /tmp/pwned)", "`id`", "; rm -rf /", "x\ny", "\x00", "ünïcødé",
    "🚀", "../../etc/passwd", "'\"", "--help", "-rf", "9" * 400, "\u202e",
]


def scalars(hostile: st.SearchStrategy[str], infinity: bool = False) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=infinity), hostile, st.text(max_size=40),
    )


def values(scalar: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Scalars, lists and mappings of them, a few levels deep."""
    return st.recursive(scalar, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ), max_leaves=12)


def paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path of a nested document, e.g. ('nodes', 1, 'host')."""
    out = [prefix] if prefix else []
    if isinstance(data, dict):
        for key, value in data.items():
            out += paths(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            out += paths(value, (*prefix, index))
    return out


def mutate(data: dict[str, Any], path: tuple[Any, ...], action: str, value: Any) -> dict[str, Any]:
    """A copy of `data` with the value at `path` replaced, deleted, or joined by a typo'd key."""
    out = copy.deepcopy(data)
    parent: Any = out
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if action == "delete" and isinstance(parent, dict):
        parent.pop(last, None)
    elif action == "extra" and isinstance(parent, dict):
        parent[f"{last}_typo"] = value
    else:
        parent[last] = value
    return out
