"""phases/models.py applied against the fake cluster: the download on the head (token file in and
out, progress lines, failures), the copy to peers (only what differs, verified after), the
summary and the phase's facts request."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Call, FakeCluster

from orchestrator.commands import Secret
from orchestrator.core.step import Change, RunOptions, Unchanged
from orchestrator.engines import load_recipe
from orchestrator.errors import SparkctlError
from orchestrator.node import ledger as node_ledger
from orchestrator.node import script
from orchestrator.phases import models

RECIPE = load_recipe("qwen3-235b")
MODEL, DRAFT = (repo for repo, _, _ in RECIPE.repos)
DRAFT_DIR = RECIPE.repos[1][2]
MANIFEST = re.escape("python3 -c")


def entry(files: dict[str, list[Any]] | None = None, *, present: bool = True, commit: str | None = "c0ffee",
          blobs: dict[str, int] | None = None, root: str = models.HUB_DIR,
          paths: list[str] | None = None) -> dict[str, Any]:
    files = {"config.json": [10, "abc"], "w.safetensors": [300_000_000_000, None]} if files is None else files
    return {"present": present, "commit": commit, "files": files, "root": root,
            "paths": paths or [], "blobs": blobs or {},
            "bytes": sum(size for size, _ in files.values())}


def head_manifests() -> dict[str, Any]:
    return {
        MODEL: entry(blobs={"models--m/blobs/a": 10, "models--m/blobs/b": 300_000_000_000},
                     paths=["models--m/snapshots/c0ffee", "models--m/refs/main"]),
        DRAFT: entry({"config.json": [5_000_000, "d"]}, commit=None, root="/root/.cache/huggingface/drafts",
                     paths=["Qwen3-235B-A22B-Eagle3"]),
    }


def facts_of(manifests: dict[str, Any], token: bool = False, rc: int = 0) -> dict[str, Any]:
    return {"commands": {"models": {"rc": rc, "out": json.dumps(manifests), "err": "not running"}},
            "files": {models.TOKEN_PATH: {"exists": token}}}


def options(**values: Any) -> RunOptions:
    return RunOptions(command="launch", values=values)


def test_the_phase_runs_on_the_serving_nodes_and_asks_for_manifests(
        fake_cluster: Callable[..., FakeCluster]) -> None:
    cluster = fake_cluster()
    phase = models.phase(RECIPE, cluster.inventory)
    assert phase.name == "models" and [s.name for s in phase.steps] == ["download", "distribute"]
    assert [n.name for n in phase.nodes(cluster.inventory)] == ["spark-a", "spark-b"]
    request = phase.facts(cluster.inventory, cluster.inventory.node("spark-a"))
    assert request["files"] == {models.TOKEN_PATH: False} and request["timeout"] == 600
    words = shlex.split(request["commands"]["models"])
    assert words[:3] == ["docker", "exec", cluster.inventory.container.name]
    assert words[-3] == "-c" and words[-2] == models.MANIFEST_SCRIPT
    assert json.loads(words[-1]) == {"hub": models.HUB_DIR, "repos": [
        {"repo": MODEL, "revision": "main", "dir": None},
        {"repo": DRAFT, "revision": "main", "dir": DRAFT_DIR}]}


def test_unchanged_download_names_what_is_there(fake_cluster: Callable[..., FakeCluster]) -> None:
    cluster = fake_cluster(facts={"spark-a": facts_of(head_manifests())})
    outcome = models.Download(RECIPE).check(cluster.context("spark-a"))
    assert isinstance(outcome, Unchanged)
    assert outcome.reason == f"already on spark-a: {MODEL} (300.00 GB), {DRAFT} (5.0 MB)"


def test_download_writes_the_token_streams_progress_and_always_removes_the_token(
        fake_cluster: Callable[..., FakeCluster]) -> None:
    cluster = fake_cluster()
    head = cluster["spark-a"]
    head.on("hf download", stdout="Fetching 3 files: 50%\nFetching 3 files: 100%\n")
    notes: list[str] = []
    ctx = cluster.context("spark-a",
                          options=options(hf_token=Secret("hf_secret"), progress_note=notes.append))

    message = models.Download(RECIPE).apply(ctx, Change("download", payload=[DRAFT]))

    assert message == f"downloaded {DRAFT}" and ctx.shared["downloaded"] == [DRAFT]
    token_call, download, cleanup = head.calls
    assert json.loads(token_call.stdin) == [  # type: ignore[arg-type]
        {"path": models.TOKEN_PATH, "mode": "600", "content": "hf_secret\n"}]
    assert token_call.sudo
    assert "hf_secret" not in token_call.command and token_call.command == models.token_write_cmd()
    install, write = token_call.command.split(" && ", 1)  # through the node's ledger, from stdin
    assert install == "install -d -m 0700 /etc/sparkctl/secrets"
    assert shlex.split(write) == ["python3", "-c", script("ledger.py"), "write"]
    assert download.command == models.download_cmd(cluster.inventory.container.name, DRAFT, "main",
                                                   DRAFT_DIR, with_token=True)
    assert download.timeout == models.DOWNLOAD_TIMEOUT
    assert cleanup.command == models.token_remove_cmd() and cleanup.sudo
    assert notes[0] == f"        ↓ spark-a: hf download {DRAFT} (main)"
    assert notes[-1] == f"          {DRAFT}: Fetching 3 files: 100%"


def test_a_failed_download_says_why_and_hints_at_the_token(fake_cluster: Callable[..., FakeCluster]) -> None:
    cluster = fake_cluster()
    head = cluster["spark-a"]
    head.on("hf download", 1, "", "401 Client Error: gated repo\n")
    ctx = cluster.context("spark-a", options=options())

    with pytest.raises(SparkctlError) as raised:
        models.Download(RECIPE).apply(ctx, Change("download", payload=[MODEL, DRAFT]))

    text = str(raised.value)
    assert text.startswith(f"spark-a: download of {MODEL} failed (exit 1) (no HF token was given")
    assert text.endswith("401 Client Error: gated repo")
    assert len(head.calls) == 2  # no token to write; the second model never started
    assert head.commands[-1] == models.token_remove_cmd()

    head.rules.clear()
    head.on("hf download", 2, "", "disk full")
    ctx = cluster.context("spark-a", options=options(hf_token=Secret("t")))
    with pytest.raises(SparkctlError, match=r"failed \(exit 2\):\ndisk full") as raised:
        models.Download(RECIPE).apply(ctx, Change("download", payload=[MODEL]))
    assert "no HF token" not in str(raised.value)


def test_a_leftover_token_is_only_removed(fake_cluster: Callable[..., FakeCluster], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = fake_cluster()
    ctx = cluster.context("spark-a", options=options(hf_token=Secret("t")))
    assert models.Download(RECIPE).apply(ctx, Change("rm", payload=[])) == "removed a leftover HF token file"
    assert cluster["spark-a"].commands == [models.token_remove_cmd()]

    # the removal is the node's ledger `undo` of exactly the token path: it removes sparkctl's
    # own token file and leaves anyone else's alone
    printf, undo = models.token_remove_cmd().split(" | ", 1)
    assert shlex.split(printf)[:2] == ["printf", "%s"]
    assert json.loads(shlex.split(printf)[2]) == [models.TOKEN_PATH]
    assert shlex.split(undo) == ["python3", "-c", script("ledger.py"), "undo"]
    base = tmp_path / "var-lib-sparkctl"
    monkeypatch.setattr(node_ledger, "BASE", str(base))
    monkeypatch.setattr(node_ledger, "LEDGER", str(base / "ledger.json"))
    token = tmp_path / "hf_token"
    book: dict[str, Any] = {}
    assert node_ledger.write_one(book, str(token), b"t\n", 0o600, False) is None
    assert node_ledger.undo_one(book, str(token)) == ("removed", None)
    assert not token.exists() and book == {}
    token.write_text("someone else's token\n")
    action, reason = node_ledger.undo_one(book, str(token))
    assert action is None and reason and "not written by sparkctl" in reason
    assert token.read_text() == "someone else's token\n"


def test_distribute_copies_only_what_differs_and_verifies(fake_cluster: Callable[..., FakeCluster]) -> None:
    head = head_manifests()
    before = {MODEL: entry(blobs={"models--m/blobs/a": 10}), DRAFT: dict(head[DRAFT])}
    before[MODEL]["files"] = {"config.json": [10, "abc"]}
    cluster = fake_cluster()
    cluster["spark-a"].on(MANIFEST, stdout=json.dumps(head))
    cluster["spark-b"].on(MANIFEST, stdout=json.dumps(before), times=1).on(MANIFEST, stdout=json.dumps(head))
    notes: list[str] = []
    ctx = cluster.context("spark-a", options=options(progress_note=notes.append))

    message = models.Distribute(RECIPE).apply(ctx, Change("copy", payload=["spark-b"]))

    copies = [c for c in cluster["spark-a"].calls if "tar -C" in c.command]
    assert len(copies) == 1  # the draft is identical already
    pipeline = shlex.split(copies[0].command)[-1]
    # the snapshot and ref, plus only the blob the peer lacks
    assert "-cf - models--m/snapshots/c0ffee models--m/refs/main models--m/blobs/b |" in pipeline
    assert "192.168.200.13" in pipeline and "rm -rf" not in pipeline
    assert copies[0].timeout == models.COPY_TIMEOUT
    assert message is not None and message.startswith(f"copied {MODEL} -> spark-b (300.00 GB, ")
    assert message.endswith(f"identical on spark-a, spark-b: {MODEL}@c0ffee: 2 files, 300.00 GB; "
                            f"{DRAFT}@local: 1 files, 5.0 MB")
    assert notes == [f"        → spark-b: {MODEL} (300.00 GB) over the fabric to 192.168.200.13"]


def test_a_local_dir_model_is_replaced_whole(fake_cluster: Callable[..., FakeCluster]) -> None:
    head = head_manifests()
    stale = dict(head[DRAFT], files={"config.json": [4, "old"]})
    cluster = fake_cluster()
    cluster["spark-a"].on(MANIFEST, stdout=json.dumps(head))
    cluster["spark-b"].on(MANIFEST, stdout=json.dumps({MODEL: head[MODEL], DRAFT: stale}), times=1)
    cluster["spark-b"].on(MANIFEST, stdout=json.dumps(head))

    models.Distribute(RECIPE).apply(cluster.context("spark-a", options=options()),
                                    Change("copy", payload=["spark-b"]))

    (copy,) = [c for c in cluster["spark-a"].calls if "tar -C" in c.command]
    pipeline = shlex.split(copy.command)[-1]
    assert "rm -rf /root/.cache/huggingface/drafts/Qwen3-235B-A22B-Eagle3 &&" in pipeline
    assert "tar -C /root/.cache/huggingface/drafts -cf - Qwen3-235B-A22B-Eagle3 |" in pipeline


def test_a_copy_that_did_not_take_is_an_error(fake_cluster: Callable[..., FakeCluster]) -> None:
    head = head_manifests()
    short = dict(head[MODEL], files={"config.json": [10, "abc"]})
    cluster = fake_cluster()
    cluster["spark-a"].on(MANIFEST, stdout=json.dumps(head))
    cluster["spark-b"].on(MANIFEST, stdout=json.dumps({MODEL: short, DRAFT: head[DRAFT]}))

    with pytest.raises(SparkctlError, match=rf"spark-b: {MODEL} still differs from spark-a after the "
                                            r"copy \(1 vs 2 files\); check disk space"):
        models.Distribute(RECIPE).apply(cluster.context("spark-a", options=options()),
                                        Change("copy", payload=["spark-b"]))


def test_a_failing_copy_or_manifest_fails_the_step(fake_cluster: Callable[..., FakeCluster]) -> None:
    head = head_manifests()
    cluster = fake_cluster()
    cluster["spark-a"].on(MANIFEST, stdout=json.dumps(head)).on("tar -C", 1, "", "No space left on device")
    absent = {MODEL: entry(present=False, files={}), DRAFT: head[DRAFT]}
    cluster["spark-b"].on(MANIFEST, stdout=json.dumps(absent))
    with pytest.raises(Exception, match="No space left on device"):
        models.Distribute(RECIPE).apply(cluster.context("spark-a", options=options()),
                                        Change("copy", payload=["spark-b"]))

    cluster = fake_cluster()
    cluster["spark-a"].on(MANIFEST, answer=lambda call: (1, "", "Error: No such container"))
    with pytest.raises(Exception, match="No such container"):
        models.Distribute(RECIPE).apply(cluster.context("spark-a", options=options()),
                                        Change("copy", payload=["spark-b"]))
    assert [c.display for c in cluster["spark-a"].calls] == [
        f"docker exec {cluster.inventory.container.name} python3 -c <model manifest>"]


def test_a_head_without_the_model_is_copied_from_after_download(
        fake_cluster: Callable[..., FakeCluster]) -> None:
    head = head_manifests()
    missing = dict(head, **{MODEL: entry(present=False, files={}, commit=None)})
    cluster = fake_cluster(facts={"spark-a": facts_of(missing), "spark-b": facts_of(missing)})
    outcome = models.Distribute(RECIPE).check(cluster.context("spark-a"))
    # equal but absent on both: still a copy (after the download, the head has it)
    assert isinstance(outcome, Change) and outcome.payload == ["spark-b"]
    assert outcome.summary == f"copy over the fabric: {MODEL} -> spark-b"


def test_sizes_read_in_mb_or_gb() -> None:
    assert models.gb(5_000_000) == "5.0 MB"
    assert models.gb(99_999_999) == "100.0 MB"
    assert models.gb(100_000_000) == "0.10 GB"
    assert models.gb(130e9) == "130.00 GB"


def test_the_manifest_command_is_checked(fake_cluster: Callable[..., FakeCluster]) -> None:
    cluster = fake_cluster()
    cluster["spark-a"].on(MANIFEST, stdout=json.dumps({"x": 1}))
    assert models.read_manifests(cluster["spark-a"], "c", RECIPE) == {"x": 1}  # type: ignore[arg-type]
    call: Call = cluster["spark-a"].calls[0]
    assert call.timeout == 600 and call.display == "docker exec c python3 -c <model manifest>"
