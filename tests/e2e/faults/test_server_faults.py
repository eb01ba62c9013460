"""Faults of a served model on the lab: a rank dying after ready, and Ctrl-C during launch's
health wait. (A hang while loading is tests/e2e/test_launch.py's last test.)
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Lab
from faultkit import SPARKCTL, converge, env, explain, lock_is_free, report_of, sparkctl, wait_for

pytestmark = pytest.mark.lab

NAME = "qwen3-235b"  # the server's name: its recipe's (no --name)
RUN = f"/var/lib/sparkctl/run/servers/{NAME}"  # its directory on each of its nodes
CONTAINER = "trtllm-multinode"
LAB_CONFIG = "/var/lib/sparklab/config/lab.json"
TOKEN = "hf_SENTINELserverFaults4242"  # the lab's hub serves gated models to any token


def listed(state: dict[str, Any]) -> dict[str, Any]:
    """The server's entry in status's "servers" list."""
    return next(s for s in state["servers"] if s["name"] == NAME)


def problem_of(state: dict[str, Any], node: str) -> str:
    """What status says about the server, on its first node's problems."""
    return next(p for p in state["nodes"][node]["problems"] if f"server {NAME} " in p)


def launch(lab: Lab, *extra: str, timeout: str = "60") -> subprocess.CompletedProcess[str]:
    return sparkctl(lab, "launch", "qwen3-235b", "--inventory", str(lab.inventory), "--yes",
                    "--json", "--timeout", timeout, *extra, timeout=300, HF_TOKEN=TOKEN)


def mpirun_alive(lab: Lab) -> bool:
    probe = f"docker exec {CONTAINER} sh -c 'kill -0 $(cat {RUN}/mpirun.pid)'"
    return lab.exec(lab.nodes[0], probe, check=False).returncode == 0


def stop_server(lab: Lab) -> None:
    lab.exec(lab.nodes[0], f"docker exec {CONTAINER} sh -c 'kill $(cat {RUN}/mpirun.pid)'",
             check=False)
    wait_for(lab, lab.nodes[0], f"! docker exec {CONTAINER} sh -c 'kill -0 $(cat {RUN}/mpirun.pid)'")


def set_engine_load_seconds(lab: Lab, seconds: float) -> None:
    edit = ("import json,sys; p=sys.argv[1]; c=json.load(open(p)); "
            f"c['engine_load_seconds']={seconds}; json.dump(c, open(p, 'w'))")
    for node in lab.nodes:
        lab.exec(node, ["python3", "-c", edit, LAB_CONFIG])


@pytest.fixture
def serving(lab: Lab) -> Iterator[Lab]:
    lab.cli("fault", "restore", check=True)
    converge(lab)
    result = launch(lab)
    assert result.returncode == 0, explain(result)
    yield lab
    lab.cli("fault", "restore", check=True)
    stop_server(lab)


def test_rank_dying_after_ready_is_reported_and_relaunch_recovers(serving: Lab,
                                                                  tally: Any) -> None:
    """status names the dead rank (exit 1); a relaunch of the same recipe sees the dead rank and
    restarts the server at once, healthy again."""
    lab = serving
    other = lab.nodes[1]
    lab.cli("fault", "rank-die", "--node", other, check=True)
    wait_for(lab, other, f"grep -q 'rank-die' {RUN}/rank-1.log")
    status = sparkctl(lab, "status", "--inventory", str(lab.inventory), "--json")
    assert status.returncode == 1, explain(status)
    state = report_of(status)
    assert state["ok"] is False and state["state"] == "degraded"
    # dead, with its node: not "starting" (issue 20 item 5)
    assert listed(state)["state"] == "dead", state["servers"]
    problem = problem_of(state, lab.nodes[0])
    assert "rank-1 (pid " in problem and f"on {other} ended" in problem, problem
    lab.cli("fault", "restore", check=True)
    again = launch(lab)
    assert again.returncode == 0, explain(again)
    steps = {(node, step["step"]): step["status"]
             for node, host in report_of(again)["hosts"].items() for step in host["steps"]}
    said = {key: step["message"] for key, step in (
        ((node, s["step"]), s) for node, host in report_of(again)["hosts"].items()
        for s in host["steps"])}
    assert steps[(lab.nodes[0], "server")] == "changed", said
    assert steps[(lab.nodes[0], "stop-previous")] == "changed", said
    assert f"restart, dead: rank ended (rank-1 on {other} (pid " in \
        said[(lab.nodes[0], "stop-previous")], said
    healthy = sparkctl(lab, "status", "--inventory", str(lab.inventory), "--json")
    assert healthy.returncode == 0 and listed(report_of(healthy))["state"] == "healthy"
    tally.add("faults survived")


def test_ctrl_c_during_the_health_wait_leaves_the_server_loading(serving: Lab,
                                                                 tally: Any) -> None:
    lab = serving
    stop_server(lab)
    set_engine_load_seconds(lab, 40)
    try:
        process = subprocess.Popen(
            [SPARKCTL, "launch", "qwen3-235b", "--inventory", str(lab.inventory), "--yes",
             "--timeout", "120"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env(lab, HF_TOKEN=TOKEN))
        seen = []
        assert process.stderr is not None
        for line in process.stderr:
            seen.append(line)
            if "deadline in" in line:  # the health wait's progress line
                process.send_signal(signal.SIGINT)
                break
        out, err = process.communicate(timeout=60)
        stderr = "".join(seen) + err
        assert process.returncode == 130, f"{process.returncode}\n{out}\n{stderr}"
        for hint in ("sparkctl logs --follow", "sparkctl status", "sparkctl down"):
            assert hint in stderr, stderr
        assert "keeps loading" in stderr and "Traceback" not in stderr
        assert mpirun_alive(lab), "Ctrl-C must stop the waiting only, not the server"
        assert lock_is_free(lab)
    finally:
        set_engine_load_seconds(lab, 3)
    tally.add("faults survived")


HEALTH = ("python3 -c 'import urllib.request as u, urllib.error as e\n"
          "try: print(u.urlopen(\"http://127.0.0.1:8355/health\", timeout=5).status)\n"
          "except e.HTTPError as x: print(x.code)\nexcept Exception: print(0)'")


def health_code(lab: Lab) -> str:
    return lab.exec(lab.nodes[0], HEALTH).stdout.strip()


def test_a_server_stalled_by_a_lost_fabric_link_is_stalled_and_relaunch_restarts_it(
        serving: Lab, tally: Any) -> None:
    """The head loses its fabric link mid-serve and gets it back: the engine (as TensorRT-LLM
    does) answers /health 503 for good. status says stalled (not "still loading"), with the log
    tail, and a launch of the same recipe restarts it instead of waiting out its deadline."""
    lab = serving
    head = lab.nodes[0]
    record = json.loads(lab.exec(head, f"cat {RUN}/server.json").stdout)
    assert record.get("ready_at"), record  # launch recorded that it was ready
    for iface in ("enp1s0f1np1", "enP2p1s0f1np1"):
        lab.cli("fault", "cut-cable", "--node", head, "--interface", iface, check=True)
    try:
        # the engine's step through every rank times out (30 s in the lab): it stops serving
        wait_for(lab, head, f'[ "$({HEALTH})" = 503 ]', seconds=90)
    finally:
        lab.cli("fault", "restore", check=True)
    assert health_code(lab) == "503"  # the link is back, the engine is not
    status = sparkctl(lab, "status", "--inventory", str(lab.inventory), "--json")
    assert status.returncode == 1, explain(status)
    state = report_of(status)
    assert listed(state)["state"] == "stalled", state["servers"]
    problem = problem_of(state, head)
    assert "still loading" not in problem and "/health now answers 503" in problem, problem
    logs = sparkctl(lab, "logs", "--inventory", str(lab.inventory), "--server", NAME)
    assert "Executor worker failed" in logs.stdout, explain(logs)
    human = sparkctl(lab, "status", "--inventory", str(lab.inventory))
    print(human.stdout)  # the docs show this output
    assert f"{NAME} (trtllm on " in human.stdout and "stalled)" in human.stdout, human.stdout
    again = launch(lab)
    assert again.returncode == 0, explain(again)
    said = {(node, s["step"]): (s["status"], s["message"])
            for node, host in report_of(again)["hosts"].items() for s in host["steps"]}
    print(json.dumps({f"{n} {s}": v for (n, s), v in said.items()}, indent=1))
    assert said[(head, "server")][0] == "changed", said
    assert said[(head, "stop-previous")][0] == "changed", said
    assert ": restart, stalled: ready at " in said[(head, "stop-previous")][1], said
    assert said[(head, "placement")][1].startswith(f"{NAME} already runs on {head}"), said
    healthy = sparkctl(lab, "status", "--inventory", str(lab.inventory), "--json")
    assert healthy.returncode == 0 and listed(report_of(healthy))["state"] == "healthy"
    tally.add("faults survived")
