"""vLLM on the simulated lab: `launch minimax-m2.7` over Ray across both nodes, on an image that
ships Ray (NGC 26.03), then `minimax-m2.7-mp` on NVIDIA's current image, which has none: vLLM's
own multi-node.

Ray is the real thing (from PyPI, installed by the lab into the images that ship it); only vLLM
is simulated. One `up` and a TensorRT-LLM server for the module; the vLLM launch is refused (both
need the memory of both nodes), then starts once that server is stopped (`down --server`); then
chat, status, `ray status` in the server's first container, a no-op relaunch, another vLLM server
refused on the same nodes (port, memory), a cut cable between worker and head, Ray's ports
refused on the management network (its port guard), and `down`, after which no Ray or vLLM
process and no firewall chain may be left on either node. The server is named and has its own
containers (`sparkctl-vllm-<name>`) and record (RUN_DIR/servers/<name>/server.json). Then:
forcing Ray on an image without it exits 2 before anything changes, and the mp launch runs with
no raylet anywhere and `--nnodes 2` on both nodes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import REPO, Lab, Sparkctl, e2e_state, healthy_lab

pytestmark = pytest.mark.lab

SPARKCTL = str(REPO / ".venv" / "bin" / "sparkctl")
SENTINEL = "hf_SENTINELvllmToken4411"
SENTINEL_PATTERN = SENTINEL[:10] + "[" + SENTINEL[10] + "]" + SENTINEL[11:]
MODEL = "nvidia/MiniMax-M2.7-NVFP4"
RUN = "/var/lib/sparkctl/run"
NAME = "minimax-m2.7"
CONTAINER = f"sparkctl-vllm-{NAME}"
RECORD = f"{RUN}/servers/{NAME}"
RAY_PROCESSES = ("ps -eo pid,args | grep -E 'raylet|gcs_server|ray start|vllm serve|ray::' "
                 "| grep -v grep || true")


sparkctl = Sparkctl("vllm", token=SENTINEL, timeout=400)


REFUSED: list[subprocess.CompletedProcess[str]] = []


@pytest.fixture(scope="module")
def launched(lab_session: list[Lab]) -> Iterator[tuple[Lab, subprocess.CompletedProcess[str]]]:
    """up; TensorRT-LLM serving qwen3-235b; vLLM refused while it serves; then started."""
    lab = healthy_lab(lab_session)
    inventory = str(lab.inventory)
    # start from no server at all: an earlier module on this lab may have left one serving
    sparkctl("down", "--inventory", inventory, "--yes")
    up = sparkctl("up", "--inventory", inventory, "--yes")
    assert up.returncode == 0, up.stdout + up.stderr
    trt = sparkctl("launch", "qwen3-235b", "--inventory", inventory, "--yes", "--timeout", "120")
    assert trt.returncode == 0, trt.stdout + trt.stderr
    REFUSED.append(sparkctl("launch", "minimax-m2.7", "--inventory", inventory, "--yes",
                            "--replace"))  # (--replace reaches a server of the same name only)
    stop = sparkctl("down", "--server", "qwen3-235b", "--inventory", inventory, "--yes")
    assert stop.returncode == 0, stop.stdout + stop.stderr
    result = sparkctl("launch", "minimax-m2.7", "--inventory", inventory, "--yes", "--json",
                      "--timeout", "180")
    yield lab, result
    lab.cli("fault", "restore")
    sparkctl("down", "--inventory", inventory, "--yes")


def inv(lab: Lab) -> list[str]:
    return ["--inventory", str(lab.inventory)]


def test_launch_serves_over_ray_on_both_nodes(launched: tuple[Lab, subprocess.CompletedProcess[str]]) -> None:
    lab, result = launched
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["engine"] == "vllm" and report["model"] == MODEL
    head, other = lab.nodes
    steps = {s["step"]: s for s in report["hosts"][head]["steps"]}
    assert steps["ready"]["status"] == "ok" and steps["smoke-test"]["status"] == "ok"
    assert "2 node(s) alive" in steps["ray-cluster"]["message"]
    server = json.loads(lab.exec(head, f"cat {RECORD}/server.json").stdout)
    assert (server["engine"], server["container"], server["tp_size"]) == ("vllm", CONTAINER, 2)
    assert server["nodes"] == [head, other] and server["listen_ports"] == [
        8000, 6379, 21000, 22000, 23000, 24000, 25000, 26000, *range(10002, 10052)]
    log = lab.exec(head, f"cat {RECORD}/serve/server.log").stdout
    # rank 0 on the head, rank 1 on the other node, both on the fabric
    assert f"rank 0 on {head} (192.168.200.12" in log and f"rank 1 on {other} (192.168.200.13" in log
    env = lab.exec(other, f"docker inspect -f '{{{{json .Config.Env}}}}' {CONTAINER}").stdout
    assert "VLLM_HOST_IP=192.168.200.13" in env and "NCCL_SOCKET_IFNAME=enp1s0f1np1" in env
    # one GPU per node: the placement group is spread (vLLM's default PACK is not asked for)
    assert 'VLLM_DISTRIBUTED_EXECUTOR_CONFIG={\\"placement_group_options\\"' in env
    assert "strategy SPREAD" in log
    # the image ships Ray, probed once and recorded; the step says so
    assert "Ray" in steps["ray-in-image"]["message"] and "no Ray" not in steps["ray-in-image"]["message"]
    # the token: never in the containers' config, the server's log or its command line
    for node in lab.nodes:
        leaks = lab.exec(node, f"docker inspect {CONTAINER}; cat {RECORD}/serve/*.log; ps -eo args | "
                         f"grep -c {SENTINEL_PATTERN} || true").stdout
        assert SENTINEL not in leaks


def test_vllm_refused_while_tensorrt_llm_holds_the_memory_then_started(
        launched: tuple[Lab, subprocess.CompletedProcess[str]]) -> None:
    lab, _ = launched
    refused = REFUSED[0]
    message = refused.stdout + refused.stderr
    assert refused.returncode == 2, message  # a refusal: nothing changed
    assert "GB (qwen3-235b) already running" in message
    assert "`sparkctl down --server qwen3-235b`" in message and "--ignore-memory" in message
    for node in lab.nodes:  # `down --server` stopped every TensorRT-LLM rank
        left = lab.exec(node, "docker exec trtllm-multinode ps -eo args").stdout
        assert "trtllm-serve" not in left and "mpirun" not in left, f"{node}: {left}"


def test_chat_answers(launched: tuple[Lab, subprocess.CompletedProcess[str]]) -> None:
    lab, _ = launched
    result = sparkctl("chat", "Hello", *inv(lab), "--max-tokens", "8")
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.split()) == 8 and MODEL in result.stderr


def test_status_shows_engine_and_ray_nodes(launched: tuple[Lab, subprocess.CompletedProcess[str]]) -> None:
    lab, _ = launched
    result = sparkctl("status", *inv(lab), "--json")
    status = json.loads(result.stdout)
    assert result.returncode == 0, result.stdout
    (server,) = status["servers"]
    assert (server["name"], server["engine"], server["state"]) == (NAME, "vllm", "healthy")
    assert server["nodes"] == list(lab.nodes) and server["container"] == CONTAINER
    # a Ray node's container on each node of the server
    assert sorted(p["node"] for p in server["processes"]) == sorted(lab.nodes)


def test_ray_status_in_the_head_container_lists_both_nodes(
        launched: tuple[Lab, subprocess.CompletedProcess[str]]) -> None:
    lab, _ = launched
    out = lab.exec(lab.nodes[0], f"docker exec {CONTAINER} ray status").stdout
    active = out.split("Active:", 1)[1].split("Pending:", 1)[0]
    assert active.count("node_") == 2, out
    assert "0.0/2.0 GPU" in out or "2.0/2.0 GPU" in out


def test_second_launch_is_a_noop(launched: tuple[Lab, subprocess.CompletedProcess[str]]) -> None:
    lab, _ = launched
    result = sparkctl("launch", "minimax-m2.7", *inv(lab), "--yes", "--json")
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["ok"], result.stderr
    changed = [s for host in report["hosts"].values() for s in host["steps"] if s["status"] == "changed"]
    assert changed == []


def test_another_vllm_server_on_the_same_nodes_is_refused_naming_the_first(
        launched: tuple[Lab, subprocess.CompletedProcess[str]]) -> None:
    lab, _ = launched
    head = lab.nodes[0]
    taken = sparkctl("launch", "gpt-oss-120b-vllm", *inv(lab), "--yes")
    message = taken.stdout + taken.stderr
    assert taken.returncode != 0 and "Traceback" not in message
    # the port check, first: the listener is in another named server's container
    assert f"{head}: port 8000 (HTTP) is taken by " in message
    assert f"in container {CONTAINER} of server {NAME} (`sparkctl down --server {NAME}`)" in message
    full = sparkctl("launch", "gpt-oss-120b-vllm", "--port", "8001", *inv(lab), "--yes")
    message = full.stdout + full.stderr
    assert full.returncode == 2, message
    assert f"GB ({NAME}) already running" in message and f"`sparkctl down --server {NAME}`" in message


def test_cut_cable_worker_cannot_reach_head_named_with_fix(
        launched: tuple[Lab, subprocess.CompletedProcess[str]]) -> None:
    lab, _ = launched
    head, other = lab.nodes
    lab.cli("fault", "cut-cable", "--node", head, "--interface", "enp1s0f1np1", check=True)
    try:
        for node in lab.nodes:  # a restart of both Ray nodes while the cable is out
            lab.exec(node, f"docker rm -f {CONTAINER}", check=False)
        result = sparkctl("launch", "minimax-m2.7", *inv(lab), "--yes")
        message = result.stdout + result.stderr
        assert result.returncode != 0, message
        # at once, before any `ray start` times out: both ends named, with the link and the fix
        assert f"{other}: its Ray worker would use 192.168.200.13 on enp1s0f1np1" in message
        assert f"{head}: the Ray head would use 192.168.200.12" in message
        assert "has no link" in message and "netcheck" in message
    finally:
        lab.cli("fault", "restore", check=True)
    again = sparkctl("launch", "minimax-m2.7", *inv(lab), "--yes")
    assert again.returncode == 0, again.stdout + again.stderr


def test_head_restarted_after_launch_is_named_and_a_relaunch_recovers(
        launched: tuple[Lab, subprocess.CompletedProcess[str]]) -> None:
    lab, _ = launched
    head = lab.nodes[0]
    time.sleep(6)  # (the restart must come clearly after the server's start, to the second)
    lab.exec(head, f"docker restart {CONTAINER}", check=True)
    result = sparkctl("status", *inv(lab), "--json")
    status = json.loads(result.stdout)
    (server,) = status["servers"]
    # the container runs again, vllm serve in it does not: dead, named, with the relaunch
    assert result.returncode == 1 and server["state"] == "dead", server
    problems = [p for node in status["nodes"].values() for p in node["problems"]]
    # the hint relaunches it as recorded: its nodes and port (its name is the recipe's)
    assert any(p.startswith(f"server {NAME} (vllm") and f"`sparkctl launch {NAME} --nodes "
               in p and "--port 8000" in p for p in problems), problems
    again = sparkctl("launch", "minimax-m2.7", *inv(lab), "--yes", "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    steps = {s["step"]: s for s in json.loads(again.stdout)["hosts"][head]["steps"]}
    assert steps["server"]["status"] == "changed" and "2 node(s) alive" in steps["ray-cluster"]["message"]
    chat = sparkctl("chat", "Hello", *inv(lab), "--max-tokens", "4")
    assert chat.returncode == 0, chat.stderr


def test_ctrl_c_during_the_wait_leaves_nothing_half_started(
        launched: tuple[Lab, subprocess.CompletedProcess[str]]) -> None:
    """Ctrl-C while vLLM loads: exit 130 saying the server keeps loading; then the server is
    whole (both Ray nodes, one server that becomes ready) and the next launch changes nothing."""
    lab, _ = launched
    head = lab.nodes[0]
    time.sleep(6)
    # a load long enough that the launch is still waiting when it prints "loading (": with the
    # lab's 3 s a quick launch found the server ready and never waited (seen once, quiet machine)
    previous = lab.set_engine_load_seconds(20)
    try:
        lab.exec(head, f"docker restart {CONTAINER}", check=True)
        env = {**os.environ, "SPARKCTL_STATE_DIR": e2e_state("vllm"), "HF_TOKEN": SENTINEL}
        proc = subprocess.Popen([SPARKCTL, "launch", "minimax-m2.7", *inv(lab), "--yes"], env=env,
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:  # interrupt as soon as the wait for readiness has begun
            seen.append(line)
            if "loading (" in line:
                proc.send_signal(signal.SIGINT)
                break
        rest = proc.communicate(timeout=120)[0]
    finally:
        lab.set_engine_load_seconds(previous)
    output = "".join(seen) + rest
    assert proc.returncode == 130, output
    assert "keeps loading" in output or "still loading" in output, output
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = json.loads(sparkctl("status", *inv(lab), "--json").stdout)
        if status["servers"] and status["servers"][0]["state"] == "healthy":
            break
        time.sleep(2)
    assert status["servers"][0]["state"] == "healthy", status["servers"]
    assert len(status["servers"][0]["processes"]) == 2
    servers = lab.exec(head, f"docker exec {CONTAINER} ps -eo args").stdout
    assert servers.count(f" serve {MODEL}") == 1, servers  # one server, not a second one
    result = sparkctl("launch", "minimax-m2.7", *inv(lab), "--yes", "--json")
    changed = [s for host in json.loads(result.stdout)["hosts"].values() for s in host["steps"]
               if s["status"] == "changed"]
    assert result.returncode == 0 and changed == [], result.stdout


CONNECT = ("import socket, sys\n"
           "try:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), 3).close()\n"
           "    print('open')\n"
           "except OSError as exc:\n    print(type(exc).__name__)")
GUARD = f"sparkctl-ray-{NAME}"
CHAINS = "iptables -S; ip6tables -S"
LEFTOVER = ("iptables -N sparkctl-ray-gone && iptables -I INPUT -p tcp -m comment --comment "
            "'sparkctl port guard for sparkctl-vllm-gone' -j sparkctl-ray-gone")


def reach(lab: Lab, node: str, address: str, port: int) -> str:
    """'open', or why a TCP connect from NODE to ADDRESS:PORT failed."""
    return lab.exec(node, ["python3", "-c", CONNECT, address, str(port)]).stdout.strip()


def fabric_ip(lab: Lab, node: str) -> str:
    entry = next(n for n in lab.data["nodes"] if n["name"] == node)  # type: ignore[attr-defined]
    return str(entry["addresses"]["enp1s0f1np1"]).split("/")[0]


def test_ray_answers_on_the_fabric_only_and_its_guard_goes_with_the_server(
        launched: tuple[Lab, subprocess.CompletedProcess[str]]) -> None:
    """Ray 2.60 binds every interface and has no auth: the GCS and each raylet must refuse a
    client on the management network (a peer's or the lab host's side) and answer the fabric;
    `down --server` takes its firewall chain off both nodes, and a chain left by a server that
    no longer runs goes at the next launch."""
    lab, _ = launched
    head, peer = lab.nodes[0], lab.nodes[1]
    for target, source, port in ((head, peer, 6379), (head, peer, 21000), (peer, head, 21000)):
        assert reach(lab, source, lab.hosts[target], port) == "ConnectionRefusedError", (target, port)
        assert reach(lab, source, fabric_ip(lab, target), port) == "open", (target, port)
    try:  # and from the lab host, on the management bridge
        socket.create_connection((lab.hosts[head], 6379), 3).close()
        host_side = "open"
    except OSError as exc:
        host_side = type(exc).__name__
    assert host_side == "ConnectionRefusedError"
    for node in lab.nodes:
        assert lab.exec(node, CHAINS).stdout.count(f"-N {GUARD}") == 2, node  # IPv4 and IPv6

    lab.exec(peer, LEFTOVER)
    stop = sparkctl("down", "--server", NAME, *inv(lab), "--yes")
    said = stop.stdout + stop.stderr
    assert stop.returncode == 0 and f"port guard (firewall chain {GUARD})" in said, said
    for node in lab.nodes:
        assert GUARD not in lab.exec(node, CHAINS).stdout, node
    assert "sparkctl-ray-gone" in lab.exec(peer, CHAINS).stdout  # another server's: not its own

    again = sparkctl("launch", "minimax-m2.7", *inv(lab), "--yes", "--json", "--timeout", "180")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "sparkctl-ray-gone" in again.stdout  # named as removed
    assert "sparkctl-ray-gone" not in lab.exec(peer, CHAINS).stdout
    assert reach(lab, peer, lab.hosts[head], 6379) == "ConnectionRefusedError"


def test_a_second_ray_server_199_ports_up_gets_its_own_worker_slot(
        launched: tuple[Lab, subprocess.CompletedProcess[str]]) -> None:
    """API ports 8000 and 8199 share the worker slot 10002-10051 by their offsets: the second
    server on the same nodes takes the next free slot, its guard closes that range, and both
    run (their Ray workers would have fought over the same ports)."""
    lab, _ = launched
    second = sparkctl("launch", "minimax-m2.7", "--name", "second", "--port", "8199",
                      "--ignore-memory", *inv(lab), "--yes", "--json", "--timeout", "180")
    try:
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        head = lab.nodes[0]
        record = json.loads(lab.exec(head, f"cat {RUN}/servers/second/server.json").stdout)
        assert 10052 in record["listen_ports"] and 10002 not in record["listen_ports"]
        for node in lab.nodes:
            rules = lab.exec(node, "iptables -w -S sparkctl-ray-second").stdout
            assert "--dport 10052:10101" in rules, (node, rules)
        args = lab.exec(head, "docker inspect -f '{{json .Args}}' sparkctl-vllm-second").stdout
        assert "--min-worker-port" in args and "10052" in args, args
        again = sparkctl("launch", "minimax-m2.7", "--name", "second", "--port", "8199",
                         "--ignore-memory", *inv(lab), "--yes", "--json")
        changed = [s["step"] for host in json.loads(again.stdout)["hosts"].values()
                   for s in host["steps"] if s["status"] == "changed"]
        assert again.returncode == 0 and changed == [], changed  # its slot and guard kept
    finally:
        sparkctl("down", "--server", "second", *inv(lab), "--yes")


def test_down_leaves_no_ray_or_vllm_process(launched: tuple[Lab, subprocess.CompletedProcess[str]]) -> None:
    lab, _ = launched
    result = sparkctl("down", *inv(lab), "--yes")
    assert result.returncode == 0, result.stdout + result.stderr
    for node in lab.nodes:
        assert lab.exec(node, RAY_PROCESSES).stdout.strip() == "", node
        assert "sparkctl-vllm" not in lab.exec(node, "docker ps -a --format '{{.Names}}'").stdout
        assert "sparkctl-" not in lab.exec(node, CHAINS).stdout, node  # no port guard left


def write_recipe(tmp_path: Any, **fields: Any) -> str:
    data = {"engine": "vllm", "name": "force-ray", "model": MODEL, "tensor_parallel_size": 2,
            "memory": {"weights_gb": 131, "kv_cache_fraction": 0.85}, **fields}
    path = tmp_path / "force-ray.yml"
    path.write_text(json.dumps(data))
    return str(path)


def test_forcing_ray_on_an_image_without_it_exits_2_before_any_change(
        launched: tuple[Lab, subprocess.CompletedProcess[str]], tmp_path: Any) -> None:
    lab, _ = launched
    listing = "docker ps -a --format '{{.Names}} {{.ID}} {{.State}}'"
    before = {n: lab.exec(n, listing).stdout for n in lab.nodes}
    result = sparkctl("launch", write_recipe(tmp_path, executor="ray"), *inv(lab), "--yes")
    message = result.stdout + result.stderr
    assert result.returncode == 2, message
    assert "executor: ray, but nvcr.io/nvidia/vllm:26.10-py3 ships no Ray" in message
    assert "executor: mp" in message and "nvcr.io/nvidia/vllm:26.03-py3" in message
    after = {n: lab.exec(n, listing).stdout for n in lab.nodes}
    assert after == before


UNKNOWN_IMAGE = "vllm/vllm-openai:v0.30.0"  # not in sparkctl's list; no Ray in it


def test_forcing_ray_on_an_unknown_image_pulls_it_only_then_refuses_in_the_plan(
        launched: tuple[Lab, subprocess.CompletedProcess[str]], tmp_path: Any) -> None:
    """Not on the nodes: the pull is the only change (the models are not fetched, no container
    is made) and the message says so; present now: refused while planning, nothing changed."""
    lab, _ = launched
    sparkctl("down", *inv(lab), "--yes")  # no server to refuse first (the check phase)
    up = sparkctl("up", *inv(lab), "--yes")  # `down` took the fetching container too
    assert up.returncode == 0, up.stdout + up.stderr
    listing = "docker ps -a --format '{{.Names}} {{.ID}} {{.State}}'"
    before = {n: lab.exec(n, listing).stdout for n in lab.nodes}
    recipe = write_recipe(tmp_path, executor="ray", image=UNKNOWN_IMAGE)
    first = sparkctl("launch", recipe, *inv(lab), "--yes", "--json")
    assert first.returncode == 2, first.stdout + first.stderr
    report = json.loads(first.stdout)
    message = first.stdout + first.stderr
    assert f"{UNKNOWN_IMAGE} ships no Ray (probed" in message
    assert "that pull is the only change made; no container was created" in message
    changed = {s["step"] for host in report["hosts"].values() for s in host["steps"]
               if s["status"] == "changed"}
    assert "image" in changed and changed <= {"image", "image-share", "image-digest"}, changed
    assert {n: lab.exec(n, listing).stdout for n in lab.nodes} == before
    again = sparkctl("launch", recipe, *inv(lab), "--yes", "--json")
    assert again.returncode == 2, again.stdout + again.stderr
    assert "Nothing was changed" in again.stdout + again.stderr
    assert not [s for host in json.loads(again.stdout)["hosts"].values() for s in host["steps"]
                if s["status"] == "changed"]
    for node in lab.nodes:
        lab.exec(node, f"docker rmi {UNKNOWN_IMAGE}")


MP = "sparkctl-vllm-minimax-m2.7-mp"


def test_nvidias_current_image_runs_vllms_own_multinode_without_ray(
        launched: tuple[Lab, subprocess.CompletedProcess[str]]) -> None:
    lab, _ = launched
    head, other = lab.nodes
    up = sparkctl("up", *inv(lab), "--yes")  # `down` above took the fetching container too
    assert up.returncode == 0, up.stdout + up.stderr
    result = sparkctl("launch", "minimax-m2.7-mp", *inv(lab), "--yes", "--json", "--replace",
                      "--timeout", "180")
    assert result.returncode == 0, result.stdout + result.stderr
    steps = {s["step"]: s for s in json.loads(result.stdout)["hosts"][head]["steps"]}
    assert "no Ray in nvcr.io/nvidia/vllm:26.10-py3" in steps["ray-in-image"]["message"]
    # no raylet, GCS or `ray start` anywhere; rank 0 serves on the head, rank 1 is headless
    for node in lab.nodes:
        ray_left = lab.exec(node, "ps -eo args | grep -E 'raylet|gcs_server|ray start' | grep -v grep "
                                  "|| true").stdout.strip()
        assert ray_left == "", f"{node}: {ray_left}"
        assert lab.exec(node, f"docker exec {MP} sh -c 'command -v ray || echo none'").stdout.strip() \
            == "none"
    ranks = {n: lab.exec(n, f"docker exec {MP} ps -eo args").stdout for n in lab.nodes}
    serving = [line for line in ranks[head].splitlines() if line.startswith("python") or "vllm" in line]
    assert any("--nnodes 2" in line and "--node-rank 0" in line and "--master-addr 192.168.200.12"
               in line for line in serving), ranks[head]
    assert any("--nnodes 2" in line and "--node-rank 1" in line and "--headless" in line
               for line in ranks[other].splitlines()), ranks[other]
    chat = sparkctl("chat", "Hello", *inv(lab), "--max-tokens", "4")
    assert chat.returncode == 0, chat.stderr
    status = json.loads(sparkctl("status", *inv(lab), "--json").stdout)
    assert [(s["name"], s["state"]) for s in status["servers"]] == [("minimax-m2.7-mp", "healthy")]
    again = sparkctl("launch", "minimax-m2.7-mp", *inv(lab), "--yes", "--json")
    changed = [s for host in json.loads(again.stdout)["hosts"].values() for s in host["steps"]
               if s["status"] == "changed"]
    assert again.returncode == 0 and changed == [], again.stdout
    down = sparkctl("down", *inv(lab), "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    for node in lab.nodes:
        assert lab.exec(node, RAY_PROCESSES).stdout.strip() == "", node
