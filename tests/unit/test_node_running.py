"""The record's container (record_container.py) and the ledger's command line (ledger.py
MODE ...), run in-process (see nodescript.py) against a temp run directory; `docker` is a tiny
fake first on PATH that runs `docker exec CONTAINER python3 ...` here, on this machine's Python."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from nodescript import run_node_script

FAKE_DOCKER = """\
#!{python}
import subprocess, sys
with open({log!r}, "a") as log:
    log.write(" ".join(sys.argv[1:3]) + "\\n")
if sys.argv[1:2] != ["exec"] or sys.argv[2] == "gone":
    sys.stderr.write("Error response from daemon: No such container: %s\\n" % sys.argv[2])
    sys.exit(1)
if sys.argv[2] == "garbled":
    print("not json")
    sys.exit(0)
argv = [sys.executable if a == "python3" else a for a in sys.argv[3:]]
sys.exit(subprocess.run(argv).returncode)
"""


@pytest.fixture
def docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake `docker` first on PATH; returns the file it logs "exec CONTAINER" lines to."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "docker.log"
    fake = bindir / "docker"
    fake.write_text(FAKE_DOCKER.format(python=sys.executable, log=str(log)))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return log


# ------------------------------------------------------------------ record_container.py
def record_container(server_json: Path, engine: str, monkeypatch: pytest.MonkeyPatch) -> str:
    from orchestrator.engines import DEFAULT_ENGINE

    ran = run_node_script("record_container.py", [str(server_json), "sparkctl", engine,
                                                  DEFAULT_ENGINE], monkeypatch)
    assert ran.code is None, ran.stderr
    return ran.stdout


def test_record_container_names_the_engines_container_or_nothing(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / "server.json"
    record.write_text(json.dumps({"engine": "vllm", "container": "sparkctl-vllm"}))
    assert record_container(record, "", monkeypatch) == "sparkctl-vllm\n"
    assert record_container(record, "vllm", monkeypatch) == "sparkctl-vllm\n"
    assert record_container(record, "trtllm", monkeypatch) == ""
    # an old record: TensorRT-LLM in the default container
    record.write_text(json.dumps({"recipe": "qwen3-235b"}))
    assert record_container(record, "trtllm", monkeypatch) == "sparkctl\n"
    assert record_container(record, "vllm", monkeypatch) == ""
    # no record at all reads as TensorRT-LLM's default container (its container is `up`'s)
    assert record_container(tmp_path / "missing.json", "", monkeypatch) == "sparkctl\n"


# ------------------------------------------------------------------ ledger.py MODE ...
class Ledger:
    """ledger.py run as the nodes run it, with /var/lib/sparkctl moved under tmp_path."""

    def __init__(self, base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.base, self.monkeypatch = base, monkeypatch

    def __call__(self, *argv: str, stdin: Any = None) -> tuple[Any, Any]:
        self.monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(stdin)))
        ran = run_node_script("ledger.py", list(argv), self.monkeypatch,
                              replace={'BASE = "/var/lib/sparkctl"': f'BASE = {str(self.base)!r}'})
        return ran.code, (ran.json if ran.stdout.strip() else ran.stderr)

    @property
    def book(self) -> dict[str, Any]:
        return json.loads((self.base / "ledger.json").read_text())  # type: ignore[no-any-return]


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    return Ledger(tmp_path / "var-lib-sparkctl", monkeypatch)


def test_ledger_write_check_undo_round_trip(ledger: Ledger, tmp_path: Path) -> None:
    ours, users = tmp_path / "etc" / "hostfile", tmp_path / "etc" / "hosts"
    users.parent.mkdir()
    users.write_text("the user's\n")

    code, answer = ledger("write", stdin=[
        {"path": str(ours), "mode": "644", "content": "spark-a\nspark-b\n"},
        {"path": str(users), "mode": "644", "content": "sparkctl's\n"},   # no original=true
    ])
    assert code == 0
    assert answer["written"] == [str(ours)]
    assert answer["left"] == [{"path": str(users),
                               "reason": f"{users} was not written by sparkctl: left alone"}]
    assert ours.read_text() == "spark-a\nspark-b\n" and oct(ours.stat().st_mode & 0o777) == "0o644"
    assert users.read_text() == "the user's\n"
    assert list(ledger.book) == [str(ours)]
    assert oct((ledger.base / "ledger.json").stat().st_mode & 0o777) == "0o600"

    code, answer = ledger("check", stdin=[str(ours), str(users), str(tmp_path / "nothing")])
    assert code == 0
    assert answer == {str(ours): "ours", str(users): "unrecorded", str(tmp_path / "nothing"): "absent"}

    code, answer = ledger("undo", stdin=[str(ours), str(users)])
    assert code == 0
    assert answer["done"] == [{"path": str(ours), "action": "removed"}]
    assert answer["left"] == [{"path": str(users),
                               "reason": f"{users} was not written by sparkctl: left alone"}]
    assert not ours.exists() and users.read_text() == "the user's\n"
    assert ledger.book == {}
    code, answer = ledger("undo", stdin=[str(ours)])
    assert answer["done"] == [{"path": str(ours), "action": "already gone"}]


def test_ledger_check_writes_nothing(ledger: Ledger, tmp_path: Path) -> None:
    code, answer = ledger("check", stdin=[str(tmp_path / "f")])
    assert (code, answer) == (0, {str(tmp_path / "f"): "absent"})
    assert not ledger.base.exists()  # no ledger was created by looking


def test_ledger_install_keeps_the_users_file_and_a_rollback_point(ledger: Ledger, tmp_path: Path) -> None:
    netplan = tmp_path / "etc" / "netplan" / "40-sparkctl-fabric.yaml"
    netplan.parent.mkdir(parents=True)
    netplan.write_text("users own netplan\n")
    src = tmp_path / "staged.yaml"
    src.write_text("network: {version: 2}\n")
    guard = tmp_path / "guard"
    guard.mkdir()
    backup, marker, confirmed = guard / "netplan-backup", guard / "netplan-absent", guard / "confirmed"

    code, answer = ledger("install", str(src), str(netplan), "600", str(backup), str(marker),
                          str(confirmed))
    assert code == 0 and answer == {"left": [], "written": [str(netplan)]}
    assert netplan.read_text() == "network: {version: 2}\n"
    assert oct(netplan.stat().st_mode & 0o777) == "0o600"
    assert backup.read_text() == "users own netplan\n" and not marker.exists()
    before = ledger.book[str(netplan)]["before"]
    assert before["kind"] == "file" and Path(before["copy"]).read_text() == "users own netplan\n"

    # undo puts the user's file back
    code, answer = ledger("undo", stdin=[str(netplan)])
    assert answer["done"][0]["action"] == "restored the file that was there before sparkctl"
    assert netplan.read_text() == "users own netplan\n"

    # without the rollback arguments: a plain install (a hand-changed target is kept too)
    code, answer = ledger("install", str(src), str(tmp_path / "etc" / "new.conf"), "644")
    assert answer == {"left": [], "written": [str(tmp_path / "etc" / "new.conf")]}


def test_ledger_purge_and_unknown_mode(ledger: Ledger, tmp_path: Path) -> None:
    folder = tmp_path / "etc-sparkctl"
    code, _ = ledger("write", stdin=[{"path": str(folder / "a"), "mode": "644", "content": "a"},
                                     {"path": str(folder / "b"), "mode": "644", "content": "b"}])
    (folder / "b").write_text("edited\n")
    (folder / "lock").write_text("kept by name\n")
    code, answer = ledger("purge", str(folder), "lock")
    assert code == 0
    assert answer == {"left": [{"path": str(folder / "b"),
                                "reason": f"{folder / 'b'} was changed since sparkctl wrote it: left alone"}]}
    assert sorted(p.name for p in folder.iterdir()) == ["b", "lock"]
    assert ledger.book == {}

    code, err = ledger("frobnicate")
    assert code == 2 and "unknown mode 'frobnicate'" in err


def test_ledger_reports_a_filesystem_error_as_json(ledger: Ledger, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    code, answer = ledger("write", stdin=[{"path": str(blocker / "sub" / "f"), "mode": "644",
                                           "content": "x"}])
    assert code == 1
    assert answer["errno"] == 20 and answer["error"] == "Not a directory"  # ENOTDIR
    assert answer["path"].startswith(str(blocker)) and answer["free_bytes"] > 0


def test_a_corrupt_or_foreign_ledger_reads_as_empty(ledger: Ledger, tmp_path: Path) -> None:
    ledger.base.mkdir()
    target = tmp_path / "f"
    target.write_text("x")
    for text in ("{broken", "[1, 2]"):
        (ledger.base / "ledger.json").write_text(text)
        assert ledger("check", stdin=[str(target)]) == (0, {str(target): "unrecorded"})


def test_ledger_looking_or_undoing_nothing_creates_no_ledger(ledger: Ledger, tmp_path: Path) -> None:
    folder = tmp_path / "a-dir"
    folder.mkdir()
    assert ledger("check", stdin=[str(folder)]) == (0, {str(folder): "unrecorded"})
    code, answer = ledger("undo", stdin=[str(tmp_path / "never-written")])
    assert code == 0 and answer["done"] == [{"path": str(tmp_path / "never-written"),
                                            "action": "already gone"}]
    assert ledger("purge", str(tmp_path / "no-such-dir")) == (0, {"left": []})
    assert not ledger.base.exists()


def test_ledger_install_over_nothing_marks_the_rollback_point_absent(ledger: Ledger,
                                                                     tmp_path: Path) -> None:
    src = tmp_path / "staged.yaml"
    src.write_text("network: {version: 2}\n")
    target = tmp_path / "netplan.yaml"
    backup, marker, confirmed = tmp_path / "backup", tmp_path / "absent-marker", tmp_path / "confirmed"
    backup.write_text("a stale backup\n")
    confirmed.write_text("0" * 64 + "\n")
    code, answer = ledger("install", str(src), str(target), "600", str(backup), str(marker),
                          str(confirmed))
    assert code == 0 and answer["written"] == [str(target)]
    # nothing stood there: the rollback is "remove it", and the stale backup cannot be restored
    assert marker.exists() and not backup.exists()
    assert ledger.book[str(target)]["before"] == {"kind": "absent"}
