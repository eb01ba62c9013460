"""`sparkctl advise --measure` on the lab with the simulated SGLang: a server runs before
(`keep`, on the second node); advise launches the layouts of qwen3-8b on two nodes in turn
(single, TP 2 and two replicas: --layouts leaves PP 2 out), benches the same cells on each,
prints predicted beside measured, picks the best measured, and `keep` runs again afterwards,
nothing else. Then the same with the REAL llama.cpp (llama-server, rpc-server and the tiny GGUF
the lab builds): single, the RPC layer split over both nodes and two replicas, predicted with
the first node's measured memory bandwidth (the lab's llama.cpp decodes on the CPU)."""

from __future__ import annotations

import json

import pytest
from conftest import Lab, Sparkctl

pytestmark = pytest.mark.lab


sparkctl = Sparkctl("advise")


def _keep_running(lab: Lab, recipe: str) -> list[str]:
    """A fresh `up`, then `keep` (RECIPE) on the second node: what advise must restore."""
    inventory = ["--inventory", str(lab.inventory)]
    sparkctl("down", *inventory, "--yes")
    up = sparkctl("up", *inventory, "--yes")
    assert up.returncode == 0, up.stdout + up.stderr
    keep = sparkctl("launch", recipe, *inventory, "--nodes", lab.nodes[1], "--name", "keep",
                    "--yes", "--timeout", "120")
    assert keep.returncode == 0, keep.stdout + keep.stderr
    return inventory


def _only_keep_runs(lab: Lab, inventory: list[str]) -> None:
    status = json.loads(sparkctl("status", *inventory, "--json").stdout)
    running = {(s["name"], s["node"]) for s in status["servers"]}
    assert running == {("keep", lab.nodes[1])}, status["servers"]


def test_measure_launches_each_layout_benches_it_and_restores_what_ran(lab: Lab) -> None:
    inventory = _keep_running(lab, "qwen3-8b")
    other = lab.nodes[1]

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

    _only_keep_runs(lab, inventory)

    text = sparkctl("advise", "qwen3-8b", "--nodes", "2")
    assert text.returncode == 0 and "pick:" in text.stdout and "meas" not in text.stdout
    sparkctl("down", *inventory, "--yes")


def test_measure_real_llamacpp_layouts_and_restore(lab: Lab) -> None:
    inventory = _keep_running(lab, "lab-tiny-llama")
    head, other = lab.nodes

    run = sparkctl("advise", "lab-tiny-llama-rpc", "--nodes", "2", "--goal", "throughput",
                   "-c", "2", "--memory-bandwidth", "measure", "--measure", "--yes", "--json",
                   "--tg", "16", "--pp", "32", *inventory, "--timeout", "120")
    assert run.returncode == 0, run.stdout + run.stderr
    doc = json.loads(run.stdout)
    assert doc["engine"] == "llamacpp" and doc["basis"] == "measured"
    # the prediction used the node's own measured bandwidth, not a Spark's 273 GB/s
    assert doc["hardware"]["bandwidth_gbs"] != 273.0, doc["hardware"]
    assert f"measured on {head}" in doc["hardware"]["sources"][0]
    measured = [a for a in doc["layouts"] if a.get("measured") and not a["measured"]["error"]]
    assert len(measured) >= 2, doc["layouts"]
    assert {"single", "pp2"} <= {a["layout"] for a in measured}, doc["layouts"]
    for entry in measured:
        assert entry["measured"]["tg_c1"] > 0 and entry["measured"]["tg_aggregate"] > 0
        assert entry["predicted"]["tg_c1"] > 0
    best = max(a["measured"]["tg_aggregate"] for a in measured)
    picked = next(a for a in measured if a["layout"] == doc["pick"])
    # the best measured, or within 3 % of it on fewer nodes (advise's tie rule)
    assert picked["measured"]["tg_aggregate"] >= best * 0.97, doc
    assert any(n.startswith("measured / predicted:") for n in doc["notes"]), doc["notes"]
    # the RPC split really spanned both nodes: rpc-server on the second, llama-server on the first
    assert f"pp2: launching lab-tiny-llama-rpc on {head}, {other}" in run.stderr
    assert "restored: keep run again" in doc["notes"][-1]

    _only_keep_runs(lab, inventory)
    sparkctl("down", *inventory, "--yes")
