"""`sparkctl advise --measure` with the REAL llama.cpp (llama-server, rpc-server and the tiny GGUF
the lab builds): a llama.cpp server runs before (`keep`, on the second node); advise times the
first node's memory copy (the prediction's bandwidth: the lab decodes on the CPU), then launches
single, the RPC layer split over both nodes and two replicas in turn, benches each with the same
cells, prints predicted beside measured, picks the best measured for the goal, and `keep` runs
again afterwards, nothing else."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import Lab, run_sparkctl

pytestmark = pytest.mark.lab


def sparkctl(*args: str) -> subprocess.CompletedProcess[str]:
    return run_sparkctl("advise-llamacpp", *args)


def test_measure_real_llamacpp_layouts_and_restore(lab: Lab) -> None:
    inventory = ["--inventory", str(lab.inventory)]
    sparkctl("down", *inventory, "--yes")
    up = sparkctl("up", *inventory, "--yes")
    assert up.returncode == 0, up.stdout + up.stderr
    head, other = lab.nodes
    keep = sparkctl("launch", "lab-tiny-llama", *inventory, "--nodes", other, "--name", "keep",
                    "--yes", "--timeout", "120")
    assert keep.returncode == 0, keep.stdout + keep.stderr

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

    status = json.loads(sparkctl("status", *inventory, "--json").stdout)
    running = {(s["name"], s["node"]) for s in status["servers"]}
    assert running == {("keep", other)}, status["servers"]
    sparkctl("down", *inventory, "--yes")
