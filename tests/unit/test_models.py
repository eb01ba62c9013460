"""phases/models.py applied against the fake cluster: the download on the head (token file in and
out through the ledger, free space, progress lines, failures), the fan-out to peers (receiver and
sender faked at phases/fanout.py's RemoteProcess: only what differs is sent, verified after), the
summary and the phase's facts request."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import Call, FakeCluster, model_args

from orchestrator.commands import Secret
from orchestrator.core.step import Change, RunOptions, Unchanged
from orchestrator.engines import load_recipe
from orchestrator.errors import CommandError, SparkctlError
from orchestrator.node import ledger as node_ledger
from orchestrator.node import script
from orchestrator.phases import fanout, models
from orchestrator.recipe import FileFilter
from orchestrator.remote import pipe

RECIPE = load_recipe("qwen3-235b")
MODEL, DRAFT = (repo for repo, _, _ in RECIPE.repos)
DRAFT_DIR = RECIPE.repos[1][2]
assert DRAFT_DIR is not None
DRAFTS, DRAFT_FOLDER = DRAFT_DIR.rsplit("/", 1)
FOLDER = "models--" + MODEL.replace("/", "--")
PATTERNED = RECIPE.model_copy(update={"files": FileFilter(allow=["*.safetensors", "*.json"],
                                                          deny=["original/"])})
MANIFEST = re.escape("python3 -c") + ".* manifest "
ARGS = model_args(RECIPE)
TOOLS = ARGS[1]
"""Where the models' commands run: a short-lived container of the recipe's engine image."""


def in_tools(*argv: str, interactive: bool = False, env: dict[str, str] | None = None,
             token: bool = False) -> list[str]:
    """The words of `argv` run in a models container (docker run --rm IMAGE argv)."""
    return shlex.split(TOOLS.cmd(list(argv), env=env, interactive=interactive, token=token))
COMMIT = "c0ffee"
BIG = 300_000_000_000
GB = 10**9


def sha(name: str, size: int) -> str:
    return f"{name}:{size}"


def hub_entry(files: dict[str, int] | None = None, *, present: bool = True,
              commit: str | None = COMMIT, free: int = 1000 * GB) -> dict[str, Any]:
    """A manifest entry (node/fanout_manifest.py's shape) of the main model in the HF cache."""
    files = {"config.json": 10, "model.safetensors": BIG} if files is None else files
    blobs = {f"{FOLDER}/blobs/{name}": {"size": size, "sha256": sha(name, size),
                                         "chunks": [sha(name, size)]} for name, size in files.items()}
    return {"present": present, "commit": commit, "root": models.HUB_DIR, "folder": FOLDER,
            "files": {name: f"{FOLDER}/blobs/{name}" for name in files}, "blobs": blobs,
            "links": {f"{FOLDER}/snapshots/{commit}/{name}": f"../../blobs/{name}" for name in files},
            "refs": {f"{FOLDER}/refs/main": commit} if commit else {}, "partial": [],
            "bytes": sum(files.values()), "chunk": 32 << 20, "free": free}


def local_entry(files: dict[str, int] | None = None, free: int = 1000 * GB) -> dict[str, Any]:
    """A manifest entry of the draft model, a local dir (no commit, links or refs)."""
    files = {"config.json": 5_000_000} if files is None else files
    blobs = {f"{DRAFT_FOLDER}/{name}": {"size": size, "sha256": sha(name, size),
                                         "chunks": [sha(name, size)]} for name, size in files.items()}
    return {"present": "config.json" in files, "commit": None, "root": DRAFTS,
            "folder": DRAFT_FOLDER, "files": {name: f"{DRAFT_FOLDER}/{name}" for name in files},
            "blobs": blobs, "links": {}, "refs": {}, "partial": [], "bytes": sum(files.values()),
            "chunk": 32 << 20, "free": free}


def head_manifests() -> dict[str, Any]:
    return {MODEL: hub_entry(), DRAFT: local_entry()}


def facts_of(manifests: dict[str, Any], token: bool = False, rc: int = 0) -> dict[str, Any]:
    return {"commands": {"models": {"rc": rc, "out": json.dumps(manifests), "err": "not running"}},
            "files": {models.TOKEN_PATH: {"exists": token}}}


def options(**values: Any) -> RunOptions:
    return RunOptions(command="launch", **values)


@dataclass
class Started:
    """One receiver or sender the fan-out started (what RemoteProcess was given)."""

    node: str
    mode: str
    args: dict[str, Any]
    stdin: dict[str, Any]
    command: str
    display: str
    closed: bool = False


@dataclass
class Remotes:
    """The fake node side of the fan-out: a receiver needs every file of the plan whose sha256
    is not in `has[peer]`; a sender sends what it was asked. `recv`/`send` override the lines."""

    has: dict[str, set[str]] = field(default_factory=dict)
    recv: list[dict[str, Any]] | None = None
    send: list[dict[str, Any]] | None = None
    stderr: str = "Traceback: boom"
    started: list[Started] = field(default_factory=list)

    def lines(self, run: Started) -> list[dict[str, Any]]:
        if run.mode == "send":
            sent = sum(length for _, _, length in run.stdin["need"])
            return self.send if self.send is not None else [
                {"sent": sent // 2}, {"sent": sent, "seconds": 2.0, "done": True}]
        if self.recv is not None:
            return self.recv
        files = [f for repo in run.stdin["repos"] for f in repo["files"]]
        need = [[i, 0, f["size"]] for i, f in enumerate(files)
                if f["sha256"] not in self.has.get(run.node, set())]
        need_bytes = sum(n[2] for n in need)
        total = sum(f["size"] for f in files)
        ready = {"port": 4242 if need else 0, "need": need, "need_bytes": need_bytes,
                 "have": total - need_bytes, "total": total, "streams": 2 if need else 0}
        return [ready, {"done": True, "received": need_bytes, "cpu_busy": 0.97}]

    def of(self, mode: str) -> list[Started]:
        return [run for run in self.started if run.mode == mode]


@pytest.fixture
def remotes(monkeypatch: pytest.MonkeyPatch) -> Remotes:
    fake = Remotes()

    class Remote:
        def __init__(self, transport: Any, command: str, display: str) -> None:
            words = shlex.split(command)
            prefix = in_tools("python3", "-c", fanout.FANOUT_SCRIPT, interactive=True)
            assert words[:len(prefix)] == prefix
            self.node = transport.node
            self.run = Started(transport.node, words[len(prefix)], json.loads(words[len(prefix) + 1]),
                               {}, command, display)
            fake.started.append(self.run)
            self._lines: list[str] | None = None

        def feed(self, text: str, close: bool = True) -> None:
            assert self._lines is None, "stdin written twice"
            assert text.endswith("\n") and not close  # one line, stdin left open (watched)
            self.run.stdin = json.loads(text)
            self._lines = [json.dumps(line) + "\n" for line in fake.lines(self.run)]

        def readline(self) -> str:
            assert self._lines is not None, "read before its stdin was written"
            return self._lines.pop(0) if self._lines else ""

        first_json = pipe.RemoteProcess.first_json  # the real reading of the fake's lines

        def stderr_tail(self) -> str:
            return fake.stderr

        def close(self) -> None:
            self.run.closed = True

    monkeypatch.setattr(fanout, "RemoteProcess", Remote)
    return fake


def test_the_phase_runs_on_the_serving_nodes_and_asks_for_manifests(
        fake_cluster: Callable[..., FakeCluster]) -> None:
    cluster = fake_cluster()
    phase = models.phase(PATTERNED, *model_args(PATTERNED, cluster.inventory)[:1],
                         TOOLS.image, cluster.inventory)
    assert phase.name == "models" and [s.name for s in phase.steps] == ["download", "distribute"]
    assert [n.name for n in phase.nodes(cluster.inventory)] == ["spark-a", "spark-b"]
    request = phase.facts(cluster.inventory, cluster.inventory.node("spark-a"))
    assert request["files"] == {models.TOKEN_PATH: False} and request["timeout"] == 3600
    run = request["commands"]["models"]
    # never pulls: without the image on the node (a dry run), the manifests are unknown there
    # (the gatherer answers NO_IMAGE from its own inspect of the image, without running it)
    assert request["gates"]["models"] == {"image": TOOLS.image, "run_while": "present",
                                          "otherwise": models.NO_IMAGE + "\n"}
    assert TOOLS.image in request["images"]
    words = shlex.split(run)
    prefix = in_tools("python3", "-c", fanout.FANOUT_SCRIPT)
    assert words[:len(prefix)] == prefix and words[-2] == "manifest"
    assert "-v" in words and "~nvidia/.cache/huggingface:/root/.cache/huggingface" in words
    # the node script is the manifest code and the fan-out in one (stdlib only, sent whole)
    parts = ("stdin_watch.py", "fanout_manifest.py", "fanout_io.py", "fanout_receiver.py",
             "fanout.py")
    assert "\n".join(script(name) for name in parts) == fanout.FANOUT_SCRIPT
    # the facts manifest skips the chunk hashes (only the distribute step needs them)
    assert json.loads(words[-1]) == {"hub": models.HUB_DIR, "chunks": False, "repos": [
        {"repo": MODEL, "revision": "main", "dir": None, "allow": ["*.safetensors", "*.json"],
         "deny": ["original/"]},
        {"repo": DRAFT, "revision": "main", "dir": DRAFT_DIR, "allow": [], "deny": []}]}


def test_unchanged_download_names_what_is_there(fake_cluster: Callable[..., FakeCluster]) -> None:
    cluster = fake_cluster(facts={"spark-a": facts_of(head_manifests())})
    outcome = models.Download(RECIPE, *ARGS).check(cluster.context("spark-a"))
    assert isinstance(outcome, Unchanged)
    assert outcome.reason == f"already on spark-a: {MODEL} (300.00 GB), {DRAFT} (5.0 MB)"


def space_facts(head_free: int = 1000 * GB, peer_free: int = 1000 * GB) -> dict[str, Any]:
    """The facts of both serving nodes, with free space at the hub (as the manifest reports it)."""
    absent = {MODEL: hub_entry({}, present=False, commit=None), DRAFT: local_entry({})}
    return {"spark-a": facts_of({r: dict(e, free=head_free) for r, e in absent.items()}),
            "spark-b": facts_of({r: dict(e, free=peer_free) for r, e in absent.items()})}


def test_download_writes_the_token_streams_progress_and_always_removes_the_token(
        fake_cluster: Callable[..., FakeCluster]) -> None:
    cluster = fake_cluster(facts=space_facts())
    head = cluster["spark-a"]
    head.on("--dry-run", stdout="Would download 2 files totalling 130.5G.\n")
    head.on("hf download", stdout="Fetching 3 files: 50%\nFetching 3 files: 100%\n")
    notes: list[str] = []
    ctx = cluster.context("spark-a",
                          options=options(hf_token=Secret("hf_secret"), progress_note=notes.append))

    message = models.Download(PATTERNED, *ARGS).apply(ctx, Change("download", payload=[MODEL]))

    assert message == f"downloaded {MODEL}"
    token_call, dry_run, download, cleanup = head.calls
    assert json.loads(token_call.stdin) == [  # type: ignore[arg-type]
        {"path": models.TOKEN_PATH, "mode": "600", "content": "hf_secret\n"}]
    assert token_call.sudo
    assert "hf_secret" not in token_call.command and token_call.command == models.token_write_cmd()
    install, write = token_call.command.split(" && ", 1)  # through the node's ledger, from stdin
    assert install == "install -d -m 0700 /etc/sparkctl/secrets"
    assert shlex.split(write) == ["python3", "-c", script("ledger.py"), "write"]
    # the recipe's patterns go to hf as --include/--exclude, for the size check and the download
    words = shlex.split(download.command)
    assert words == in_tools("hf", "download", MODEL, "--revision", "main", "--include",
                             "*.safetensors", "--include", "*.json", "--exclude", "original/",
                             env={"HF_TOKEN_PATH": models.TOKEN_PATH}, token=True)
    assert "/etc/sparkctl/secrets:/etc/sparkctl/secrets:ro" in words  # the file, read-only
    assert shlex.split(dry_run.command) == [*words, "--dry-run"]
    assert "hf_secret" not in download.command and download.timeout == models.DOWNLOAD_TIMEOUT
    assert cleanup.command == models.token_remove_cmd() and cleanup.sudo
    assert notes[0] == f"        ↓ spark-a: hf download {MODEL} (main)"
    assert notes[-1] == f"          {MODEL}: Fetching 3 files: 100%"


def test_too_little_space_anywhere_stops_the_download_with_the_numbers(
        fake_cluster: Callable[..., FakeCluster]) -> None:
    cluster = fake_cluster(facts=space_facts(peer_free=100 * GB))
    head = cluster["spark-a"]
    head.on("--dry-run", stdout="Would download 2 files totalling 130.5G.\n")
    ctx = cluster.context("spark-a", options=options(hf_token=Secret("t")))

    with pytest.raises(SparkctlError) as raised:
        models.Download(RECIPE, *ARGS).apply(ctx, Change("download", payload=[MODEL]))

    assert str(raised.value) == (
        f"spark-b: not enough disk space for the download: need 130.50 GB at {models.HUB_DIR}, "
        "100.00 GB free; free some space on spark-b and run launch again")
    assert not [c for c in head.calls if "hf download" in c.command and "--dry-run" not in c.command]
    assert head.commands[-1] == models.token_remove_cmd()  # the token goes anyway

    # an hf without --dry-run (no size): said so, and the download goes ahead unchecked
    cluster = fake_cluster(facts=space_facts(peer_free=0))
    cluster["spark-a"].on("--dry-run", 2, "", "No such option: --dry-run")
    notes: list[str] = []
    ctx = cluster.context("spark-a", options=options(progress_note=notes.append))
    assert models.Download(RECIPE, *ARGS).apply(ctx, Change("download", payload=[MODEL])) == \
        f"downloaded {MODEL}"
    assert notes[0] == (f"        ! spark-a: `hf download --dry-run` gave no size for {MODEL}; "
                        "free space not checked before the download")


def test_a_failed_download_says_why_and_hints_at_the_token(fake_cluster: Callable[..., FakeCluster]) -> None:
    cluster = fake_cluster()
    head = cluster["spark-a"]
    head.on("hf download", 1, "", "401 Client Error: gated repo\n")
    ctx = cluster.context("spark-a", options=options())

    with pytest.raises(SparkctlError) as raised:
        models.Download(RECIPE, *ARGS).apply(ctx, Change("download", payload=[MODEL, DRAFT]))

    text = str(raised.value)
    assert text.startswith(f"spark-a: download of {MODEL} failed (exit 1) (no HF token was given")
    assert text.endswith("401 Client Error: gated repo")
    # no token to write; the size check (--dry-run, refused too: unchecked), the download of
    # the first model, never the second; then the token removal all the same
    dry_run, download, cleanup = head.calls
    assert "--dry-run" in dry_run.command and DRAFT not in download.command
    assert cleanup.command == models.token_remove_cmd()

    head.rules.clear()
    head.on("hf download", 2, "", "disk full")
    ctx = cluster.context("spark-a", options=options(hf_token=Secret("t")))
    with pytest.raises(SparkctlError, match=r"failed \(exit 2\):\ndisk full") as raised:
        models.Download(RECIPE, *ARGS).apply(ctx, Change("download", payload=[MODEL]))
    assert "no HF token" not in str(raised.value)
    assert head.commands[-1] == models.token_remove_cmd()


def test_a_leftover_token_is_only_removed(fake_cluster: Callable[..., FakeCluster], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = fake_cluster()
    ctx = cluster.context("spark-a", options=options(hf_token=Secret("t")))
    assert models.Download(RECIPE, *ARGS).apply(ctx, Change("rm", payload=[])) == \
        "removed a leftover HF token file"
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


def test_distribute_copies_only_what_differs_and_verifies(
        fake_cluster: Callable[..., FakeCluster], remotes: Remotes) -> None:
    head = head_manifests()
    # spark-b has the draft and the model's config, not its weights
    before = {MODEL: hub_entry({"config.json": 10}), DRAFT: local_entry()}
    cluster = fake_cluster(facts={"spark-a": facts_of(head), "spark-b": facts_of(before)})
    outcome = models.Distribute(RECIPE, *ARGS).check(cluster.context("spark-a"))
    assert isinstance(outcome, Change) and outcome.payload == ["spark-b"]
    assert outcome.summary == f"copy over the fabric: {MODEL} -> spark-b"

    cluster["spark-a"].on(MANIFEST, stdout=json.dumps(head))
    cluster["spark-b"].on(MANIFEST, stdout=json.dumps(head))  # after the copy: identical
    remotes.has["spark-b"] = {sha("config.json", 10), sha("config.json", 5_000_000)}
    notes: list[str] = []
    ctx = cluster.context("spark-a", options=options(progress_note=notes.append))

    message = models.Distribute(RECIPE, *ARGS).apply(ctx, outcome)

    # the head's manifest with chunk hashes (the receiver checks every chunk against them)
    (head_manifest,) = cluster["spark-a"].calls
    assert json.loads(shlex.split(head_manifest.command)[-1])["chunks"] is True
    # one receiver on the peer for every repository, listening on its fabric address only,
    # with the head's plan (and a fresh one-time token) on stdin, never on the command line
    (receiver,) = remotes.of("recv")
    assert receiver.node == "spark-b"
    assert receiver.args == {"listen": "192.168.200.13", "streams": fanout.STREAMS, "watch": True}
    plan = receiver.stdin
    model, draft = plan["repos"]
    assert plan["chunk"] == 32 << 20
    assert model["root"] == models.HUB_DIR and model["links"] == head[MODEL]["links"]
    assert model["refs"] == {f"{FOLDER}/refs/main": COMMIT}
    assert [f["rel"] for f in model["files"]] == sorted(head[MODEL]["blobs"])
    assert model["files"][1] == {"rel": f"{FOLDER}/blobs/model.safetensors",
                                 **head[MODEL]["blobs"][f"{FOLDER}/blobs/model.safetensors"]}
    assert draft["root"] == DRAFTS and [f["rel"] for f in draft["files"]] == \
        [f"{DRAFT_FOLDER}/config.json"]
    assert re.fullmatch("[0-9a-f]{32}", plan["token"]) and plan["token"] not in receiver.command
    # one sender, on the head, for the model's weights only (the draft was already right),
    # with as many streams as the receiver said it waits for
    (sender,) = remotes.of("send")
    assert sender.node == "spark-a"
    # started before the receiver was ready; both stop when their stdin ends (controller gone)
    assert sender.args == {"host": "192.168.200.13", "watch": True}
    assert sender.stdin == {"token": plan["token"], "need": [[1, 0, BIG]], "files": [
        [models.HUB_DIR, f"{FOLDER}/blobs/config.json"],
        [models.HUB_DIR, f"{FOLDER}/blobs/model.safetensors"],
        [DRAFTS, f"{DRAFT_FOLDER}/config.json"]], "port": 4242, "streams": 2}
    assert sender.stdin["token"] not in sender.command
    assert all(r.closed for r in remotes.started)
    # verified: the peer's manifest read again after the copy
    assert len([c for c in cluster["spark-b"].calls if "manifest" in c.command]) == 1
    assert message is not None and message.startswith(
        "copied spark-b: 300.00 GB in ") and ", 5.0 MB already there; " in message
    # the sender's own seconds (process start-up excluded): the rate comparable with iperf3
    assert "; on the wire 2.00 s (150.00 GB/s), CPU 97% busy there; " in message
    figures = ctx.shared.report_extra["fanout"]["spark-b"]  # `--json`'s "fanout"
    assert figures["wire_seconds"] == 2.0 and figures["receiver_cpu_busy"] == 0.97
    assert message.endswith(f"identical on spark-a, spark-b: {MODEL}@c0ffee: 2 files, 300.00 GB; "
                            f"{DRAFT}@local: 1 files, 5.0 MB")
    assert figures["bytes_copied"] == BIG and figures["bytes_total"] == BIG + 10 + 5_000_000
    assert notes[-1].startswith("        → spark-b: 300.00 GB / 300.00 GB (")


def test_a_local_dir_model_is_copied_into_its_dir(
        fake_cluster: Callable[..., FakeCluster], remotes: Remotes) -> None:
    # (was: a local dir was removed and copied whole with tar; now its files are fanned out
    # like the cache's, into the same folder on the peer, and only the stale file is sent)
    head = {MODEL: hub_entry(), DRAFT: local_entry({"config.json": 400, "model.safetensors": 7000,
                                                    ".cache/huggingface/download/x.metadata": 9})}
    cluster = fake_cluster()
    cluster["spark-a"].on(MANIFEST, stdout=json.dumps(head))
    cluster["spark-b"].on(MANIFEST, stdout=json.dumps(head))
    remotes.has["spark-b"] = {sha("config.json", 10), sha("model.safetensors", BIG),
                              sha("model.safetensors", 7000),
                              sha(".cache/huggingface/download/x.metadata", 9)}

    models.Distribute(RECIPE, *ARGS).apply(cluster.context("spark-a", options=options()),
                                    Change("copy", payload=["spark-b"]))

    draft = remotes.of("recv")[0].stdin["repos"][1]
    assert draft["root"] == DRAFTS and draft["links"] == {} and draft["refs"] == {}
    assert [f["rel"] for f in draft["files"]] == [
        f"{DRAFT_FOLDER}/.cache/huggingface/download/x.metadata", f"{DRAFT_FOLDER}/config.json",
        f"{DRAFT_FOLDER}/model.safetensors"]
    (sender,) = remotes.of("send")  # (the model's two files come first, then the draft's)
    assert sender.stdin["files"][3] == [DRAFTS, f"{DRAFT_FOLDER}/config.json"]
    assert sender.stdin["need"] == [[3, 0, 400]]


def test_a_copy_that_did_not_take_is_an_error(
        fake_cluster: Callable[..., FakeCluster], remotes: Remotes) -> None:
    head = head_manifests()
    short = hub_entry({"config.json": 10})
    cluster = fake_cluster()
    cluster["spark-a"].on(MANIFEST, stdout=json.dumps(head))
    cluster["spark-b"].on(MANIFEST, stdout=json.dumps({MODEL: short, DRAFT: head[DRAFT]}))

    with pytest.raises(SparkctlError, match=rf"spark-b: {MODEL} still differs from spark-a after the "
                                            r"copy \(1 vs 2 files\); run launch again"):
        models.Distribute(RECIPE, *ARGS).apply(cluster.context("spark-a", options=options()),
                                        Change("copy", payload=["spark-b"]))
    assert remotes.of("send")  # the copy ran, and said it was done

    # same names and sizes, one sha256 differs: not identical either
    wrong = hub_entry()
    wrong["blobs"][f"{FOLDER}/blobs/model.safetensors"]["sha256"] = "bad"
    cluster["spark-b"].rules.clear()
    cluster["spark-b"].on(MANIFEST, stdout=json.dumps({MODEL: wrong, DRAFT: head[DRAFT]}))
    with pytest.raises(SparkctlError, match="still differs"):
        models.Distribute(RECIPE, *ARGS).apply(cluster.context("spark-a", options=options()),
                                        Change("copy", payload=["spark-b"]))


def distribute_error(fake_cluster: Callable[..., FakeCluster], remotes: Remotes,
                     head: dict[str, Any] | None = None) -> str:
    cluster = fake_cluster()
    cluster["spark-a"].on(MANIFEST, stdout=json.dumps(head or head_manifests()))
    cluster["spark-b"].on(MANIFEST, stdout=json.dumps(head_manifests()))
    with pytest.raises(SparkctlError) as raised:
        models.Distribute(RECIPE, *ARGS).apply(cluster.context("spark-a", options=options()),
                                        Change("copy", payload=["spark-b"]))
    assert all(r.closed for r in remotes.started)  # receiver and sender always ended
    assert not [c for c in cluster["spark-b"].calls if "manifest" in c.command]  # no verify
    return str(raised.value)


def test_a_failing_copy_or_manifest_fails_the_step(
        fake_cluster: Callable[..., FakeCluster], remotes: Remotes) -> None:
    ready = {"port": 4242, "need": [[1, 0, BIG]], "need_bytes": BIG, "have": 10, "total": BIG + 10,
             "streams": 2}
    remotes.recv = [{"error": "space", "need": BIG, "free": 100 * GB, "path": models.HUB_DIR}]
    assert distribute_error(fake_cluster, remotes) == (
        f"spark-b: not enough disk space for the copy: need 300.00 GB at {models.HUB_DIR}, "
        "100.00 GB free; free some space on spark-b and run launch again")
    # the sender was started beside the receiver, never given a job, and ended (closed)
    assert [(r.stdin, r.closed) for r in remotes.of("send")] == [({}, True)]

    remotes.recv = []  # the receiver died before saying anything
    assert distribute_error(fake_cluster, remotes) == \
        "spark-b: the fan-out receiver did not start: Traceback: boom"

    remotes.recv = [{"error": "inspect", "message": "Permission denied"}]
    assert distribute_error(fake_cluster, remotes) == \
        "spark-b: cannot check the model files: Permission denied"

    remotes.recv = [ready, {"error": "space", "need": 5 * GB, "free": 0, "path": models.HUB_DIR,
                            "message": "No space left on device"}]
    assert distribute_error(fake_cluster, remotes) == (
        f"spark-b: not enough disk space (the disk filled up during the copy: No space left on "
        f"device): need 5.00 GB at {models.HUB_DIR}, 0.0 MB free; free some space on spark-b and "
        "run launch again")

    remotes.recv = [ready, {"error": "io", "message": "chunk at 0 arrived corrupted"}]
    assert distribute_error(fake_cluster, remotes) == \
        "spark-b: copy failed on the receiving side: chunk at 0 arrived corrupted"

    remotes.recv = [ready, {"done": True, "received": BIG}]
    remotes.send = [{"sent": 10}, {"error": "send", "message": "ConnectionResetError: reset"}]
    assert distribute_error(fake_cluster, remotes) == \
        "spark-b: copy from the head failed: ConnectionResetError: reset"

    remotes.recv, remotes.send = [ready], [{"sent": BIG, "done": True}]
    assert distribute_error(fake_cluster, remotes) == \
        "spark-b: the receiver ended without finishing: Traceback: boom"

    # the fabric link went away (a pulled cable): the node, the link and what to look at
    hint = (". Is the cable in and the link up? `sparkctl status` shows each link, `sparkctl "
            "netcheck` tests them; the next launch resumes the copy with only the rest")
    link = "spark-b: the model copy over the fabric link spark-a enp1s0f1np1 -> spark-b " \
           "enp1s0f1np1 (192.168.200.13) stopped: "
    remotes.recv, remotes.send = [{"error": "listen", "link": True,
                                   "message": "Cannot assign requested address"}], []
    assert distribute_error(fake_cluster, remotes) == (
        link + "the receiver cannot listen on 192.168.200.13: Cannot assign requested address"
        + hint)
    remotes.recv = [ready, {"error": "io", "link": True,
                            "message": "the sender went silent mid-chunk"}]
    remotes.send = [{"sent": GB}]
    assert distribute_error(fake_cluster, remotes) == (
        link + "the receiver on spark-b: the sender went silent mid-chunk (1.00 GB of 300.00 GB "
        "sent)" + hint)
    remotes.recv = [ready, {"done": True, "received": BIG}]
    remotes.send = [{"sent": GB}, {"error": "send", "link": True, "sent": GB,
                                   "message": "Network is unreachable"}]
    assert distribute_error(fake_cluster, remotes) == (
        link + "the sender on spark-a: Network is unreachable (1.00 GB of 300.00 GB sent)" + hint)

    remotes.recv = [ready, {"done": True, "received": BIG}]
    remotes.started.clear()
    absent = dict(head_manifests(), **{MODEL: hub_entry({}, present=False, commit=None)})
    assert distribute_error(fake_cluster, remotes, absent) == \
        f"spark-a: {MODEL} is not complete on the head (no config.json)"
    assert not remotes.started

    cluster = fake_cluster()
    cluster["spark-a"].on(MANIFEST, answer=lambda call: (1, "", "Error: No such container"))
    with pytest.raises(CommandError, match="No such container"):
        models.Distribute(RECIPE, *ARGS).apply(cluster.context("spark-a", options=options()),
                                        Change("copy", payload=["spark-b"]))
    assert [c.display for c in cluster["spark-a"].calls] == [
        f"docker run --rm {TOOLS.image} python3 -c <model manifest>"]


def test_a_head_without_the_model_is_copied_from_after_download(
        fake_cluster: Callable[..., FakeCluster]) -> None:
    head = head_manifests()
    missing = dict(head, **{MODEL: hub_entry({}, present=False, commit=None)})
    cluster = fake_cluster(facts={"spark-a": facts_of(missing), "spark-b": facts_of(missing)})
    outcome = models.Distribute(RECIPE, *ARGS).check(cluster.context("spark-a"))
    # equal but absent on both: still a copy (after the download, the head has it)
    assert isinstance(outcome, Change) and outcome.payload == ["spark-b"]
    assert outcome.summary == f"copy over the fabric: {MODEL} -> spark-b"

    same = facts_of(head)
    outcome = models.Distribute(RECIPE, *ARGS).check(cluster.context("spark-a", {"spark-a": same,
                                                                          "spark-b": same}))
    assert isinstance(outcome, Unchanged) and outcome.reason.startswith("identical on spark-a, spark-b")


def test_sizes_read_in_mb_or_gb() -> None:
    assert models.gb(5_000_000) == "5.0 MB"
    assert models.gb(99_999_999) == "100.0 MB"
    assert models.gb(100_000_000) == "0.10 GB"
    assert models.gb(130e9) == "130.00 GB"


def test_the_manifest_command_is_checked(fake_cluster: Callable[..., FakeCluster]) -> None:
    cluster = fake_cluster()
    cluster["spark-a"].on(MANIFEST, stdout=json.dumps({"x": 1}), times=1)
    assert models.read_manifests(cluster["spark-a"], TOOLS, RECIPE) == {"x": 1}  # type: ignore[arg-type]
    call: Call = cluster["spark-a"].calls[0]
    assert call.timeout == 3600
    assert call.display == f"docker run --rm {TOOLS.image} python3 -c <model manifest>"
    assert shlex.split(call.command)[:3] == ["docker", "run", "--rm"]
    cluster["spark-a"].on(MANIFEST, 1, "", "python3: not found", times=1)
    with pytest.raises(CommandError, match="python3: not found"):
        models.read_manifests(cluster["spark-a"], TOOLS, RECIPE)  # type: ignore[arg-type]
    # nothing printed with exit 0 (an attached docker run that lost its output): named, not a
    # JSONDecodeError reported as an internal error
    cluster["spark-a"].on(MANIFEST, 0, "", "")
    with pytest.raises(SparkctlError, match="spark-a: the model manifest printed no JSON"):
        models.read_manifests(cluster["spark-a"], TOOLS, RECIPE)  # type: ignore[arg-type]


def test_several_peers_get_a_total_beside_their_own_lines() -> None:
    b = fanout.PeerCopy("spark-b", total=2 * GB, sent=2 * GB, seconds=2.0, wire=1.9, cpu_busy=0.5)
    c = fanout.PeerCopy("spark-c", total=2 * GB, had=1 * GB, sent=1 * GB, seconds=1.0)
    assert fanout.copied_line([b, c], 2.5) == (
        "3.00 GB to 2 peers in 2.50 s (1.20 GB/s in all): "
        "spark-b: 2.00 GB in 2.00 s (1.00 GB/s); on the wire 1.90 s (1.05 GB/s), CPU 50% busy "
        "there; spark-c: 1.00 GB in 1.00 s (1.00 GB/s), 1.00 GB already there")
    # hundredths below 10 s (a sub-second copy's rate needs them), tenths above
    assert fanout.seconds(0.654) == "0.65 s" and fanout.seconds(123.45) == "123.5 s"
    # one peer (or one that needed anything): its own line is the whole story
    idle = fanout.PeerCopy("spark-c", total=2 * GB)
    assert fanout.copied_line([b, idle], 2.5) == b.line() + "; " + idle.line()
    assert idle.line() == "spark-c: nothing to copy (2.00 GB already there)"


def test_the_models_fact_hashes_with_the_nodes_python_not_a_container() -> None:
    """Every launch gathers the manifest up front: in the HF cache it is the node's python3 over
    the cluster user's cache (no `docker run`, about a second of a node's CPU), still NO_IMAGE
    while the image is absent (the token check needs it next); a model in a local folder, a
    path in the models container, is still read there."""
    hf_only = load_recipe("lab-tiny-llama")
    fact = models.manifest_fact(TOOLS, hf_only)
    assert fact.request()["gates"]["models"]["run_while"] == "present"
    assert fact.command.startswith("python3 -c ") and "docker run" not in fact.command
    args = json.loads(shlex.split(fact.command)[-1])
    assert args["hub"] == f"~{TOOLS.user}/.cache/huggingface/hub"
    assert [r["repo"] for r in args["repos"]] == [hf_only.model]
    assert "docker run --rm" in models.manifest_fact(TOOLS, RECIPE).command  # its draft: a local dir
