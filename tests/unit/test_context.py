"""The typed run context: named fields, and the former dict keys for engine folders not yet
moved to them."""

from __future__ import annotations

from orchestrator.commands import Secret
from orchestrator.core.context import RunOptions, RunState


def test_options_say_notes_only_with_somewhere_to_say_them() -> None:
    said: list[str] = []
    RunOptions().note("nobody hears this")
    RunOptions(progress_note=said.append).note("pulling")
    assert said == ["pulling"]


def test_options_read_under_their_former_keys_are_a_copy() -> None:
    options = RunOptions(command="launch", verify=True, hf_token=Secret("hf_x"))
    values = options.values
    assert values["verify"] is True and values["command"] == "launch"
    assert str(values["hf_token"]) == "***" and values.get("progress_note") is None
    values["verify"] = False
    assert options.verify is True


def test_state_keys_reach_the_fields_and_others_are_an_engines_own() -> None:
    state = RunState()
    state.setdefault("notes", []).append("a note")
    state["image_facts"] = {"spark-a": {"Id": "sha256:1"}}
    assert state.notes == ["a note"] and state.get("image_facts") == {"spark-a": {"Id": "sha256:1"}}
    assert "mpi" not in state and state.get("mpi") is None
    state.setdefault("mpi", {})["spark-a"] = {"major": 5}
    state["ray_head_started"] = "t0"
    assert state.engine == {"mpi": {"spark-a": {"major": 5}}, "ray_head_started": "t0"}
    assert state["mpi"] == {"spark-a": {"major": 5}} and "mpi" in state and "notes" in state
    assert state.get("changed_steps") == [] and state["cluster_public_key"] is None
