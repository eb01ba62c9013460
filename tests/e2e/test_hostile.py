"""What a second hostile first hour found (issue 27), on the lab: a port taken on one node is
refused in preflight, on that node's step, before any model moves, for every engine and every
port the server binds (HTTP, Ray's GCS, SGLang's dist-init).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator

import pytest
from conftest import REPO, Lab, e2e_state, healthy_lab

pytestmark = pytest.mark.lab

SPARKCTL = str(REPO / ".venv" / "bin" / "sparkctl")


def sparkctl(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPARKCTL_STATE_DIR": e2e_state("hostile"), "HF_TOKEN": "hf_e2eHostile1"}
    return subprocess.run([SPARKCTL, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=REPO)


@pytest.fixture(scope="module")
def hlab(lab_session: list[Lab]) -> Iterator[Lab]:
    lab = healthy_lab(lab_session)
    sparkctl("down", "--inventory", str(lab.inventory), "--yes")
    up = sparkctl("up", "--inventory", str(lab.inventory), "--yes")
    assert up.returncode == 0, up.stdout + up.stderr
    yield lab
    lab.cli("fault", "restore")
    sparkctl("down", "--inventory", str(lab.inventory), "--yes")


def steps(report: dict, node: str) -> dict[str, dict]:
    return {f"{s['phase']}/{s['step']}": s for s in report["hosts"][node]["steps"]}


@pytest.mark.parametrize(("recipe", "extra", "where", "port", "what"), [
    ("qwen3-8b", ["--nodes", "{other}"], "{other}", 30000, "HTTP"),  # SGLang placed on the worker
    ("minimax-m2.7", [], "{head}", 6379, "Ray GCS"),  # vLLM's Ray head
    ("qwen3.6-27b-tp2", [], "{head}", 20000, "dist-init"),  # SGLang across both nodes
    ("qwen3-235b", [], "{head}", 8355, "HTTP"),  # TensorRT-LLM
])
def test_a_taken_port_is_refused_in_preflight_on_its_own_nodes_step(
        hlab: Lab, recipe: str, extra: list[str], where: str, port: int, what: str) -> None:
    head, other = hlab.nodes
    node = where.format(head=head, other=other)
    hlab.cli("fault", "occupy-port", "--node", node, "--port", str(port), check=True)
    try:
        result = sparkctl("launch", recipe, "--inventory", str(hlab.inventory), "--yes", "--json",
                          "--timeout", "120", *[e.format(other=other) for e in extra])
    finally:
        hlab.cli("fault", "restore", check=True)
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    failed = steps(report, node)["port-check/ports"]
    assert failed["status"] == "failed"
    assert f"{node}: port {port} ({what}) is taken by python3 (pid " in failed["message"]
    assert "Nothing was started or downloaded" in failed["message"]
    # the other node's own step is not blamed, and nothing after preflight ran anywhere
    peer = other if node == head else head
    assert steps(report, peer)["port-check/ports"]["status"] == "ok"
    ran = {key.split("/")[0] for n in hlab.nodes for key in steps(report, n)}
    assert ran == {"port-check"}, ran
