"""The lab hub's repos (the GGUF and the HF-format tiny llama) are written through one
publish_repo: written when missing or stale, left alone when their inputs' digest matches, and
never half-written (an interrupted write keeps the old repo and leaves no staging folder)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sparklab.gguf_model import publish_repo


def writer(calls: list[str], text: str) -> Callable[[Path], None]:
    def write(staging: Path) -> None:
        calls.append(text)
        (staging / "weights").write_text(text)
    return write


def test_written_once_then_left_alone_then_rewritten_when_stale(tmp_path: Path) -> None:
    target, calls = tmp_path / "hub" / "org" / "repo", list[str]()
    publish_repo(target, "d1", writer(calls, "one"))
    publish_repo(target, "d1", writer(calls, "again"))
    assert calls == ["one"] and (target / "weights").read_text() == "one"
    publish_repo(target, "d2", writer(calls, "two"))
    assert calls == ["one", "two"] and (target / "weights").read_text() == "two"
    assert (target / ".sparklab-inputs").read_text() == "d2\n"


def test_an_interrupted_write_keeps_the_old_repo(tmp_path: Path) -> None:
    target = tmp_path / "org" / "repo"
    publish_repo(target, "d1", writer([], "one"))

    def broken(staging: Path) -> None:
        (staging / "weights").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        publish_repo(target, "d2", broken)
    assert (target / "weights").read_text() == "one"
    assert sorted(p.name for p in target.parent.iterdir()) == ["repo"]
