"""Unified memory on the lab: the preflight refuses before any download, the memory guard stops
a server whose node runs out of memory while it loads (and the node keeps answering).

The lab's nodes have a memory cgroup each, shown scaled as a Spark's 128 GB in /proc/meminfo
(docs/lab.md); the simulated engine really allocates its estimate while loading.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest
from conftest import REPO, Lab, Sparkctl, fresh_up

pytestmark = pytest.mark.lab

SENTINEL = "hf_SENTINELe2eToken7731"
OUTBOX = "cat /var/lib/sparklab/outbox/hf-downloads.log 2>/dev/null || true"
SERVER_DIR = "/var/lib/sparkctl/run/servers/qwen3-235b"  # the server's (named for its recipe)


sparkctl = Sparkctl("memory", token=SENTINEL, timeout=300)


@pytest.fixture(scope="module")
def mlab(lab_session: list[Lab]) -> Iterator[Lab]:
    # start from no server at all: an earlier module on this lab may have left one serving,
    # and its memory would change every figure below
    lab = fresh_up(lab_session, sparkctl)
    yield lab
    lab.cli("fault", "restore")
    sparkctl("down", "--inventory", str(lab.inventory), "--yes")


def test_nodes_show_a_sparks_memory(mlab: Lab) -> None:
    meminfo = mlab.exec(mlab.nodes[0], "cat /proc/meminfo").stdout
    total_kb = int(meminfo.split("MemTotal:")[1].split()[0])
    assert 127 * 1024**2 < total_kb <= 128 * 1024**2


def test_a_recipe_that_does_not_fit_now_is_refused_before_any_download(mlab: Lab) -> None:
    before = {node: mlab.exec(node, OUTBOX).stdout for node in mlab.nodes}
    squeeze = mlab.cli("fault", "squeeze-memory", "--node", mlab.nodes[1], "--size", "80G")
    assert squeeze.returncode == 0, squeeze.stderr
    try:
        result = sparkctl("launch", "qwen3-235b", "--inventory", str(mlab.inventory), "--yes")
    finally:
        mlab.cli("fault", "restore")
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert f"{mlab.nodes[1]}: the recipe does not fit in the memory available now" in out
    assert "MemAvailable" in out and "kv_cache_fraction" in out and "more nodes" in out
    assert {node: mlab.exec(node, OUTBOX).stdout for node in mlab.nodes} == before


def test_the_guard_stops_a_server_when_memory_runs_out_while_loading(mlab: Lab) -> None:
    mlab.set_engine_load_seconds(20)
    # the threshold from the command line (the default, 2 GB, is what NVIDIA's setup leaves room
    # for; 4 GB makes the squeeze below certain to cross it whatever the KV cache took)
    argv, env = sparkctl.command("launch", "qwen3-235b", "--inventory", str(mlab.inventory),
                              "--yes", "--timeout", "120", "--guard-min-available-gb", "4")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=REPO)
    try:
        victim = mlab.nodes[1]
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline:  # the ranks are loading
            if "loading weights" in mlab.exec(
                    victim, f"cat {SERVER_DIR}/rank-1.log 2>/dev/null || true").stdout:
                break
            time.sleep(1)
        squeeze = mlab.cli("fault", "squeeze-memory", "--node", victim, "--size", "40G")
        assert squeeze.returncode == 0, squeeze.stderr
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
        mlab.set_engine_load_seconds(3)
    out = stdout + stderr
    assert proc.returncode != 0, out
    assert "stopped by the memory guard on " + victim in out, out
    assert "GB available <" in out
    # the node never froze: SSH answers, and the guard's record names the figures
    record = json.loads(mlab.ssh(victim, f"cat {SERVER_DIR}/memguard-stopped.json").stdout)
    assert record["node"] == victim and record["available_gb"] < record["min_available_gb"]
    status = sparkctl("status", "--inventory", str(mlab.inventory), "--json")
    state = json.loads(status.stdout)
    server = next(s for s in state["servers"] if s["name"] == "qwen3-235b")
    assert server["state"] == "guard-stopped", server
    problems = state["nodes"][mlab.nodes[0]]["problems"]
    assert any("qwen3-235b" in p and "stopped by the memory guard" in p for p in problems), problems
    mlab.cli("fault", "restore")
