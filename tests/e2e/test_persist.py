"""Reboot survival on the lab: a `launch --persist` server answers again after both nodes are
rebooted (`lab reboot`: every process killed, /run and the fabric addresses lost, the disk
kept), without a new launch; `down` removes the boot units, and a further reboot brings nothing
back. Also `up --oom-guard`: earlyoom configured through the ledger, enabled, running, and gone
again after `down`.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest
from conftest import Lab, Sparkctl, fresh_up

pytestmark = pytest.mark.lab

RECIPE = "qwen3-235b"
UNIT = f"sparkctl-serve-{RECIPE}.service"
BOOT_LOG = f"/var/log/sparkctl/boot-{RECIPE}.log"


sparkctl = Sparkctl("persist", token="hf_e2ePersist1", timeout=300)


@pytest.fixture(scope="module")
def plab(lab_session: list[Lab]) -> Iterator[Lab]:
    lab = fresh_up(lab_session, sparkctl)
    yield lab
    sparkctl("down", "--inventory", str(lab.inventory), "--yes")


def models_answer(lab: Lab) -> subprocess.CompletedProcess[str]:
    return sparkctl("chat", "--inventory", str(lab.inventory), "--max-tokens", "8", "--json",
                    "Hello after the reboot", timeout=120)


def wait_for_chat(lab: Lab, seconds: float) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + seconds
    while True:
        answer = models_answer(lab)
        if answer.returncode == 0 or time.monotonic() > deadline:
            return answer
        time.sleep(3)


def last_boot(lab: Lab, node: str) -> str:
    """The node's latest boot log, once finished (the boot runs in the background after sshd)."""
    deadline = time.monotonic() + 60
    while True:
        boot = lab.exec(node, "cat /var/log/sparklab-boot.log").stdout.split("-- boot")[-1]
        if "boot finished" in boot or time.monotonic() > deadline:
            return boot
        time.sleep(1)


def reboot(lab: Lab) -> str:
    result = lab.cli("reboot")
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_a_persistent_server_answers_again_after_both_nodes_reboot(plab: Lab) -> None:
    inv = str(plab.inventory)
    launch = sparkctl("launch", RECIPE, "--inventory", inv, "--yes", "--persist", "--json")
    assert launch.returncode == 0, launch.stdout[-3000:] + launch.stderr[-3000:]
    steps = {(s["phase"], s["step"]) for h in json.loads(launch.stdout)["hosts"].values()
             for s in h["steps"]}
    assert ("persist", "boot-unit") in steps
    for node in plab.nodes:
        assert plab.exec(node, f"systemctl is-enabled {UNIT}").stdout.strip() == "enabled"
        policy = plab.exec(node, "docker inspect -f '{{.HostConfig.RestartPolicy.Name}}' "
                                 "trtllm-multinode").stdout.strip()
        assert policy == "unless-stopped"
    status = json.loads(sparkctl("status", "--inventory", inv, "--json").stdout)
    # a named server (its record in /var/lib/sparkctl/run/servers/qwen3-235b/ on the head)
    assert [(s["persistent"], s["nodes"]) for s in status["servers"] if s["name"] == RECIPE] == [
        (True, plab.nodes)]

    out = reboot(plab)
    assert all(f"{node}: booted" in out for node in plab.nodes), out
    head = plab.nodes[0]
    answer = wait_for_chat(plab, 180)
    assert answer.returncode == 0, answer.stdout + answer.stderr
    assert json.loads(answer.stdout)["completion_tokens"] > 0
    # the boot unit writes its "up:" line once its own probe answers, which may come a few
    # seconds after our chat did: wait for it rather than read the log once
    deadline, log = time.monotonic() + 60, ""
    while time.monotonic() < deadline:
        log = plab.exec(head, f"cat {BOOT_LOG}").stdout
        if "up: server" in log:
            break
        time.sleep(2)
    assert "fabric: " in log and "containers running: trtllm-multinode" in log
    assert "models present" in log and "memory: MemAvailable" in log
    # head last: it waited for its peer's sshd before starting mpirun
    assert log.index(f"ready: sshd in trtllm-multinode on {plab.nodes[1]}") < log.index(
        "started: mpirun")
    assert "up: server qwen3-235b answers on 127.0.0.1:8355" in log
    status = sparkctl("status", "--inventory", inv, "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    listed = {s["name"]: s for s in json.loads(status.stdout)["servers"]}
    assert listed[RECIPE]["state"] == "healthy" and listed[RECIPE]["persistent"] is True


def test_down_removes_the_persistence_and_a_reboot_brings_nothing_back(plab: Lab) -> None:
    inv = str(plab.inventory)
    down = sparkctl("down", "--inventory", inv, "--yes", "--json")
    assert down.returncode == 0, down.stdout + down.stderr
    messages = [s["message"] for h in json.loads(down.stdout)["hosts"].values()
                for s in h["steps"] if s["step"] == "boot-units"]
    assert len(messages) == 2 and all(f"disable and remove {UNIT}" in m for m in messages)
    assert all("trtllm-multinode (unless-stopped)" in m for m in messages), messages
    # the boot logs the reboot wrote are gone too, and verify says exactly what was kept
    verify = [s["message"] for h in json.loads(down.stdout)["hosts"].values()
              for s in h["steps"] if s["step"] == "verify"]
    assert verify == ["nothing else left; kept: the Hugging Face cache, the fabric network "
                      "(--network)"] * 2, verify
    for node in plab.nodes:
        assert plab.exec(node, f"systemctl is-enabled {UNIT}", check=False).returncode != 0
        assert plab.exec(node, f"ls /etc/systemd/system/{UNIT}", check=False).returncode != 0
        assert plab.exec(node, "ls /var/log/sparkctl/", check=False).returncode != 0, node
    reboot(plab)
    for node in plab.nodes:
        boot = last_boot(plab, node)
        assert "docker started" in boot and UNIT not in boot
        assert plab.exec(node, "docker ps -aq").stdout.strip() == ""
    answer = models_answer(plab)
    assert answer.returncode != 0


def test_up_oom_guard_runs_earlyoom_below_the_memory_guard_and_down_undoes_it(plab: Lab) -> None:
    inv = str(plab.inventory)
    up = sparkctl("up", "--inventory", inv, "--yes", "--oom-guard", "--json")
    assert up.returncode == 0, up.stdout + up.stderr
    node = plab.nodes[0]
    config = plab.exec(node, "cat /etc/default/earlyoom").stdout
    assert 'EARLYOOM_ARGS="-M 1048576,524288 -s 100,100' in config
    assert plab.exec(node, "systemctl is-active earlyoom").stdout.strip() == "active"
    # the running earlyoom read that config: its thresholds sit below the guard's 2 GB, and it
    # will never pick sshd or the memory guard
    deadline = time.monotonic() + 30
    journal = ""
    while "SIGKILL when" not in journal and time.monotonic() < deadline:
        journal = plab.exec(node, "cat /var/log/sparklab-journal/earlyoom.service.log").stdout
        time.sleep(0.5)
    assert "sending SIGTERM when mem <=  0.78%" in journal, journal
    assert "regex '^(sshd|dockerd|" in journal and "|sparkctl-guard)$" in journal
    down = sparkctl("down", "--inventory", inv, "--yes", "--oom-guard")
    assert down.returncode == 0, down.stdout + down.stderr
    assert plab.exec(node, "ls /etc/default/earlyoom", check=False).returncode != 0
    assert plab.exec(node, "systemctl is-enabled earlyoom", check=False).stdout.strip() == "disabled"
    assert plab.exec(node, "systemctl is-active earlyoom", check=False).stdout.strip() == "inactive"
