"""`launch --verify-models` / `status --deep` (phases/verify_models.py): a model blob changed
in place with its size and mtime kept is invisible to the fan-out's hash cache; a re-hash sees
it, on the node where it happened (issue 27, item 7)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import cluster_of, make_inventory, model_args, node_facts

from orchestrator.core.step import Change, NodeContext, RunOptions, RunState, Unchanged
from orchestrator.engines import load_recipe
from orchestrator.errors import SparkctlError
from orchestrator.node import fanout as node
from orchestrator.phases import verify_models

REPO = "org/m"
COMMIT = "c0ffee" * 6 + "abcd"


def make_hub(hub: Path) -> Path:
    """One LFS blob named by its sha256, as the hub stores it; returns its path."""
    full = hub / "models--org--m"
    data = os.urandom(4096)
    sha = hashlib.sha256(data).hexdigest()
    for d in ("blobs", "refs", f"snapshots/{COMMIT}"):
        (full / d).mkdir(parents=True, exist_ok=True)
    (full / "blobs" / sha).write_bytes(data)
    (full / "blobs" / "cfg").write_bytes(b'{"a": 1}\n')
    (full / "snapshots" / COMMIT / "model.safetensors").symlink_to(f"../../blobs/{sha}")
    (full / "snapshots" / COMMIT / "config.json").symlink_to("../../blobs/cfg")
    (full / "refs" / "main").write_text(COMMIT)
    return full / "blobs" / sha


def manifest(hub: Path, **extra: Any) -> dict[str, Any]:
    result = subprocess.run([sys.executable, str(Path(node.__file__)), "manifest", json.dumps(
        {"hub": str(hub), "chunks": False, "repos": [{"repo": REPO, "revision": "main"}],
         **extra})], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def corrupt_keeping_mtime(blob: Path) -> None:
    before = blob.stat()
    data = bytearray(blob.read_bytes())
    data[100] ^= 0xFF
    blob.write_bytes(bytes(data))
    os.utime(blob, ns=(before.st_atime_ns, before.st_mtime_ns))


def sha_of(found: dict[str, Any]) -> str:
    entry = found[REPO]
    return str(entry["blobs"][entry["files"]["model.safetensors"]]["sha256"])


def test_the_cache_misses_an_in_place_change_and_a_rehash_sees_it(tmp_path: Path) -> None:
    blob = make_hub(tmp_path)
    first = manifest(tmp_path)  # hashes and caches
    corrupt_keeping_mtime(blob)
    assert sha_of(manifest(tmp_path)) == sha_of(first)  # the fast path trusts size/mtime/inode
    checked = manifest(tmp_path, rehash=True, save=False)
    assert sha_of(checked) != sha_of(first)
    assert checked[REPO]["misnamed"] == [str(blob.relative_to(tmp_path))]
    assert sha_of(manifest(tmp_path)) == sha_of(first)  # save=False: status --deep changes nothing
    manifest(tmp_path, rehash=True)  # --verify-models corrects the cache
    assert sha_of(manifest(tmp_path)) == sha_of(checked)


def facts_of(found: dict[str, Any]) -> dict[str, Any]:
    return {"commands": {"rehash": {"rc": 0, "out": json.dumps(found), "err": ""}}}


def test_the_step_names_the_files_that_differ_on_their_node(tmp_path: Path) -> None:
    head_hub, peer_hub = tmp_path / "head", tmp_path / "peer"
    make_hub(head_hub)
    head = manifest(head_hub)
    peer_hub.mkdir()
    subprocess.run(["cp", "-a", f"{head_hub}/.", str(peer_hub)], check=True)
    peer_blob = next((peer_hub / "models--org--m" / "blobs").glob("[0-9a-f]" * 8 + "*"))
    corrupt_keeping_mtime(peer_blob)
    peer = manifest(peer_hub, rehash=True, save=False)
    inventory = make_inventory()
    cluster = cluster_of({"spark-a": facts_of(head), "spark-b": facts_of(peer)})
    recipe = load_recipe("qwen3-235b")
    step = verify_models.VerifyModels(recipe, model_args(recipe)[1])

    def ctx(name: str) -> NodeContext:
        return NodeContext(inventory, inventory.node(name), cluster[name], cluster, None,
                           RunOptions("launch"), RunState())
    assert step.check(ctx("spark-a")) == Unchanged("re-hashed 2 file(s): each matches its name")
    said = step.check(ctx("spark-b"))
    assert isinstance(said, Change)
    assert said.summary.startswith("1 file(s) differ from the head's though the hash cache said "
                                   "otherwise: org/m/model.safetensors")
    assert '"rehash": true' in said.commands[0] and '"save": true' in said.commands[0]
    # corrupt at the source (the head's blob is not what its name says): stop, name the file
    corrupt_keeping_mtime(next((head_hub / "models--org--m" / "blobs").glob("[0-9a-f]" * 8 + "*")))
    cluster["spark-a"] = node_facts(facts_of(manifest(head_hub, rehash=True, save=False)), "spark-a")
    with pytest.raises(SparkctlError, match=r"spark-a: 1 model file\(s\) do not match their sha256 "
                                            r"name, corrupt at the source"):
        step.check(ctx("spark-a"))


def test_the_phase_runs_first_only_when_asked() -> None:
    from orchestrator.core.step import Phase
    from orchestrator.phases.launch_checks import with_checks

    inventory = make_inventory()
    recipe = load_recipe("qwen3-235b")
    engine = [Phase("server-check", [], lambda i, n: {})]
    nodes, tools = model_args(recipe, inventory)
    assert [p.name for p in with_checks(engine, recipe, nodes, tools.image, inventory)] == [
        "port-check", "server-check"]
    assert [p.name for p in with_checks(engine, recipe, nodes, tools.image, inventory,
                                        verify_models=True)] == [
        "port-check", "verify-models", "server-check"]


def test_status_deep_says_so_when_every_hash_matches() -> None:
    # issue 41: `status --deep` printed nothing when every file matched (read as "not checked")
    from orchestrator.status.models import verified_lines

    checked = [{"server": "q", "nodes": {"spark-a": {"files": 3, "differ": [], "misnamed": []},
                                         "spark-b": {"files": 3, "differ": [], "misnamed": []}}},
               {"server": "r", "nodes": {"spark-a": {"files": 2, "differ": [], "misnamed": []},
                                         "spark-b": {"error": "unreachable"}}}]
    assert verified_lines(checked) == [
        "models of q: 3 file(s) re-hashed, identical on spark-a, spark-b",
        "models of r: 2 file(s) re-hashed, identical on spark-a; differ or not checked on "
        "spark-b (see the problems above)"]
    assert verified_lines([]) == ["models: no running server to check"]
