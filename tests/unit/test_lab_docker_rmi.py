"""The lab docker shim's `docker rmi` really removes (it used to be a silent no-op): a pulled image
is gone afterwards, an unknown one is "No such image", and one a container was made from is refused
unless forced (never while that container runs), in dockerd's words."""

from __future__ import annotations

import io
from typing import Any

import pytest

IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc13"


@pytest.fixture
def shim(docker_shim: Any) -> Any:
    state, manage = docker_shim("manage")
    state.pull(IMAGE, io.StringIO())
    return state, manage


def test_rmi_removes_the_image(shim: Any, capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    state, manage = shim
    image_id = state.image_record(IMAGE)["Id"]
    monkeypatch.setattr(manage, "all_containers", list)
    assert manage.cmd_rmi([IMAGE]) == 0
    assert state.image_record(IMAGE) is None
    out = capsys.readouterr().out
    assert f"Untagged: {IMAGE}" in out and f"Deleted: {image_id}" in out
    assert manage.cmd_rmi([IMAGE]) == 1
    assert f"No such image: {IMAGE}" in capsys.readouterr().err




@pytest.mark.parametrize(("running", "force", "removed"), [
    (False, False, False), (False, True, True), (True, True, False)])
def test_rmi_of_an_image_in_use(shim: Any, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch, running: bool, force: bool,
                                removed: bool) -> None:
    state, manage = shim
    image_id = state.image_record(IMAGE)["Id"]
    users = [{"Id": "c" * 64, "Image": image_id, "State": {"Running": running}}]
    monkeypatch.setattr(manage, "all_containers", lambda: users)
    code = manage.cmd_rmi(["-f", IMAGE] if force else [IMAGE])
    assert (code == 0) is removed and (state.image_record(IMAGE) is None) is removed
    if not removed:
        err = capsys.readouterr().err
        assert "conflict: unable to remove repository reference" in err and "cccccccccccc" in err
