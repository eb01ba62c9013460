"""core/lock.py: taking, judging, taking over and releasing the cluster lock on the head."""

from __future__ import annotations

import socket
import subprocess
import sys
from typing import Any

import pytest

from orchestrator.core.lock import LOCK_DIR, LOCK_STALE_SECONDS, ClusterLock, _holder_is_gone
from orchestrator.errors import LockError, TransportError


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def head(fake_transport: Any, *answers: dict[str, Any]) -> Any:
    """A head answering successive lock requests with `answers` (then held)."""
    queue = list(answers)

    def facts(request: dict[str, Any]) -> dict[str, Any]:
        return {"lock": queue.pop(0) if queue else {"held": True}}
    return fake_transport("spark-a", facts=facts)


def lock_requests(transport: Any) -> list[dict[str, Any]]:
    return [call.request["lock"] for call in transport.calls if call.command.startswith("python3 - ")]


def test_the_request_names_the_holder_and_the_stale_age(fake_transport: Any) -> None:
    lock = ClusterLock("spark-a", head(fake_transport), "up")
    request = lock.request()
    assert request["lock_stale_seconds"] == LOCK_STALE_SECONDS
    assert request["lock"]["command"] == "up" and request["lock"]["break"] is False
    assert request["lock"]["controller"] == socket.gethostname()
    assert ClusterLock("spark-a", head(fake_transport), "up", break_lock=True).request()["lock"]["break"]


def test_ensure_takes_a_free_lock_once(fake_transport: Any) -> None:
    transport = head(fake_transport)
    lock = ClusterLock("spark-a", transport, "up")
    lock.ensure()
    lock.ensure()
    assert lock.held and len(lock_requests(transport)) == 1
    assert transport.calls[0].sudo


def test_a_lock_held_elsewhere_names_its_holder(fake_transport: Any) -> None:
    holder = {"command": "launch", "user": "bob", "controller": "laptop", "pid": 42,
              "started": "2026-01-01T00:00:00+00:00"}
    transport = head(fake_transport, {"held": False, "holder": holder})
    lock = ClusterLock("spark-a", transport, "up")
    with pytest.raises(LockError) as raised:
        lock.ensure()
    message = str(raised.value)
    assert "locked by another sparkctl run: launch by bob@laptop (pid 42), since 2026-01-01" in message
    assert "--break-lock" in message and not lock.held
    assert len(lock_requests(transport)) == 1  # a holder elsewhere is not taken over


def test_a_dead_holder_on_this_controller_is_taken_over(fake_transport: Any) -> None:
    holder = {"command": "up", "user": "me", "controller": socket.gethostname(), "pid": dead_pid()}
    transport = head(fake_transport, {"held": True})
    lock = ClusterLock("spark-a", transport, "down")
    lock.accept({"held": False, "holder": holder})
    requests = lock_requests(transport)
    assert lock.held and len(requests) == 1 and requests[0]["break"] is True


def test_a_live_holder_on_this_controller_is_not_taken_over(fake_transport: Any) -> None:
    import os

    holder = {"command": "up", "user": "me", "controller": socket.gethostname(), "pid": os.getpid()}
    transport = head(fake_transport)
    with pytest.raises(LockError, match=f"pid {os.getpid()}"):
        ClusterLock("spark-a", transport, "up").accept({"held": False, "holder": holder})
    assert transport.calls == []


def test_a_takeover_that_loses_the_race_still_fails(fake_transport: Any) -> None:
    holder = {"command": "up", "controller": socket.gethostname(), "pid": dead_pid()}
    newer = {"command": "launch", "user": "eve", "controller": "other", "pid": 7}
    transport = head(fake_transport, {"held": False, "holder": newer})
    with pytest.raises(LockError, match="launch by eve@other"):
        ClusterLock("spark-a", transport, "up").accept({"held": False, "holder": holder})


def test_holder_is_gone_only_for_a_dead_pid_of_this_controller() -> None:
    here = socket.gethostname()
    assert _holder_is_gone({"controller": here, "pid": dead_pid()})
    assert not _holder_is_gone({"controller": "elsewhere", "pid": dead_pid()})
    assert not _holder_is_gone({"controller": here, "pid": "12"})
    assert not _holder_is_gone({})


def test_holder_alive_but_not_ours_is_not_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    def kill(pid: int, signal: int) -> None:
        raise PermissionError
    monkeypatch.setattr("os.kill", kill)
    assert not _holder_is_gone({"controller": socket.gethostname(), "pid": 1})


def test_release_removes_only_our_own_lock(fake_transport: Any) -> None:
    transport = head(fake_transport)
    lock = ClusterLock("spark-a", transport, "up")
    lock.release()
    assert transport.calls == []  # never taken: nothing to release
    lock.ensure()
    lock.release()
    release = transport.calls[-1]
    assert release.command.startswith(f"grep -q {lock.owner['token']} {LOCK_DIR}/owner")
    assert f"rm -rf {LOCK_DIR}" in release.command and release.sudo and not lock.held


def test_a_failed_release_is_logged_not_raised(fake_transport: Any, caplog: pytest.LogCaptureFixture) -> None:
    lost = TransportError("spark-a: the SSH connection was lost")
    transport = head(fake_transport).on("^grep", answer=lost)
    lock = ClusterLock("spark-a", transport, "up")
    lock.ensure()
    lock.release()
    assert lock.held
    assert "could not release the lock on spark-a" in caplog.text
