"""The REAL vLLM 0.31.0 on the simulated lab, the two-node recipe (lab-tiny-llama-vllm-tp2:
tensor parallel 2, a rank on each node), apart from the one-node module test_vllm_real.py (whose
lab fixture, with room for the real vLLM, it shares) so that the two run on two workers at once.
Chat; its second rank killed -> `status` exits 1 naming the server; a relaunch with `--persist`
recovers; the second node rebooted alone -> the first node's watcher restarts the server;
`down` leaves no vLLM process; the second node unreachable is refused before anything loads.
"""

from __future__ import annotations

import json
import time

import pytest
from conftest import Lab
from test_vllm_real import TP2, inv, lab, launched, sparkctl, vllm_processes

pytestmark = pytest.mark.lab

__all__ = ["lab"]  # the module-scoped fixture, imported: this module gets its own lab


def test_two_nodes_run_a_real_rank_each_and_a_dead_rank_is_seen(lab: Lab) -> None:
    head, other = lab.nodes
    # each node has its own /dev/shm, as two machines do: vLLM takes ranks that see each other's
    # shared memory for one machine's, and then waits forever on a local socket
    lab.exec(head, "touch /dev/shm/sparklab-e2e-probe")
    assert "sparklab-e2e-probe" not in lab.exec(other, "ls /dev/shm").stdout
    lab.exec(head, "rm /dev/shm/sparklab-e2e-probe")
    launched(sparkctl("launch", TP2, *inv(lab), "--yes", "--timeout", "400", timeout=700))
    for node in lab.nodes:
        assert any(real and c.startswith("VLLM::Worker") for _, real, c in vllm_processes(lab, node)), node
    rank1 = [p for p, _, c in vllm_processes(lab, other)
             if "--headless" in c and "vllm.entrypoints.cli.main serve" in c]
    assert rank1, vllm_processes(lab, other)
    env = lab.exec(other, f"tr '\\0' '\\n' < /proc/{rank1[0]}/environ").stdout.split("\n")
    assert "VLLM_CPU_OMP_THREADS_BIND=1" in env and "GLOO_SOCKET_IFNAME=enp1s0f1np1" in env
    assert "VLLM_HOST_IP=192.168.200.13" in env
    chat = sparkctl("chat", "Hello", *inv(lab), "--server", TP2, "--json")
    assert chat.returncode == 0 and json.loads(chat.stdout)["reply"].strip(), chat.stderr
    # the second node's rank dies; rank 0 still answers /health 200 (vLLM's own behaviour)
    lab.exec(other, f"kill -9 {rank1[0]}")
    deadline, status = time.monotonic() + 60, None
    while time.monotonic() < deadline:
        status = sparkctl("status", *inv(lab))
        if status.returncode == 1 and TP2 in status.stdout and "dead" in status.stdout:
            break
        time.sleep(3)
    assert status is not None and status.returncode == 1, status.stdout if status else None
    assert f"{TP2}" in status.stdout and other in status.stdout, status.stdout
    # --persist: the next test reboots the second node under it
    again = sparkctl("launch", TP2, *inv(lab), "--yes", "--persist", "--timeout", "400", timeout=700)
    launched(again)
    chat = sparkctl("chat", "Hello again", *inv(lab), "--server", TP2, "--json")
    assert chat.returncode == 0 and json.loads(chat.stdout)["reply"].strip(), chat.stderr


def test_persist_brings_the_two_node_server_back_after_the_second_node_reboots(lab: Lab) -> None:
    """The second node reboots alone: its rank dies, rank 0 still answers /health 200, docker
    brings the headless rank back, and it cannot join the running rank 0; the first node's
    watcher sees the rank's connections go and come back and restarts rank 0."""
    head, other = lab.nodes
    before = {p for p, _, c in vllm_processes(lab, head) if c.startswith("VLLM::EngineCore")}
    rebooted = lab.cli("reboot", "--node", other)
    assert rebooted.returncode == 0, rebooted.stdout + rebooted.stderr
    log = f"/var/log/sparkctl/boot-{TP2}.log"
    deadline, said = time.monotonic() + 900, ""
    while time.monotonic() < deadline:
        said = lab.exec(head, f"cat {log}").stdout
        if f"up: server {TP2} answers" in said.split("came back")[-1] and "came back" in said:
            break
        time.sleep(5)
    assert f"server {TP2}: the rank on {other} is gone" in said, said
    assert f"server {TP2}: the rank on {other} came back" in said, said
    assert said.rstrip().endswith(f"up: server {TP2} answers on 127.0.0.1:8000"), said[-2000:]
    after = {p for p, _, c in vllm_processes(lab, head) if c.startswith("VLLM::EngineCore")}
    assert after and not after & before, (before, after)  # rank 0 was restarted
    chat = sparkctl("chat", "Hello after the reboot", *inv(lab), "--server", TP2, "--json")
    assert chat.returncode == 0 and json.loads(chat.stdout)["reply"].strip(), chat.stderr
    status = json.loads(sparkctl("status", *inv(lab), "--json").stdout)
    (entry,) = [s for s in status["servers"] if s["name"] == TP2]
    assert entry["state"] == "healthy" and entry["persistent"] is True, entry


def test_down_leaves_no_vllm_process(lab: Lab) -> None:
    assert vllm_processes(lab, lab.nodes[1])  # the relaunched two-node server
    down = sparkctl("down", *inv(lab), "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    for node in lab.nodes:
        assert vllm_processes(lab, node) == [], node


def test_the_second_node_unreachable_is_refused_before_loading(lab: Lab) -> None:
    _, other = lab.nodes
    # after `down`: the model is on both nodes already, so the launch gets to the fabric check
    lab.cli("fault", "cut-cable", "--node", other, "--interface", "enp1s0f1np1", check=True)
    try:
        cut = sparkctl("launch", TP2, *inv(lab), "--yes", "--timeout", "120")
    finally:
        lab.cli("fault", "restore")
    assert cut.returncode != 0
    said = cut.stdout + cut.stderr
    assert f"{other}: " in said and "enp1s0f1np1" in said, said[-3000:]
    for node in lab.nodes:
        assert vllm_processes(lab, node) == [], node
