"""Secrets never leak: an HF token sentinel and the cluster private key, searched for in every
log, report, process list (during and after launch), container environment, and every file
sparkctl's trees hold that others could read. Each search counts as a "secret probes" tally.
"""

from __future__ import annotations

import secrets
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, Lab, Sparkctl, healthy_lab

pytestmark = pytest.mark.lab

SENTINEL = f"hf_SENTINEL_{secrets.token_hex(8)}"
CONTAINER = "trtllm-multinode"
RUN = "/var/lib/sparkctl/run"
# readable by group/others: what another user on the node could read
LOOSE_TREES = ("/etc/sparkctl /var/lib/sparkctl /etc/netplan /home/nvidia "
               "/home/nvidia/.cache/huggingface")


class Leak:
    """The secrets and where they were looked for."""

    def __init__(self, lab: Lab, state: Path) -> None:
        self.lab = lab
        self.state = state
        key = lab.exec(lab.nodes[0], "cat /etc/sparkctl/cluster_key").stdout
        body = [line for line in key.splitlines() if line and "PRIVATE KEY" not in line]
        assert body, "the head has no cluster key"
        # every base64 line of the key is a needle: any of them in the open is a leak
        self.needles = [SENTINEL, *body]
        self.probes = 0
        self.process_lists: list[str] = []
        self.launch: subprocess.CompletedProcess[str] | None = None

    def found_in(self, text: str) -> list[str]:
        self.probes += 1
        return [n[:14] + "..." for n in self.needles if n in text]

    def grep_node(self, node: str, command: str) -> list[str]:
        """Run `command` in the node and grep its output for the needles (fed on stdin, so
        the needles never appear on a command line themselves)."""
        self.probes += 1
        patterns = "\n".join(self.needles) + "\n"
        script = (f"({command}) 2>/dev/null > /tmp/sparkctl-probe.out; "
                  "grep -c -F -f /dev/stdin /tmp/sparkctl-probe.out; rm -f /tmp/sparkctl-probe.out")
        out = self.lab.exec(node, ["sh", "-c", script], check=False, input_text=patterns).stdout
        return [] if out.strip() in ("", "0") else [f"{node}: {command}: {out.strip()} line(s)"]


def sparkctl(state: Path, *args: str) -> subprocess.Popen[str]:
    argv, env = Sparkctl(state, token=SENTINEL).command(*args)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=REPO)

@pytest.fixture(scope="module")
def leak(lab_session: list[Lab], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leak]:
    lab = healthy_lab(lab_session)
    state = tmp_path_factory.mktemp("secrets-state")
    inventory = str(lab.inventory)
    up = sparkctl(state, "up", "--inventory", inventory, "--yes", "--json")
    out, err = up.communicate(timeout=300)
    assert up.returncode == 0, out + err
    found = Leak(lab, state)
    found.process_lists.append(out + err)
    # stop whatever an earlier module left serving, so this launch downloads and starts
    lab.exec(lab.nodes[0], f"docker exec {CONTAINER} sh -c 'kill $(cat {RUN}/mpirun.pid)'",
             check=False)
    lab.exec(lab.nodes[0], "rm -rf /home/nvidia/.cache/huggingface/hub /home/nvidia/.cache/"
                           "huggingface/drafts", check=False)
    launch = sparkctl(state, "launch", "qwen3-235b", "--inventory", inventory, "--yes", "--json",
                      "--timeout", "90")
    done = threading.Event()

    def sample() -> None:
        # ps in every node and every container while launch runs (downloads, start, wait)
        while not done.is_set():
            for node in lab.nodes:
                for command in ("ps -eo args", f"docker exec {CONTAINER} ps -eo args"):
                    found.process_lists.append(
                        lab.exec(node, command, check=False, user="nvidia").stdout)
            done.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = launch.communicate(timeout=300)
    done.set()
    sampler.join(timeout=30)
    found.launch = subprocess.CompletedProcess(launch.args, launch.returncode, out, err)
    assert launch.returncode == 0, out + err
    yield found


def test_the_launch_really_used_the_token(leak: Leak) -> None:
    # the lab's hub refuses gated models without a token: a served model proves it was sent
    assert leak.launch is not None and '"ok": true' in leak.launch.stdout


def test_no_secret_in_the_reports_or_the_controller_logs(leak: Leak, tally: Any) -> None:
    assert leak.launch is not None
    assert leak.found_in(leak.launch.stdout) == [], "launch --json report"
    assert leak.found_in(leak.launch.stderr) == [], "launch stderr"
    files = [p for p in leak.state.rglob("*") if p.is_file()]
    assert files, "the controller wrote no run log"
    for path in files:
        assert leak.found_in(path.read_text(errors="replace")) == [], path
    tally.add("secret probes", leak.probes)


def test_no_secret_in_any_process_list_during_or_after_launch(leak: Leak, tally: Any) -> None:
    assert len(leak.process_lists) > 4, "the sampler saw no process list"
    for listing in leak.process_lists:
        assert leak.found_in(listing) == []
    for node in leak.lab.nodes:
        assert leak.grep_node(node, "ps -ef") == []
        assert leak.grep_node(node, f"docker exec {CONTAINER} ps -ef") == []
        assert leak.grep_node(node, "cat /proc/[0-9]*/environ | tr '\\0' '\\n'") == []
    tally.add("secret probes", leak.probes)
    leak.probes = 0


def test_no_secret_in_container_env_or_logs(leak: Leak, tally: Any) -> None:
    for node in leak.lab.nodes:
        assert leak.grep_node(node, f"docker inspect {CONTAINER}") == []
        assert leak.grep_node(node, f"docker logs {CONTAINER} 2>&1") == []
        assert leak.grep_node(node, f"cat {RUN}/*.log {RUN}/*.log.1") == []
        assert leak.grep_node(node, f"cat {RUN}/*.json") == []
        assert leak.grep_node(node, "cat /var/log/*.log /var/log/*/*.log") == []
    tally.add("secret probes", leak.probes)
    leak.probes = 0


def test_no_secret_in_any_file_others_can_read(leak: Leak, tally: Any) -> None:
    for node in leak.lab.nodes:
        loose = leak.lab.exec(node, f"find {LOOSE_TREES} -type f -perm /044 2>/dev/null | sort -u"
                              ).stdout.split()
        assert loose, f"{node}: found no readable files at all (wrong paths?)"
        for path in loose:
            assert leak.grep_node(node, f"cat {path!r}") == [], f"{node}: {path}"
        # the token file exists only while downloading
        assert leak.lab.exec(node, "test -e /etc/sparkctl/secrets/hf_token", check=False
                             ).returncode != 0, f"{node}: hf_token left behind"
    tally.add("secret probes", leak.probes)
    leak.probes = 0
