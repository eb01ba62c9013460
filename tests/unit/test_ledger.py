"""The node-side ledger (orchestrator/node/ledger.py) and the netplan guard's rollback: sparkctl
never overwrites, restores over or removes a file whose content is not exactly what it wrote.

Run against a temp directory standing in for the node's /var/lib/sparkctl and /etc."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.node import ledger as node_ledger
from orchestrator.node import script


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    base = tmp_path / "var-lib-sparkctl"
    base.mkdir()
    monkeypatch.setattr(node_ledger, "BASE", str(base))
    monkeypatch.setattr(node_ledger, "LEDGER", str(base / "ledger.json"))
    monkeypatch.setattr(node_ledger, "ORIGINALS", str(base / "originals"))
    return node_ledger


def test_a_file_it_did_not_write_is_never_overwritten(ledger: Any, tmp_path: Path) -> None:
    target = tmp_path / "etc" / "hostfile"
    target.parent.mkdir()
    target.write_text("mine\n")
    book: dict[str, Any] = {}
    reason = ledger.write_one(book, str(target), b"sparkctl\n", 0o644, False)
    assert reason and "not written by sparkctl" in reason
    assert target.read_text() == "mine\n" and str(target) not in book


def test_its_own_file_is_rewritten_and_a_changed_one_left(ledger: Any, tmp_path: Path) -> None:
    target = tmp_path / "f"
    book: dict[str, Any] = {}
    assert ledger.write_one(book, str(target), b"v1\n", 0o644, False) is None
    assert ledger.write_one(book, str(target), b"v2\n", 0o644, False) is None
    assert target.read_text() == "v2\n"
    target.write_text("edited by hand\n")
    assert "changed since sparkctl wrote it" in ledger.write_one(book, str(target), b"v3\n", 0o644, False)
    action, reason = ledger.undo_one(book, str(target))
    assert action is None and "changed since" in reason and target.read_text() == "edited by hand\n"


def test_undo_restores_the_users_original_or_removes_only_its_own(ledger: Any, tmp_path: Path) -> None:
    target = tmp_path / "netplan.yaml"
    target.write_text("users own\n")
    book: dict[str, Any] = {}
    assert ledger.write_one(book, str(target), b"ours\n", 0o600, True) is None
    assert target.read_text() == "ours\n"
    action, reason = ledger.undo_one(book, str(target))
    assert reason is None and "restored" in action and target.read_text() == "users own\n"
    # the user's file is not ours any more: a second undo leaves it
    action, reason = ledger.undo_one(book, str(target))
    assert action is None and target.read_text() == "users own\n"


def test_issue_20_stale_absent_entry_never_deletes_a_users_file(ledger: Any, tmp_path: Path) -> None:
    """up wrote the file (nothing before), it was rolled back (file removed), then the user
    wrote their own file at the same path: undo (down --network) must leave it."""
    target = tmp_path / "40-sparkctl-fabric.yaml"
    book: dict[str, Any] = {}
    ledger.write_one(book, str(target), b"# Managed by sparkctl\nours\n", 0o600, True)
    target.unlink()  # the rollback
    target.write_text("# Managed by sparkctl\nnow the user's\n")
    action, reason = ledger.undo_one(book, str(target))
    assert action is None and reason
    assert target.read_text() == "# Managed by sparkctl\nnow the user's\n"


def test_the_rollback_point_is_refreshed_over_a_stale_marker(ledger: Any, tmp_path: Path) -> None:
    target, backup, marker, confirmed = (tmp_path / n for n in ("np", "backup", "absent", "confirmed"))
    marker.touch()  # left by an earlier, rolled-back run
    target.write_text("the user's file\n")
    ledger.save_rollback_point({}, str(target), str(backup), str(marker), str(confirmed))
    assert not marker.exists() and backup.read_text() == "the user's file\n"


def test_the_rollback_point_of_an_unfinished_run_is_kept(ledger: Any, tmp_path: Path) -> None:
    target, backup, marker, confirmed = (tmp_path / n for n in ("np", "backup", "absent", "confirmed"))
    book: dict[str, Any] = {}
    marker.touch()
    ledger.write_one(book, str(target), b"unconfirmed\n", 0o600, True)
    ledger.save_rollback_point(book, str(target), str(backup), str(marker), str(confirmed))
    assert marker.exists() and not backup.exists()


def test_purge_keeps_changed_files_and_removes_the_rest(ledger: Any, tmp_path: Path) -> None:
    directory = tmp_path / "etc-sparkctl"
    (directory / "secrets").mkdir(parents=True)
    book: dict[str, Any] = {}
    ledger.write_one(book, str(directory / "hostfile"), b"a\n", 0o644, False)
    ledger.write_one(book, str(directory / "secrets" / "x"), b"b\n", 0o600, False)
    (directory / "hostfile").write_text("edited\n")
    left = ledger.purge(book, str(directory), set())
    assert [e["path"] for e in left] == [str(directory / "hostfile")]
    assert sorted(p.name for p in directory.rglob("*")) == ["hostfile"]


def guard_module(tmp_path: Path) -> SimpleNamespace:
    """The guard script with its paths moved into tmp_path and `netplan apply` faked."""
    text = script("netguard.py").replace("\nsys.exit(main())", "\n")
    namespace: dict[str, Any] = {"__file__": "netguard.py", "__name__": "netguard"}
    exec(compile(text, "netguard.py", "exec"), namespace)
    base = tmp_path / "state"
    (base / "netguard").mkdir(parents=True)
    namespace.update(
        BASE=str(base), STATE=str(base / "netguard"), NETPLAN_FILE=str(tmp_path / "40-sparkctl.yaml"),
        BACKUP=str(base / "netplan-backup.yaml"), ABSENT=str(base / "netplan-backup.absent"),
        ROLLED_BACK=str(base / "rolled-back.json"), LEDGER=str(base / "ledger.json"),
        run=lambda argv, timeout=120: (0, "", ""),
    )
    return SimpleNamespace(**{k: namespace[k] for k in ("rollback", "NETPLAN_FILE", "ABSENT", "LEDGER")})


def test_issue_20_guard_rollback_with_a_stale_marker_leaves_a_users_file(tmp_path: Path) -> None:
    guard = guard_module(tmp_path)
    Path(guard.ABSENT).touch()
    Path(guard.NETPLAN_FILE).write_text("the user's own\n")
    result = guard.rollback({}, "test")
    assert Path(guard.NETPLAN_FILE).read_text() == "the user's own\n"
    assert "left alone" in result["restored"]


def test_guard_rollback_removes_its_own_file(tmp_path: Path) -> None:
    import hashlib

    guard = guard_module(tmp_path)
    Path(guard.ABSENT).touch()
    Path(guard.NETPLAN_FILE).write_text("ours\n")
    Path(guard.LEDGER).write_text(json.dumps(
        {guard.NETPLAN_FILE: {"sha256": hashlib.sha256(b"ours\n").hexdigest(), "before": {}}}))
    result = guard.rollback({}, "test")
    assert not Path(guard.NETPLAN_FILE).exists() and "removed" in result["restored"]
    assert json.loads(Path(guard.LEDGER).read_text()) == {}
