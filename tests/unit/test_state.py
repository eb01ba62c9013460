"""state.py: the state directory, the remembered inventory, redaction and the run log."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from orchestrator import state
from orchestrator.commands import Secret


def test_state_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(tmp_path / "explicit"))
    assert state.state_dir() == tmp_path / "explicit"
    monkeypatch.delenv("SPARKCTL_STATE_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert state.state_dir() == tmp_path / "xdg" / "sparkctl"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert state.state_dir() == tmp_path / "home" / ".local" / "state" / "sparkctl"


def test_remember_inventory_writes_the_absolute_path(state_dir: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    state.remember_inventory(Path("two.yml"))
    assert (state_dir / "last-inventory").read_text() == f"{tmp_path / 'two.yml'}\n"


def test_registered_secrets_and_private_keys_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "_SECRETS", [])
    state.register_secret(Secret("hf_abcdefgh"))
    state.register_secret("pw12")
    state.register_secret("abc")  # too short to redact safely
    state.register_secret("pw12")
    assert state._SECRETS == ["hf_abcdefgh", "pw12"]
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----"
    text = state.redact(f"token hf_abcdefgh pw pw12 abc {key} end")
    assert text == "token *** pw *** abc <private key redacted> end"


def test_the_run_log_is_private_redacted_and_pruned(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "_SECRETS", [])
    logs = state_dir / "logs"
    logs.mkdir(parents=True)
    for i in range(55):
        (logs / f"2000{i:04d}-old.log").write_text("")
    path = state.start_run_log("up")
    assert path is not None and path.parent == logs and path.name.endswith("-up.log")
    assert os.stat(path).st_mode & 0o777 == 0o600
    state.register_secret("sup3r-secret")
    logging.getLogger("sparkctl.test").info("password is sup3r-secret")
    for handler in logging.getLogger("sparkctl").handlers:
        handler.flush()
    assert "password is ***" in path.read_text() and "sup3r-secret" not in path.read_text()
    assert len(list(logs.glob("*.log"))) == 50 and path.exists()


def test_no_run_log_when_the_state_dir_is_unwritable(state_dir: Path) -> None:
    state_dir.parent.mkdir(parents=True, exist_ok=True)
    state_dir.write_text("not a directory")
    assert state.start_run_log("up") is None
