"""phases/files.py: which managed files differ (content, mode, absence), how the diff reads
(secrets never shown), and the one-command writer, run for real against a tmp dir."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeCluster

from orchestrator.core.step import Change, NodeContext, Unchanged
from orchestrator.errors import CommandError
from orchestrator.phases.files import FileSpec, ManagedFiles, files_request, write_files_cmd
from orchestrator.render import sha256

SPECS = [FileSpec("/etc/sparkctl/hostfile", 0o644, "10.0.0.1 slots=1\n"),
         FileSpec("/etc/sparkctl/cluster_key", 0o600, "PRIVATE KEY\n", secret=True),
         FileSpec("/etc/sparkctl/ssh_config", 0o644, "Host *\n")]


def step() -> ManagedFiles:
    return ManagedFiles("files", lambda ctx: SPECS)


def fact(content: str, mode: int) -> dict[str, Any]:
    return {"exists": True, "sha256": sha256(content), "mode": mode, "content": content}


def context(fake_cluster: Callable[..., FakeCluster],
            files: dict[str, Any]) -> tuple[FakeCluster, NodeContext]:
    cluster = fake_cluster(facts={"spark-a": {"files": files}})
    return cluster, cluster.context("spark-a")


def test_up_to_date_files_are_unchanged(fake_cluster: Callable[..., FakeCluster]) -> None:
    _, ctx = context(fake_cluster, {s.path: fact(s.content, s.mode) for s in SPECS})
    assert step().check(ctx) == Unchanged("files up to date")


def test_changed_content_mode_and_secrets_each_read_their_own_way(
        fake_cluster: Callable[..., FakeCluster]) -> None:
    _, ctx = context(fake_cluster, {
        SPECS[0].path: fact("10.9.9.9 slots=1\n", 0o644),     # other content
        SPECS[1].path: fact("OLD KEY\n", 0o600),              # a secret: never diffed
        SPECS[2].path: fact(SPECS[2].content, 0o666),         # only the mode
    })
    change = step().check(ctx)
    assert isinstance(change, Change)
    assert change.summary == "write hostfile, cluster_key, ssh_config"
    assert change.payload == SPECS
    assert "-10.9.9.9 slots=1\n+10.0.0.1 slots=1\n" in change.diff
    assert "--- /etc/sparkctl/hostfile (on node)" in change.diff
    assert "/etc/sparkctl/cluster_key: secret content (not shown)" in change.diff
    assert "KEY" not in change.diff
    assert change.diff.endswith("/etc/sparkctl/ssh_config: mode 666 -> 644\n")


def test_a_missing_file_is_written_with_a_diff_from_nothing(fake_cluster: Callable[..., FakeCluster]) -> None:
    _, ctx = context(fake_cluster, {SPECS[1].path: fact(SPECS[1].content, 0o600),
                                    SPECS[2].path: fact(SPECS[2].content, 0o644)})
    change = step().check(ctx)
    assert isinstance(change, Change) and change.payload == [SPECS[0]]
    assert change.diff.startswith("--- /dev/null\n+++ /etc/sparkctl/hostfile")

    # a file whose facts say it is absent, even with matching (stale) checksums, is written
    _, ctx = context(fake_cluster, {s.path: dict(fact(s.content, s.mode), exists=False) for s in SPECS})
    change = step().check(ctx)
    assert isinstance(change, Change) and len(change.payload) == 3
    assert "mode 644 -> 644" in change.diff


def test_apply_writes_every_changed_file_in_one_sudo_command(
        fake_cluster: Callable[..., FakeCluster]) -> None:
    cluster, ctx = context(fake_cluster, {})
    assert step().apply(ctx, Change("write", payload=SPECS[:2])) is None
    (call,) = cluster["spark-a"].calls
    assert call.command == write_files_cmd() and call.sudo and call.display == "write managed files"
    assert json.loads(call.stdin) == [  # type: ignore[arg-type]
        {"path": "/etc/sparkctl/hostfile", "mode": "644", "content": "10.0.0.1 slots=1\n"},
        {"path": "/etc/sparkctl/cluster_key", "mode": "600", "content": "PRIVATE KEY\n"}]
    assert "PRIVATE KEY" not in call.command


def test_a_failed_write_raises(fake_cluster: Callable[..., FakeCluster]) -> None:
    cluster, ctx = context(fake_cluster, {})
    cluster["spark-a"].on("python3 -c", 1, "", "Read-only file system")
    with pytest.raises(CommandError, match="Read-only file system"):
        step().apply(ctx, Change("write", payload=SPECS[:1]))


def test_the_writer_writes_atomically_with_the_modes_asked(tmp_path: Path) -> None:
    argv = shlex.split(write_files_cmd())
    assert argv[:2] == ["python3", "-c"] and argv[3:] == ["write"]
    state = tmp_path / "var-lib-sparkctl"  # the node's /var/lib/sparkctl (the ledger), moved here
    source = argv[2].replace('BASE = "/var/lib/sparkctl"', f"BASE = {str(state)!r}")
    assert source != argv[2]

    def write(payload: list[dict[str, str]]) -> dict[str, Any]:
        done = subprocess.run([sys.executable, "-c", source, *argv[3:]], input=json.dumps(payload),
                              text=True, capture_output=True, check=True)
        return dict(json.loads(done.stdout))

    target = tmp_path / "new" / "dir" / "hostfile"
    key = tmp_path / "key"
    users = tmp_path / "users"
    users.write_text("the user's own\n")
    assert write([{"path": str(key), "mode": "644", "content": "old\n"}])["written"] == [str(key)]
    assert (key.stat().st_mode & 0o777) == 0o644
    payload = [{"path": str(target), "mode": "644", "content": "a\n"},
               {"path": str(key), "mode": "600", "content": "secret\n"},
               {"path": str(users), "mode": "644", "content": "sparkctl's\n"}]
    answer = write(payload)
    assert answer["written"] == [str(target), str(key)]
    assert target.read_text() == "a\n" and (target.stat().st_mode & 0o777) == 0o644
    assert key.read_text() == "secret\n" and (key.stat().st_mode & 0o777) == 0o600
    # a file sparkctl did not write is left alone, and the answer says so
    assert users.read_text() == "the user's own\n"
    assert [e["path"] for e in answer["left"]] == [str(users)]
    assert "not written by sparkctl" in answer["left"][0]["reason"]
    ledger = json.loads((state / "ledger.json").read_text())
    assert sorted(ledger) == sorted([str(target), str(key)])
    assert ledger[str(key)]["sha256"] == sha256("secret\n")
    assert sorted(os.listdir(tmp_path)) == ["key", "new", "users", "var-lib-sparkctl"]  # no temp files
    assert os.listdir(target.parent) == ["hostfile"] and os.listdir(state) == ["ledger.json"]


def test_files_request_asks_for_content() -> None:
    assert files_request(["/a", "/b"]) == {"/a": True, "/b": True}
