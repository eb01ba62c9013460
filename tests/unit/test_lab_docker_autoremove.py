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


def test_a_client_that_collected_and_removed_it_ends_the_wait_at_once(shim: Any,
                                                                      tmp_path: Path) -> None:
    """The client marks COLLECTED and removes the container itself (`run --rm`): the monitor,
    which shows the client's command line in `ps`, stayed 30 s when the removal came first
    (an e2e test saw `dockerd-shim run --rm ... mpirun --version` after `down`)."""
    import shutil

    d = exited_container(tmp_path, "e" * 64, auto_remove=True, attached=True)
    threading.Timer(0.2, shutil.rmtree, args=(d,)).start()
    started = time.monotonic()
    shim.reap("e" * 64, wait_for_client=30)
    assert time.monotonic() - started < 5
    assert not d.exists()


def test_an_attached_run_waits_for_its_container_to_run_before_following_its_output(
        shim: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`docker run` in the foreground: the container's init may say "started" before the
    monitor has its process and marks it running; a client that followed the log then found no
    log (or a container not running) and returned an empty answer with exit 0 (CI, loaded
    machine: the models' manifest 'printed' nothing). It now follows once the container runs."""
    import os

    cid = "e" * 64
    d = tmp_path / "containers" / cid
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"Id": cid, "Name": "/quick", "Created": "now",
                                               "HostConfig": {"AutoRemove": False}}))
    (d / "state.json").write_text(json.dumps({"Status": "created", "Running": False}))
    monkeypatch.setattr(shim, "start_container", lambda cid, verb: 0)  # "started" at once

    def monitor() -> None:  # the monitor, a little later: running, one line, exited
        time.sleep(0.3)
        (d / "log").write_text(json.dumps({"log": '{"manifest": 1}\n', "stream": "stdout",
                                           "time": "2026-11-28T14:00:00Z"}) + "\n")
        (d / "state.json").write_text(json.dumps({"Status": "running", "Running": True,
                                                  "Pid": os.getpid(), "MonitorPid": os.getpid()}))
        time.sleep(0.3)
        (d / "state.json").write_text(json.dumps({"Status": "exited", "Running": False,
                                                  "ExitCode": 0}))

    thread = threading.Thread(target=monitor)
    thread.start()
    code = shim.run_attached(cid, remove=False)
    thread.join()
    assert code == 0 and capsys.readouterr().out == '{"manifest": 1}\n'
