"""The lab docker shim removes a `docker run --rm` container itself once it exits, as dockerd
does, attached or detached: a short-lived model container whose client was killed under load used
to stay behind (only the client removed an attached one). An attached client still gets the exit
code first."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def shim(docker_shim: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    import importlib

    (state,) = docker_shim()
    monkeypatch.setattr(state, "CONTAINERS", str(tmp_path / "containers"))
    return importlib.import_module("sparklab_dockerd_run")


def exited_container(tmp_path: Path, cid: str, *, auto_remove: bool, attached: bool) -> Path:
    d = tmp_path / "containers" / cid
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({
        "Id": cid, "HostConfig": {"AutoRemove": auto_remove},
        "sparklab": {"attached": attached}}))
    (d / "state.json").write_text(json.dumps({"Status": "exited", "ExitCode": 3}))
    return d


def test_a_detached_rm_container_goes_at_once(shim: Any, tmp_path: Path) -> None:
    d = exited_container(tmp_path, "a" * 64, auto_remove=True, attached=False)
    shim.reap("a" * 64, wait_for_client=30)
    assert not d.exists()


def test_without_rm_the_container_stays(shim: Any, tmp_path: Path) -> None:
    d = exited_container(tmp_path, "b" * 64, auto_remove=False, attached=True)
    shim.reap("b" * 64, wait_for_client=0)
    assert d.exists()


def test_an_attached_client_that_is_gone_does_not_keep_it(shim: Any, tmp_path: Path) -> None:
    d = exited_container(tmp_path, "c" * 64, auto_remove=True, attached=True)
    started = time.monotonic()
    shim.reap("c" * 64, wait_for_client=0.3)
    assert not d.exists()
    assert time.monotonic() - started >= 0.3


def test_an_attached_client_collects_the_exit_code_first(shim: Any, tmp_path: Path) -> None:
    d = exited_container(tmp_path, "d" * 64, auto_remove=True, attached=True)
    seen: list[int] = []

    def client() -> None:
        time.sleep(0.2)
        seen.append(json.loads((d / "state.json").read_text())["ExitCode"])
        (d / shim.COLLECTED).write_text("")

    thread = threading.Thread(target=client)
    thread.start()
    shim.reap("d" * 64, wait_for_client=30)
    thread.join()
    assert seen == [3]
    assert not d.exists()
