"""The typed run context: named fields, and the former dict keys for engine folders not yet
moved to them."""

from __future__ import annotations

from orchestrator.core.context import RunOptions


def test_options_say_notes_only_with_somewhere_to_say_them() -> None:
    said: list[str] = []
    RunOptions().note("nobody hears this")
    RunOptions(progress_note=said.append).note("pulling")
    assert said == ["pulling"]
