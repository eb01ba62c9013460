"""Every server is the same kind of thing, whichever engine serves it (docs/launch.md).

One `up` for the module. TensorRT-LLM placed on the head and SGLang placed on the other node
serve at once and both answer; two TensorRT-LLM servers serve at once, each on its node, and
`down --server` stops one and leaves the other; a TensorRT-LLM server started the previous way
(RUN_DIR/server.json) is listed and replaced by one in its own directory; a tp2 recipe named on
one node is refused before anything runs; memory squeezed under the guard's threshold on the
SGLang node stops that server within a minute while the other keeps answering, and status exits
1 saying why; a server container killed makes status exit 1 naming it; a bench sweep of a
placed, named server measures and restores exactly that server; two vLLM servers, one per node,
serve at once, and the guard stops the one on a squeezed node while the other answers.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest
from conftest import Lab, Sparkctl, fresh_up

pytestmark = pytest.mark.lab

SENTINEL = "hf_SENTINELserversToken5120"
SGLANG = "sparkctl-sglang-qwen3.6-27b"


sparkctl = Sparkctl("servers", token=SENTINEL)


def inv(lab: Lab) -> list[str]:
    return ["--inventory", str(lab.inventory)]


# TensorRT-LLM sizes its KV cache at 0.9 of what is free, so gpt-oss-120b leaves its node ~6 GB
# (scaled) above the default 2 GB guard; each of the lab's own unscaled helper processes (a Python
# docker or nvidia-smi shim, ~20 MB real) shows as ~1.3 GB at scale 64, and under a loaded CI a few
# at once tripped the guard on a server nobody squeezed. This module squeezes other servers only.
LOOSER_GUARD = {"gpt-oss-120b": ("--guard-min-available-gb", "1")}


def launch(lab: Lab, *args: str) -> subprocess.CompletedProcess[str]:
    guard = LOOSER_GUARD.get(args[0], ()) if args else ()
    result = sparkctl("launch", *args, *guard, *inv(lab), "--yes", "--timeout", "240")
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def status(lab: Lab) -> tuple[int, dict]:
    result = sparkctl("status", *inv(lab), "--json")
    return result.returncode, json.loads(result.stdout)


def problems(doc: dict) -> str:
    return "\n".join(p for node in doc["nodes"].values() for p in node["problems"])


def answers(lab: Lab, server: str) -> bool:
    chat = sparkctl("chat", "Hello", *inv(lab), "--server", server, "--max-tokens", "8", "--json")
    return chat.returncode == 0 and bool(json.loads(chat.stdout)["reply"])


def free_gb(lab: Lab, node: str) -> float:
    meminfo = lab.exec(node, "cat /proc/meminfo").stdout
    return int(meminfo.split("MemAvailable:")[1].split()[0]) / 1024**2


def squeeze_under_guard(lab: Lab, node: str) -> None:
    """Hold all but 1 GB of what the node has available (to the MiB): under the guard's 2 GB
    with room for MemAvailable's own moves, above what the node's OOM killer allows."""
    size = max(1, int((free_gb(lab, node) - 1.0) * 1024))
    squeeze = lab.cli("fault", "squeeze-memory", "--node", node, "--size", f"{size}M")
    assert squeeze.returncode == 0, squeeze.stderr


def wait_stopped(lab: Lab, node: str, container: str, seconds: float = 60) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        running = lab.exec(node, f"docker inspect -f '{{{{.State.Running}}}}' {container}",
                           check=False).stdout.strip()
        if running != "true":
            return True
        time.sleep(1)
    return False


@pytest.fixture(scope="module")
def two(lab_session: list[Lab]) -> Iterator[Lab]:
    # start from no server at all
    lab = fresh_up(lab_session, sparkctl)
    head, other = lab.nodes
    launch(lab, "gpt-oss-120b", "--nodes", head)
    launch(lab, "qwen3.6-27b", "--nodes", other)
    yield lab
    lab.cli("fault", "restore")
    sparkctl("down", *inv(lab), "--yes")


def test_two_engines_placed_on_their_nodes_serve_at_once(two: Lab) -> None:
    head, other = two.nodes
    assert answers(two, "gpt-oss-120b") and answers(two, "qwen3.6-27b")
    code, doc = status(two)
    assert code == 0, problems(doc)
    listed = {s["name"]: s for s in doc["servers"]}
    assert (listed["gpt-oss-120b"]["engine"], listed["gpt-oss-120b"]["nodes"]) == ("trtllm", [head])
    assert (listed["qwen3.6-27b"]["engine"], listed["qwen3.6-27b"]["nodes"]) == ("sglang", [other])
    text = sparkctl("status", *inv(two)).stdout
    assert "servers: 2: gpt-oss-120b (trtllm on " + head in text
    assert "qwen3.6-27b (sglang on " + other in text


def test_two_tensorrt_llm_servers_serve_at_once_and_stop_one_by_one(two: Lab) -> None:
    """Each in the `up` container of its own node, its mpirun's ranks on its nodes only."""
    _, other = two.nodes
    assert sparkctl("down", "--server", "qwen3.6-27b", *inv(two), "--yes").returncode == 0
    try:
        launch(two, "gpt-oss-120b", "--nodes", other, "--name", "gpt2", "--port", "8001")
        assert answers(two, "gpt-oss-120b") and answers(two, "gpt2")
        code, doc = status(two)
        assert code == 0, problems(doc)
        listed = {s["name"]: s for s in doc["servers"]}
        assert set(listed) == {"gpt-oss-120b", "gpt2"}
        assert (listed["gpt2"]["engine"], listed["gpt2"]["nodes"], listed["gpt2"]["port"],
                listed["gpt2"]["state"]) == ("trtllm", [other], 8001, "healthy")
        mpirun = lab_ps(two, other, "mpirun")
        assert "/servers/gpt2/" in mpirun and "/servers/gpt-oss-120b/" not in mpirun
        down = sparkctl("down", "--server", "gpt2", *inv(two), "--yes")
        assert down.returncode == 0, down.stdout + down.stderr
        assert "trtllm-serve" not in lab_ps(two, other, "trtllm")
        assert answers(two, "gpt-oss-120b")
        code, doc = status(two)
        assert code == 0 and [s["name"] for s in doc["servers"]] == ["gpt-oss-120b"], problems(doc)
    finally:
        sparkctl("down", "--server", "gpt2", *inv(two), "--yes")
        launch(two, "qwen3.6-27b", "--nodes", other)  # as the module's fixture left it


def start_the_previous_way(lab: Lab, node: str) -> None:
    """gpt-oss-120b as the previous version started it: its record RUN_DIR/server.json (no name,
    no engine, no nodes), mpirun's and the rank's pid files and logs directly in RUN_DIR, the
    cluster's hostfile (head first)."""
    from orchestrator.commands import quote
    from orchestrator.engines import load_recipe
    from orchestrator.engines.trtllm.serve import render_llm_api_config, serve_argv, server_dir
    from orchestrator.remote.container import ContainerCommands

    run = "/var/lib/sparkctl/run"
    recipe = load_recipe("gpt-oss-120b")
    argv = [w.replace(server_dir(recipe.name), run) for w in serve_argv(recipe, "127.0.0.1")]
    wrapper = f'echo $$ > {run}/mpirun.pid; exec "$@" > {run}/server.log 2>&1'
    lab.exec(node, f"printf '%s' {quote(render_llm_api_config(recipe))} > "
                   f"{run}/extra-llm-api-config.yml")
    record = {"recipe": recipe.name, "model": recipe.model, "port": recipe.port,
              "tp_size": 1, "config_hash": "previous", "host": "127.0.0.1"}
    lab.exec(node, f"printf '%s' {quote(json.dumps(record))} > {run}/server.json")
    lab.exec(node, ContainerCommands("trtllm-multinode").exec_cmd(
        ["bash", "-c", wrapper, "sparkctl-server", *argv], env={"HF_HUB_OFFLINE": "1"}, detach=True))


def test_a_server_of_the_previous_version_is_seen_and_replaced_by_one_per_server(two: Lab) -> None:
    """The one-time migration: the first read (status) converts its record and moves its
    files into its own directory; status lists it; launching its recipe stops it and starts
    one server as configured now (never a second copy), and says so."""
    head, _ = two.nodes
    assert sparkctl("down", "--server", "gpt-oss-120b", *inv(two), "--yes").returncode == 0
    start_the_previous_way(two, head)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # (a deadline for it to load, not a timed assertion)
        code, doc = status(two)
        listed = {s["name"]: s for s in doc["servers"]}
        if listed.get("gpt-oss-120b", {}).get("state") == "healthy":
            break
        time.sleep(2)
    assert code == 0 and listed["gpt-oss-120b"]["legacy"], problems(doc)
    # the first read migrated it once: its record and pid files in its own directory now
    run = "/var/lib/sparkctl/run"
    moved = two.exec(head, f"cat {run}/servers/gpt-oss-120b/server.json; "
                           f"test -e {run}/servers/gpt-oss-120b/mpirun.pid && "
                           f"test ! -e {run}/server.json && test ! -e {run}/mpirun.pid", check=False)
    assert moved.returncode == 0 and f'"migrated_from": "{run}/server.json"' in moved.stdout
    assert answers(two, "gpt-oss-120b")
    result = launch(two, "gpt-oss-120b", "--nodes", head, "--json")
    steps = {s["step"]: s for s in json.loads(result.stdout)["hosts"][head]["steps"]}
    assert "launched by an earlier sparkctl" in json.dumps(steps["placement"]), steps["placement"]
    assert two.exec(head, "test -e /var/lib/sparkctl/run/server.json", check=False).returncode
    mpiruns = [line for line in lab_ps(two, head, "mpirun").splitlines()
               if line.startswith("mpirun")]
    assert len(mpiruns) == 1 and "/servers/gpt-oss-120b/" in mpiruns[0], mpiruns
    code, doc = status(two)
    listed = {s["name"]: s for s in doc["servers"]}
    assert code == 0 and not listed["gpt-oss-120b"]["legacy"], problems(doc)
    assert answers(two, "gpt-oss-120b")


def lab_ps(lab: Lab, node: str, word: str) -> str:
    """The command lines in the node's `up` container holding WORD."""
    out = lab.exec(node, "docker exec trtllm-multinode ps -eo args", check=False).stdout
    return "\n".join(line for line in out.splitlines() if word in line)


def test_a_tp2_recipe_on_one_node_is_refused_before_anything_runs(two: Lab) -> None:
    _, other = two.nodes
    result = sparkctl("launch", "qwen3.6-27b-tp2", "--nodes", other, *inv(two), "--dry-run")
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"recipe qwen3.6-27b-tp2 on {other}" in result.stderr
    assert "tp_size 2 x pp_size 1 = 2 rank(s)" in result.stderr and "Traceback" not in result.stderr


def test_the_guard_stops_the_sglang_server_while_the_other_keeps_answering(two: Lab) -> None:
    _, other = two.nodes
    try:
        squeeze_under_guard(two, other)
        assert wait_stopped(two, other, SGLANG), "the guard did not stop SGLang within a minute"
        assert answers(two, "gpt-oss-120b")
        code, doc = status(two)
        assert code == 1
        assert "qwen3.6-27b" in problems(doc) and "stopped by the memory guard at" in problems(doc)
        listed = {s["name"]: s["state"] for s in doc["servers"]}
        assert listed == {"gpt-oss-120b": "healthy", "qwen3.6-27b": "guard-stopped"}
    finally:
        two.cli("fault", "restore")
    launch(two, "qwen3.6-27b", "--nodes", other)  # it comes back
    assert answers(two, "qwen3.6-27b") and status(two)[0] == 0


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_a_killed_server_container_makes_status_name_it(two: Lab, engine: str) -> None:
    head, other = two.nodes
    node, container, name = ((other, SGLANG, "qwen3.6-27b") if engine == "sglang" else
                             (head, "trtllm-multinode", "gpt-oss-120b"))
    two.exec(node, f"docker kill {container}")
    code, doc = status(two)
    assert code == 1 and f"server {name} (" in problems(doc), problems(doc)
    if engine == "trtllm":
        assert sparkctl("up", *inv(two), "--yes").returncode == 0
        launch(two, "gpt-oss-120b", "--nodes", head)
    else:
        launch(two, "qwen3.6-27b", "--nodes", other)  # a dead server is started again
    assert status(two)[0] == 0


def test_a_bench_sweep_of_a_placed_named_server_measures_and_restores_it(two: Lab) -> None:
    _, other = two.nodes
    assert sparkctl("down", "--server", "qwen3.6-27b", *inv(two), "--yes").returncode == 0
    launch(two, "qwen3.6-27b", "--nodes", other, "--name", "q2", "--port", "30001")
    result = sparkctl("bench", *inv(two), "--server", "q2", "--sweep", "speculative.num_steps=2,3",
                      "--tg", "32", "--pp", "16", "--depth", "0", "-c", "1", "--runs", "1",
                      "--no-warmup", "--json", "--timeout", "180", timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    sweep = json.loads(result.stdout)["sweep"]
    assert sweep["restored"] and [r["value"] for r in sweep["runs"]] == [2, 3]
    for run in sweep["runs"]:
        assert (run["server"]["server"], run["server"]["head"], run["server"]["port"]) == (
            "q2", other, 30001)
    code, doc = status(two)
    after = {s["name"]: s for s in doc["servers"]}
    assert code == 0 and set(after) == {"gpt-oss-120b", "q2"}, (problems(doc), after)
    assert (after["q2"]["nodes"], after["q2"]["port"]) == ([other], 30001)


VLLM = "sparkctl-vllm-gpt-oss-120b-vllm"


def test_two_vllm_servers_one_per_node_serve_at_once(two: Lab) -> None:
    """Each vLLM server is its own: containers, ports and record on its own node."""
    head, other = two.nodes
    for name in ("gpt-oss-120b", "q2"):  # the node's memory for the vLLM servers
        assert sparkctl("down", "--server", name, *inv(two), "--yes").returncode == 0
    launch(two, "gpt-oss-120b-vllm", "--nodes", head)
    launch(two, "gpt-oss-120b-vllm", "--nodes", other, "--name", "vllm-b")
    assert answers(two, "gpt-oss-120b-vllm") and answers(two, "vllm-b")
    code, doc = status(two)
    assert code == 0, problems(doc)
    listed = {s["name"]: s for s in doc["servers"]}
    assert (listed["gpt-oss-120b-vllm"]["nodes"], listed["vllm-b"]["nodes"]) == ([head], [other])
    assert {s["engine"] for s in listed.values()} == {"vllm"}
    assert listed["vllm-b"]["container"] == "sparkctl-vllm-vllm-b"
    record = json.loads(two.exec(other, "cat /var/lib/sparkctl/run/servers/vllm-b/server.json").stdout)
    assert (record["engine"], record["nodes"], record["port"]) == ("vllm", [other], 8000)


def test_the_guard_stops_a_vllm_server_while_the_other_keeps_answering(two: Lab) -> None:
    head, _ = two.nodes
    try:
        squeeze_under_guard(two, head)
        assert wait_stopped(two, head, VLLM), "the guard did not stop vLLM in a minute"
        assert answers(two, "vllm-b")
        code, doc = status(two)
        assert code == 1 and "server gpt-oss-120b-vllm (vllm" in problems(doc)
        assert "stopped by the memory guard at" in problems(doc)
    finally:
        two.cli("fault", "restore")
