"""What a second hostile first hour found (issue 27), on the lab: a port taken on one node is
refused in preflight, on that node's step, before any model moves, for every engine and every
port the server binds (HTTP, Ray's GCS, SGLang's dist-init).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest
from conftest import Lab, Sparkctl, fresh_up, healthy_lab

pytestmark = pytest.mark.lab


sparkctl = Sparkctl("hostile", token="hf_e2eHostile1")


@pytest.fixture(scope="module")
def hlab(lab_session: list[Lab]) -> Iterator[Lab]:
    lab = fresh_up(lab_session, sparkctl)
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


def wait_for_chat(lab: Lab, seconds: float, server: str) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + seconds
    while True:
        answer = sparkctl("chat", "--inventory", str(lab.inventory), "--server", server,
                          "--max-tokens", "8", "--json", "Hello after the reboot", timeout=120)
        if answer.returncode == 0 or time.monotonic() > deadline:
            return answer
        time.sleep(3)


def boot_log(lab: Lab, node: str, server: str) -> str:
    """The node's boot log for `server`, once its boot finished."""
    deadline = time.monotonic() + 120
    while True:
        boot = lab.exec(node, "cat /var/log/sparklab-boot.log").stdout.split("-- boot")[-1]
        if "boot finished" in boot or time.monotonic() > deadline:
            break
        time.sleep(1)
    return lab.exec(node, f"cat /var/log/sparkctl/boot-{server}.log", check=False).stdout


def test_status_knows_a_dead_ray_worker_at_once(hlab: Lab) -> None:
    """The worker's Ray container killed: the very next status says so (docker's fact), not
    Ray's view that still counts the node alive for ~25 s."""
    inv = ["--inventory", str(hlab.inventory)]
    launch = sparkctl("launch", "minimax-m2.7", *inv, "--yes", "--json", "--replace")
    assert launch.returncode == 0, launch.stdout[-3000:] + launch.stderr[-3000:]
    head, worker = hlab.nodes
    hlab.exec(worker, "docker kill sparkctl-vllm-minimax-m2.7")
    status = sparkctl("status", *inv, "--json")
    assert status.returncode == 1, status.stdout + status.stderr
    report = json.loads(status.stdout)
    (server,) = [s for s in report["servers"] if s["name"] == "minimax-m2.7"]
    assert server["state"] == "dead" and server["dead_nodes"] == [worker], server
    assert any(p.startswith("server minimax-m2.7 (vllm") and "is dead" in p
               for p in report["nodes"][head]["problems"]), report["nodes"][head]
    again = sparkctl("launch", "minimax-m2.7", *inv, "--yes", "--json")  # (leaves it serving)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]


CORRUPT = ("import glob,os,re\n"
           "blobs=[b for b in glob.glob('/root/.cache/huggingface/hub/models--nvidia--MiniMax*/blobs/*')"
           " if re.fullmatch('[0-9a-f]{64}', os.path.basename(b))]\n"
           "b=max(blobs, key=os.path.getsize); st=os.stat(b); d=bytearray(open(b,'rb').read())\n"
           "d[len(d)//2]^=255; open(b,'wb').write(bytes(d))\n"
           "os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns))\n"
           "print(b)")


def test_a_blob_changed_in_place_is_found_by_status_deep_and_repaired_by_verify_models(
        hlab: Lab) -> None:
    """Size and mtime kept: the fan-out's hash cache cannot see it; a re-hash can."""
    inv = ["--inventory", str(hlab.inventory)]
    launch = sparkctl("launch", "minimax-m2.7", *inv, "--yes", "--json", "--replace")
    assert launch.returncode == 0, launch.stdout[-3000:] + launch.stderr[-3000:]
    worker = hlab.nodes[1]
    blob = hlab.exec(worker, ["docker", "exec", "trtllm-multinode", "python3", "-c", CORRUPT]
                     ).stdout.strip()
    assert blob
    fast = sparkctl("status", *inv, "--json")
    assert fast.returncode == 0, fast.stdout[-2000:]  # what the fast path trusts
    deep = sparkctl("status", *inv, "--json", "--deep")
    assert deep.returncode == 1, deep.stdout[-3000:] + deep.stderr[-3000:]
    problems = json.loads(deep.stdout)["nodes"][worker]["problems"]
    assert any("model files of minimax-m2.7 differ from their sha256 names" in p
               and "--verify-models` repairs them" in p for p in problems), problems
    repair = sparkctl("launch", "minimax-m2.7", *inv, "--yes", "--json", "--verify-models")
    assert repair.returncode == 0, repair.stdout[-3000:] + repair.stderr[-3000:]
    verified = steps(json.loads(repair.stdout), worker)["verify-models/verify-models"]
    assert verified["status"] == "changed" and "differ from the head's" in verified["message"]
    again = sparkctl("status", *inv, "--json", "--deep")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    (checked,) = json.loads(again.stdout)["models_verified"]
    assert checked["nodes"][worker]["differ"] == [] and checked["nodes"][worker]["files"] > 0


def stop_every_server(lab: Lab) -> None:
    """Every server (and its boot units) stopped by name: two big models do not fit a node
    together. Not `down` and `up` again: the cluster stays up (status said so after the last
    reboot), and a full `up` per case cost ~40 s of the module (~2 minutes on a loaded run)."""
    inv = ["--inventory", str(lab.inventory)]
    for server in json.loads(sparkctl("status", *inv, "--json").stdout)["servers"]:
        down = sparkctl("down", *inv, "--server", server["name"], "--yes")
        assert down.returncode == 0, down.stdout + down.stderr


@pytest.mark.parametrize(("recipe", "extra", "rebooted"), [
    ("minimax-m2.7", [], 1),  # vLLM: only the Ray worker's node
    ("minimax-m2.7", [], 0),  # vLLM: only the head
    ("qwen3-235b", [], 1),  # TensorRT-LLM: only the second rank's node
    ("qwen3.6-27b-tp2", [], 1),  # SGLang across both nodes: only rank 1's
])
def test_a_persistent_server_comes_back_after_one_of_its_nodes_reboots(
        hlab: Lab, recipe: str, extra: list[str], rebooted: int) -> None:
    inv = ["--inventory", str(hlab.inventory)]
    stop_every_server(hlab)
    launch = sparkctl("launch", recipe, *inv, "--yes", "--json", "--persist", *extra)
    assert launch.returncode == 0, launch.stdout[-3000:] + launch.stderr[-3000:]
    node = hlab.nodes[rebooted]
    result = hlab.cli("reboot", "--node", node)
    assert result.returncode == 0, result.stdout + result.stderr
    # healthy again, as status sees it (a chat may slip through before the stall shows)
    deadline = time.monotonic() + 300
    while True:
        status = json.loads(sparkctl("status", *inv, "--json").stdout)
        if status["ok"] or time.monotonic() > deadline:
            break
        time.sleep(5)
    logs = {n: boot_log(hlab, n, recipe) for n in hlab.nodes}
    assert status["ok"], json.dumps(status)[-2000:] + "".join(
        f"\nboot log of {n}:\n{text}" for n, text in logs.items())
    answer = wait_for_chat(hlab, 60, recipe)
    assert answer.returncode == 0, answer.stdout + answer.stderr
    # the rebooted node's log says what it achieved, nothing more; its "up:" line comes after the
    # boot unit's own probe answers, which may be seconds after status and a chat did
    deadline, log = time.monotonic() + 60, logs[node]
    while "up: " not in log and time.monotonic() < deadline:
        time.sleep(2)
        log = boot_log(hlab, node, recipe)
    assert "up: " in log, log


def test_the_lab_behaves_like_machines_not_like_children_of_the_callers_shell(
        lab_session: list[Lab]) -> None:
    """Issue 41: a node inherited the caller's whole environment (an HF_TOKEN exported when the
    lab started was in every node's /proc/1/environ); `lab exec` died with a traceback after
    60 s, printing the argv; every `lab up` made new host keys, so a key pinned by `init
    --trust-new-hosts` failed the next lab's every run with "HOST KEY CHANGED"."""
    lab = healthy_lab(lab_session)
    environ = dict(entry.split("=", 1) for entry in
                   lab.exec("spark-a", ["cat", "/proc/1/environ"]).stdout.split("\0") if entry)
    # (LIBMOUNT_UTAB: the lab's own init sets it; PWD: the shell that is PID 1, started in /)
    assert set(environ) <= {"PATH", "LANG", "HOME", "LIBMOUNT_UTAB", "PWD"}, environ
    assert environ.get("PWD", "/") == "/", environ
    overran = lab.cli("exec", "--timeout", "2", "spark-a", "--", "sh", "-c",
                      "sleep 30 # secret-argument")
    assert overran.returncode == 1 and "did not finish within 2 s" in overran.stderr
    assert "Traceback" not in overran.stderr and "secret-argument" not in overran.stderr
    before = lab.known_hosts.read_text()
    lab.cli("up", "--force", check=True)  # (down, then up again: the same lab id)
    lab_session[0] = Lab.load(lab.lab_id)
    assert lab_session[0].known_hosts.read_text() == before
