"""The lab docker shim's `docker save` / `docker load` (lab/sparklab/node_tools), in-process with
its state under a temporary directory: a round trip registers the same image ID and digest, an
altered or cut stream is refused, and a blocked registry fails `docker pull` only."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12"


@pytest.fixture
def shim(docker_shim: Any) -> Any:
    state, image = docker_shim("image")
    return state, image


class Stdout(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.buffer = io.BytesIO()


def save(shim: Any, monkeypatch: pytest.MonkeyPatch, pull: bool = True) -> bytes:
    state, image = shim
    if pull:
        state.pull(IMAGE, io.StringIO())
    out = Stdout()
    monkeypatch.setattr(sys, "stdout", out)
    assert image.cmd_save([IMAGE]) == 0
    monkeypatch.setattr(sys, "stdout", sys.__stdout__)
    return out.buffer.getvalue()


def load(shim: Any, monkeypatch: pytest.MonkeyPatch, data: bytes) -> int:
    _, image = shim
    stdin = io.StringIO()
    stdin.buffer = io.BytesIO(data)  # type: ignore[misc]
    monkeypatch.setattr(sys, "stdin", stdin)
    return int(image.cmd_load(["-q"]))


def test_save_then_load_registers_the_same_id_and_no_registry_digest(
        shim: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state, _ = shim
    stream = save(shim, monkeypatch)
    before = state.image_record(IMAGE)
    (tmp_path / "images" / (IMAGE.replace("/", "+") + ".json")).unlink()
    assert state.image_record(IMAGE) is None
    assert load(shim, monkeypatch, stream) == 0
    after = state.image_record(IMAGE)
    # as Docker's classic image store: the ID is the content's, the registry digest is lost
    assert after["Id"] == before["Id"] and before["RepoDigests"] and after["RepoDigests"] == []
    again = save(shim, monkeypatch, pull=False)  # a loaded image is saved for a third node
    (tmp_path / "images" / (IMAGE.replace("/", "+") + ".json")).unlink()
    assert load(shim, monkeypatch, again) == 0
    assert state.image_record(IMAGE)["Id"] == before["Id"]
    saved = json.loads((tmp_path / "images" / (IMAGE.replace("/", "+") + ".json")).read_text())
    assert saved["loaded"] is True and saved["id"] == before["Id"]


def test_an_altered_or_cut_stream_is_refused(shim: Any, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    state, _ = shim
    stream = save(shim, monkeypatch)
    (tmp_path / "images" / (IMAGE.replace("/", "+") + ".json")).unlink()
    flipped = bytearray(stream)
    at = stream.index(b"sparklab_engine")  # inside the layer's content
    flipped[at] ^= 1
    with pytest.raises(state.DockerError, match="invalid digest"):
        load(shim, monkeypatch, bytes(flipped))
    with pytest.raises(state.DockerError, match=r"unexpected EOF|not a docker save"):
        load(shim, monkeypatch, stream[: len(stream) // 2])
    assert state.image_record(IMAGE) is None


def test_a_blocked_registry_fails_the_pull(shim: Any, tmp_path: Path) -> None:
    state, _ = shim
    (tmp_path / "faults").mkdir()
    (tmp_path / "faults" / "block-registry").touch()
    with pytest.raises(state.DockerError, match=r"lookup nvcr\.io: no such host"):
        state.pull(IMAGE, io.StringIO())
