"""`sparkctl advise --measure` on the lab with the simulated SGLang: a server runs before
(`keep`, on the second node); advise launches the layouts of qwen3-8b on two nodes in turn
(single, TP 2 and two replicas: --layouts leaves PP 2 out), benches the same cells on each,
prints predicted beside measured, picks the best measured, and `keep` runs again afterwards,
nothing else."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import Lab, run_sparkctl

pytestmark = pytest.mark.lab


def sparkctl(*args: str) -> subprocess.CompletedProcess[str]:
    return run_sparkctl("advise", *args)


def test_measure_launches_each_layout_benches_it_and_restores_what_ran(lab: Lab) -> None:
    inventory = ["--inventory", str(lab.inventory)]
    sparkctl("down", *inventory, "--yes")
    up = sparkctl("up", *inventory, "--yes")
    assert up.returncode == 0, up.stdout + up.stderr
    head, other = lab.nodes
    keep = sparkctl("launch", "qwen3-8b", *inventory, "--nodes", other, "--name", "keep", "--yes",
                    "--timeout", "120")
    assert keep.returncode == 0, keep.stdout + keep.stderr

    run = sparkctl("advise", "qwen3-8b", "--nodes", "2", "--goal", "throughput", "-c", "2",
                   "--layouts", "single,tp,replicas", "--measure", "--yes", "--json",
                   "--tg", "16", "--pp", "64", *inventory,
                   "--timeout", "120")
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads(run.stdout)
    assert doc["goal"] == "throughput" and doc["basis"] == "measured"
    measured = [a for a in doc["layouts"] if a.get("measured") and not a["measured"]["error"]]
    assert {a["layout"] for a in measured} == {"single", "tp2", "replicas x2"}, doc["layouts"]
    for entry in measured:
        m, p = entry["measured"], entry["predicted"]
        assert m["tg_c1"] > 0 and m["tg_aggregate"] > 0 and p["tg_c1"] > 0
    best = max(measured, key=lambda a: a["measured"]["tg_aggregate"])
    assert doc["pick"] == best["layout"]
    # the replicas were two servers on their own nodes, the aggregate their sum
    assert "replicas x2: launching qwen3-8b-r2 on " + other in run.stderr
    assert "keep" in run.stderr and "restored: keep run again" in doc["notes"][-1]

    status = json.loads(sparkctl("status", *inventory, "--json").stdout)
    running = {(s["name"], s["node"]) for s in status["servers"]}
    assert running == {("keep", other)}, status["servers"]
    assert head not in {s["node"] for s in status["servers"]}

    text = sparkctl("advise", "qwen3-8b", "--nodes", "2")
    assert text.returncode == 0 and "pick:" in text.stdout and "meas" not in text.stdout
    sparkctl("down", *inventory, "--yes")
