"""SGLang on the simulated lab: several servers at once, placed on chosen nodes, and a
multi-node server. One `up` for the module; `qwen3.6-27b` on the second node and `qwen3-8b` on
the head at the same time; refusals for a taken port and for memory that does not fit next to
a running server; `down --server` of one; the TP 2 recipe across both nodes; a cut cable on the
rendezvous link named with its fix; `down` of the rest.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
from conftest import Lab, Sparkctl, fresh_up

pytestmark = pytest.mark.lab


sparkctl = Sparkctl("sglang")


@pytest.fixture(scope="module")
def served(lab_session: list[Lab]) -> Iterator[tuple[Lab, dict[str, subprocess.CompletedProcess[str]]]]:
    # start from no server at all: an earlier module on this lab may have left one serving
    lab = fresh_up(lab_session, sparkctl)
    inventory = ["--inventory", str(lab.inventory)]
    _, other = lab.nodes
    runs = {
        "big": sparkctl("launch", "qwen3.6-27b", *inventory, "--nodes", other, "--yes", "--json",
                        "--timeout", "240"),
        "small": sparkctl("launch", "qwen3-8b", *inventory, "--yes", "--json", "--timeout", "240"),
    }
    yield lab, runs
    lab.cli("fault", "restore")
    sparkctl("down", *inventory, "--yes")


def inv(lab: Lab) -> list[str]:
    return ["--inventory", str(lab.inventory)]


def test_two_servers_run_on_their_nodes_and_answer(served: tuple[Lab, dict]) -> None:
    lab, runs = served
    head, other = lab.nodes
    for key, node in (("big", other), ("small", head)):
        result = runs[key]
        assert result.returncode == 0, result.stdout + result.stderr
        report = json.loads(result.stdout)
        assert report["ok"] and report["engine"] == "sglang" and report["node"] == node
    # the big one: NEXTN flags as SGLang spells them, bound to 127.0.0.1 of its node
    args = lab.exec(other, "docker inspect -f '{{json .Args}}' sparkctl-sglang-qwen3.6-27b").stdout
    assert "--speculative-algorithm" in args and "NEXTN" in args and "--tp-size" in args
    # with eagle_topk 4 SGLang 0.5.12 needs it (else a TypeError at start-up, issue 35)
    assert '"--speculative-num-draft-tokens","20"' in args.replace(" ", ""), args
    assert "127.0.0.1" in args and "0.0.0.0" not in args
    log = lab.exec(other, "docker logs sparkctl-sglang-qwen3.6-27b 2>&1").stdout
    assert "The server is fired up and ready to roll!" in log
    for name in ("qwen3.6-27b", "qwen3-8b"):
        chat = sparkctl("chat", "Hello", *inv(lab), "--server", name, "--json")
        assert chat.returncode == 0, chat.stdout + chat.stderr
        assert json.loads(chat.stdout)["reply"]
    several = sparkctl("chat", "Hello", *inv(lab))
    assert several.returncode != 0 and "--server" in several.stderr
    status = sparkctl("status", *inv(lab), "--json")
    listed = {s["name"]: s for s in json.loads(status.stdout)["servers"]}
    assert listed["qwen3.6-27b"]["node"] == other and listed["qwen3-8b"]["node"] == head
    for entry in listed.values():
        assert (entry["engine"], entry["port"], entry["health"]) == ("sglang", 30000, 200)


def test_a_taken_port_and_memory_that_does_not_fit_are_refused(served: tuple[Lab, dict]) -> None:
    lab, _ = served
    _, other = lab.nodes
    port = sparkctl("launch", "qwen3-8b", *inv(lab), "--nodes", other, "--name", "extra", "--yes")
    assert port.returncode != 0
    assert "port 30000" in port.stderr and "qwen3.6-27b" in port.stderr, port.stderr
    memory = sparkctl("launch", "qwen3-8b", *inv(lab), "--nodes", other, "--name", "extra",
                      "--port", "30010", "--yes")
    assert memory.returncode != 0
    assert "114.0 GB (qwen3.6-27b)" in memory.stderr and "42.4 GB (extra)" in memory.stderr
    assert "> 128 GB" in memory.stderr, memory.stderr
    assert "extra" not in lab.exec(other, "docker ps -a --format '{{.Names}}'").stdout


def test_down_one_server_leaves_the_other(served: tuple[Lab, dict]) -> None:
    lab, _ = served
    _, other = lab.nodes
    down = sparkctl("down", *inv(lab), "--server", "qwen3.6-27b", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "sparkctl-sglang" not in lab.exec(other, "docker ps -a --format '{{.Names}}'").stdout
    status = json.loads(sparkctl("status", *inv(lab), "--json").stdout)
    assert [s["name"] for s in status["servers"]] == ["qwen3-8b"]
    chat = sparkctl("chat", "Hello again", *inv(lab), "--json")  # the only one: no --server needed
    assert chat.returncode == 0 and json.loads(chat.stdout)["server"] == "qwen3-8b", chat.stderr


def test_a_multi_node_server_answers_and_a_cut_cable_is_named(served: tuple[Lab, dict]) -> None:
    lab, _ = served
    head, other = lab.nodes
    assert sparkctl("down", *inv(lab), "--server", "qwen3-8b", "--yes").returncode == 0
    result = sparkctl("launch", "qwen3.6-27b-tp2", *inv(lab), "--yes", "--json", "--timeout", "240")
    assert result.returncode == 0, result.stdout + result.stderr
    args = lab.exec(other, "docker inspect -f '{{json .Args}}' sparkctl-sglang-qwen3.6-27b-tp2").stdout
    assert '"--node-rank","1"' in args.replace(" ", "") and "192.168.200.12:20000" in args
    env = lab.exec(other, "docker inspect -f '{{json .Config.Env}}' sparkctl-sglang-qwen3.6-27b-tp2").stdout
    assert "NCCL_SOCKET_IFNAME=" in env and "GLOO_SOCKET_IFNAME=" in env
    chat = sparkctl("chat", "Hi", *inv(lab), "--server", "qwen3.6-27b-tp2", "--json")
    assert chat.returncode == 0, chat.stdout + chat.stderr
    assert sparkctl("down", *inv(lab), "--server", "qwen3.6-27b-tp2", "--yes").returncode == 0
    lab.cli("fault", "cut-cable", "--node", head, "--interface", "enp1s0f1np1", check=True)
    try:
        cut = sparkctl("launch", "qwen3.6-27b-tp2", *inv(lab), "--yes", "--timeout", "120")
    finally:
        lab.cli("fault", "restore")
    assert cut.returncode != 0
    assert "--dist-init-addr 192.168.200.12:20000" in cut.stderr and "cable" in cut.stderr, cut.stderr
