"""`sparkctl launch`, `chat`, `tunnel` on the simulated lab (root, network namespaces).

One `up` and one `launch qwen3-235b` for the module (HF_TOKEN set to a sentinel); then the
tests look at what the launch left behind (in the server's own directory,
/var/lib/sparkctl/run/servers/qwen3-235b/ on each node), talk to the server, and finally inject
a loading hang into its replacement and expect the deadline to stop everything.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, SPARKCTL, Lab, Sparkctl, e2e_state, healthy_lab

pytestmark = pytest.mark.lab

SENTINEL = "hf_SENTINELe2eToken7731"
# A grep pattern that matches the sentinel without containing it (so grep never finds itself).
SENTINEL_PATTERN = SENTINEL[:10] + "[" + SENTINEL[10] + "]" + SENTINEL[11:]
MODEL = "nvidia/Qwen3-235B-A22B-FP4"
RUN = "/var/lib/sparkctl/run/servers/qwen3-235b"  # the server's own directory on each node


sparkctl = Sparkctl("launch", token=SENTINEL, timeout=300)


DOWNLOADS = "/var/lib/sparklab/outbox/hf-downloads.log"  # the lab hub's log of every fetch
HF = "/home/nvidia/.cache/huggingface"
FETCHED_BEFORE: dict[str, int] = {}
"""Each node's fetches before this module: the session's lab may have served other modules
(which fetched this model, or wiped their cache) first, in whatever order xdist hands them out."""


def downloads(lab: Lab, node: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in lab.exec(node, f"cat {DOWNLOADS} 2>/dev/null || true")
            .stdout.splitlines()]


@pytest.fixture(scope="module")
def launched(lab_session: list[Lab]) -> Iterator[tuple[Lab, subprocess.CompletedProcess[str]]]:
    lab = healthy_lab(lab_session)
    inventory = str(lab.inventory)
    # this module's launches start with neither model cached on any node (nothing served from
    # them), so "fetched once" is about this module's own launches
    sparkctl("down", "--inventory", inventory, "--yes", token=False)
    for node in lab.nodes:
        lab.exec(node, f"rm -rf {HF}/hub/models--nvidia--Qwen3-235B-A22B-FP4 "
                       f"{HF}/hub/models--nvidia--Qwen3-235B-A22B-Eagle3 {HF}/drafts/Qwen3-235B-A22B-Eagle3")
        FETCHED_BEFORE[node] = len(downloads(lab, node))
    up = sparkctl("up", "--inventory", inventory, "--yes", token=False)
    assert up.returncode == 0, up.stdout + up.stderr
    result = sparkctl("launch", "qwen3-235b", "--inventory", inventory, "--yes", "--json",
                      "--timeout", "120")
    yield lab, result
    stop = f"docker exec trtllm-multinode sh -c 'kill $(cat {RUN}/mpirun.pid)'"
    lab.exec(lab.nodes[0], stop, check=False)


def test_launch_serves_across_both_nodes(launched: tuple[Lab, subprocess.CompletedProcess[str]]) -> None:
    lab, result = launched
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["recipe"] == "qwen3-235b" and report["model"] == MODEL
    assert report["endpoint"].startswith("http://127.0.0.1:8355")
    head, other = lab.nodes[0], lab.nodes[1]
    steps = {s["step"]: s for s in report["hosts"][head]["steps"]}
    assert steps["ready"]["status"] == "ok" and steps["smoke-test"]["status"] == "ok"
    # world size 2, rank 1 on the other node, NCCL on the fabric interface
    rank0 = lab.exec(head, f"cat {RUN}/rank-0.log").stdout
    rank1 = lab.exec(other, f"cat {RUN}/rank-1.log").stdout
    assert "rank 0 of 2" in rank0
    assert "enp1s0f1np1" in rank0 and "enp1s0f1np1" in rank1
    server = json.loads(lab.exec(head, f"cat {RUN}/server.json").stdout)
    assert server["tp_size"] == 2 and server["host"] == "127.0.0.1" and server["port"] == 8355


def test_models_are_fetched_from_outside_once_on_the_head_only(
        launched: tuple[Lab, subprocess.CompletedProcess[str]]) -> None:
    """The lab's simulated hub logs every download (an "outbox" the containers can write); the
    HF cache survives `down`, so over this module's launches each repo is fetched once, by the
    head."""
    lab, _ = launched
    head = downloads(lab, lab.nodes[0])[FETCHED_BEFORE[lab.nodes[0]]:]
    other = downloads(lab, lab.nodes[1])[FETCHED_BEFORE[lab.nodes[1]]:]
    assert other == [], f"{lab.nodes[1]} downloaded from outside: {other}"
    repos = [entry["repo"] for entry in head]
    assert repos.count(MODEL) == 1 and repos.count("nvidia/Qwen3-235B-A22B-Eagle3") == 1, repos
    assert {entry["host"] for entry in head} == {lab.nodes[0]}


def test_models_are_identical_on_both_nodes(launched: tuple[Lab, subprocess.CompletedProcess[str]]) -> None:
    lab, _ = launched
    listing = ("cd /home/nvidia/.cache/huggingface && find hub/models--nvidia--Qwen3-235B-A22B-FP4 "
               "drafts -type f -o -type l | sort | xargs -r stat -L -c '%n %s'")
    on_a = lab.exec(lab.nodes[0], listing).stdout
    on_b = lab.exec(lab.nodes[1], listing).stdout
    assert "config.json" in on_a and on_a == on_b


def test_relaunch_is_a_noop(launched: tuple[Lab, subprocess.CompletedProcess[str]]) -> None:
    lab, _ = launched
    again = sparkctl("launch", "qwen3-235b", "--inventory", str(lab.inventory), "--yes", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["changed"] == 0


def test_another_server_that_does_not_fit_beside_it_is_refused(
        launched: tuple[Lab, subprocess.CompletedProcess[str]]) -> None:
    """Servers run side by side when memory and ports allow; gpt-oss-120b's estimate does not
    fit on the head beside qwen3-235b's: refused before anything runs, naming what to stop."""
    lab, _ = launched
    other = sparkctl("launch", "gpt-oss-120b", "--inventory", str(lab.inventory), "--yes")
    assert other.returncode == 2, other.stdout + other.stderr
    assert "`sparkctl down --server qwen3-235b`" in other.stderr and "Traceback" not in other.stderr


def test_chat_replies_through_ssh(launched: tuple[Lab, subprocess.CompletedProcess[str]]) -> None:
    lab, _ = launched
    result = sparkctl("chat", "Paris is great because", "--inventory", str(lab.inventory),
                      "--max-tokens", "16", "--json", token=False)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["reply"] and answer["completion_tokens"] > 0 and answer["tokens_per_second"] > 0


def test_openai_client_through_the_tunnel(launched: tuple[Lab, subprocess.CompletedProcess[str]]) -> None:
    lab, _ = launched
    tunnel = subprocess.Popen([SPARKCTL, "tunnel", "--inventory", str(lab.inventory),
                               "--local-port", "0"], stderr=subprocess.PIPE, text=True)
    try:
        line = tunnel.stderr.readline() if tunnel.stderr else ""
        assert "Forwarding http://127.0.0.1:" in line, line
        base = line.split("base_url=")[1].split()[0].rstrip(".")
        from openai import OpenAI

        client = OpenAI(base_url=base, api_key="unused")
        assert MODEL in [m.id for m in client.models.list()]
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8)
        assert reply.choices[0].message.content
    finally:
        tunnel.send_signal(signal.SIGINT)
        assert tunnel.wait(timeout=30) == 130  # interrupted, like every command


def test_the_token_appears_nowhere(launched: tuple[Lab, subprocess.CompletedProcess[str]]) -> None:
    lab, result = launched
    assert SENTINEL not in result.stdout + result.stderr
    for node in lab.nodes:
        ps = lab.exec(node, f"ps -eo args | grep -c '{SENTINEL_PATTERN}' || true").stdout.strip()
        assert ps == "0", f"{node}: token in ps"
        inspect = lab.exec(node, "docker inspect trtllm-multinode").stdout
        assert SENTINEL not in inspect
        files = lab.exec(node, f"grep -rlE '{SENTINEL_PATTERN}' /var/lib/sparkctl /etc/sparkctl "
                               "/var/log /home/nvidia/.cache 2>/dev/null || true").stdout.strip()
        assert files == "", f"{node}: token in {files}"
        assert "hf_token" not in lab.exec(node, "ls -R /etc/sparkctl").stdout
    logs = Path(e2e_state("launch"))
    for path in logs.rglob("*"):
        if path.is_file():
            assert SENTINEL not in path.read_text(errors="replace"), path


def test_a_hang_ends_at_the_deadline_with_nothing_left(
        launched: tuple[Lab, subprocess.CompletedProcess[str]], tmp_path: Path, tally: Any) -> None:
    lab, _ = launched
    recipe = (REPO / "orchestrator/engines/trtllm/recipes/qwen3-235b.yml").read_text()
    variant = tmp_path / "qwen-hang.yml"
    variant.write_text(recipe.replace("name: qwen3-235b", "name: qwen-hang"))
    lab.cli("fault", "engine-hang", "--node", lab.nodes[0], check=True)
    try:
        result = sparkctl("launch", str(variant), "--inventory", str(lab.inventory), "--yes",
                          "--name", "qwen3-235b", "--replace", "--timeout", "8", "--drop-caches",
                          "--json")
    finally:
        lab.cli("fault", "restore", check=True)
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert "not ready within 8s" in json.dumps(report)
    tails = report["log_tails"]
    assert f"--- {lab.nodes[0]}" in tails and f"--- {lab.nodes[1]}" in tails
    assert "rank-1.log" in tails
    drop = [s for s in report["hosts"][lab.nodes[0]]["steps"] if s["step"] == "drop-caches"]
    assert drop and "could NOT drop" in drop[0]["message"]
    assert drop[0]["status"] == "skipped"  # never shown as a success (issue 27)
    for node in lab.nodes:
        left = lab.exec(node, "docker exec trtllm-multinode ps -eo args").stdout
        assert "trtllm" not in left and "mpirun" not in left, f"{node}: {left}"
    tally.add("faults survived")
