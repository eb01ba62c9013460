"""`launch --persist` of vLLM's own multi-node (mp): the first node's watcher judges every rank
(node/boot.py Ranks, node/rank_links.py), because rank 0 answers /health 200 after a rank died
(the real vLLM 0.31.0 in the lab): a rank whose node rebooted alone comes back to a rank 0 that
cannot take it, and only a restart of rank 0 makes the server whole again."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from conftest import make_inventory
from nodescript import run_node_script
from test_persist import boot_plan_file, persist_spec

from orchestrator.phases import persist

HF = "/home/nvidia/.cache/huggingface"


def test_rank_links_lists_the_established_connections_of_the_process_tree(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pid_file = tmp_path / "vllm.pid"
    pid_file.write_text(f"{os.getpid()}\n")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    port, theirs = listener.getsockname()[1], client.getsockname()[1]
    try:
        args = json.dumps({"pid_file": str(pid_file), "peers": {"b": "127.0.0.1", "c": "10.9.9.9"}})
        ran = run_node_script("rank_links.py", [args], monkeypatch)
    finally:
        for s in (client, server, listener):
            s.close()
    assert ran.code == 0, ran.stdout + ran.stderr
    links = ran.json["peers"]
    # both ends are this process's: each one is a connection to 127.0.0.1
    assert f"{port}>127.0.0.1:{theirs}" in links["b"] and f"{theirs}>127.0.0.1:{port}" in links["b"]
    assert links["c"] == []


def test_rank_links_reads_ipv4_mapped_ipv6_and_fails_without_the_main_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = json.dumps({"pid_file": str(tmp_path / "absent.pid"), "peers": {}})
    ran = run_node_script("rank_links.py", [args], monkeypatch)
    assert ran.code == 1 and "no main process" in ran.json["error"]
    address = ran.namespace["address"]
    assert address("0100007F:1F90") == ("127.0.0.1", 8080)
    # torch's store listens on IPv6: the peer's IPv4 address shows as ::ffff:a.b.c.d
    assert address("0000000000000000FFFF00000DC8A8C0:735D") == ("192.168.200.13", 29533)
    assert address("00000000000000000000000001000000:0016") == ("::1", 22)


def test_only_the_first_node_of_an_mp_server_of_several_nodes_judges_the_ranks() -> None:
    spec = persist_spec("lab-tiny-llama-vllm-tp2")
    inv = make_inventory()
    head, peer = (persist.boot_plan(spec, inv.node(n), HF) for n in spec.nodes)
    assert peer["ranks"] is None and head["ranks"] is not None
    cmd = head["ranks"]["cmd"]
    assert cmd.startswith("docker exec sparkctl-vllm-lab-tiny-llama-vllm-tp2 python3 -c ")
    assert "servers/lab-tiny-llama-vllm-tp2/serve/vllm.pid" in cmd
    peer_ip = inv.fabric_address(inv.node(spec.nodes[1]), inv.fabric.interfaces[0])
    assert f'"{spec.nodes[1]}": "{peer_ip}"' in cmd
    for recipe in ("lab-tiny-llama-vllm", "minimax-m2.7"):  # one node; Ray (it sees its nodes)
        one = persist_spec(recipe)
        assert persist.boot_plan(one, inv.node(one.nodes[0]), HF)["ranks"] is None, recipe


def test_the_watcher_restarts_when_a_lost_rank_comes_back_though_health_says_200(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The lab's second node rebooted: rank 0's connections to it closed (health stays 200), and
    docker's restart policy brought its headless rank back, which connected to rank 0 again
    without making the server whole. Before the fix the watcher saw /health 200 and did nothing."""
    answers = [{"b": ["1>10.0.0.2:5", "2>10.0.0.2:6"]}, {"b": ["1>10.0.0.2:5", "2>10.0.0.2:6"]},
               {"b": []}, {"b": []}, {"b": ["2>10.0.0.2:7"]}]
    for i, peers in enumerate(answers):
        (tmp_path / f"links{i}.json").write_text(json.dumps({"peers": peers}))
    counter = tmp_path / "n"
    counter.write_text("0")
    ranks = (f"n=$(cat {counter}); echo $((n+1)) > {counter}; cat {tmp_path}/links$n.json")
    guard, restarted = tmp_path / "memguard-stopped.json", tmp_path / "restarted"
    plan = json.loads(boot_plan_file(
        tmp_path, health_port=1, ready=[], watch=True, guard_record=str(guard),
        ranks={"cmd": ranks},
        restart=[{"what": "stop the stalled vllm serve", "cmd": f"touch {restarted} {guard}"}],
    ).read_text())
    (tmp_path / "x").mkdir()  # a first, plain run: the script's functions, to drive watch()
    ns = run_node_script("boot.py", [str(boot_plan_file(tmp_path / "x"))], monkeypatch).namespace
    health = iter([200] * 6 + [503] * 3)  # 5 looks at the ranks, the restart's; then it ends
    ns["health"] = lambda port: next(health)
    ns["PLAN"] = plan
    capsys.readouterr()
    assert ns["watch"](plan, every=0) == 0
    lines = [line.split(" ", 2)[2] for line in capsys.readouterr().out.splitlines()]
    assert lines[0] == "watching: the server's answer and its ranks every 0s"
    lost = [line for line in lines if "is gone" in line]
    assert lost == ["server s1: the rank on b is gone (its connections to this node closed); "
                    "/health may still answer 200, but the server cannot serve: waiting for the "
                    "rank to come back"]  # said once, not restarted while nothing came back
    back = lines.index("server s1: the rank on b came back (new connections from it): the server "
                       "lost its rank there and cannot take it back: restarting this node's part")
    assert lines.index(lost[0]) < back and lines[back + 1] == "stop the stalled vllm serve: ok"
    assert restarted.exists() and "started: server" in lines
    assert lines[-1].startswith("server s1 stopped by the memory guard")
