"""What `sparkctl launch` adds to starting a real server by hand (issue 40, item 3).

A two-node lab, `up`, and one untimed `launch lab-tiny-llama` so the image and the model are in
place (the real llama-server, built from source, with a real GGUF). Then, alternating in the
same run, with the server stopped before each:
- **sparkctl**: `sparkctl launch lab-tiny-llama --yes` until it returns (its checks, the server,
  readiness, smoke test, record);
- **by hand**: the very `docker run` sparkctl ran (read from its run log: same image, argv,
  mounts, host network), sent as a person would, over one OpenSSH connection as the cluster
  user, then `/health` polled on the node until it answers 200.
Reports the medians, sparkctl's added seconds and the ratio (target: within 1.3x).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks import floor
from benchmarks.labctl import Lab
from benchmarks.scenarios import Results, Settings

RECIPE = "lab-tiny-llama"
PORT = 8080  # the recipe's
BY_HAND = "sparkctl-bench-by-hand"
STOP = f"docker rm -f {BY_HAND} >/dev/null 2>&1; true"


def hand_command(run_log: str) -> str:
    """sparkctl's own `docker run` of the server from its run log, as a person would type it:
    another container name, no sparkctl labels, no runuser (the cluster user is in the docker
    group), without sparkctl's wait-for-the-container loop."""
    match = re.search(r"serve/llama-server runs: (.*)", run_log)
    if match is None:
        raise ValueError("the launch's run log names no llama-server command")
    command = match.group(1).split(" >/dev/null && {", 1)[0]
    command = command.split(" && ", 1)[1] if command.startswith("runuser ") else command
    words = shlex.split(command)
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
            continue
        if word == "--label":
            skip = True
            continue
        kept.append(word)
    name = kept.index("--name")
    kept[name + 1] = BY_HAND
    return shlex.join(kept)


def hand_script(docker_run: str) -> str:
    return (f"{docker_run} >/dev/null || exit 1\n"
            f"until curl -fsS -o /dev/null http://127.0.0.1:{PORT}/health; do sleep 0.1; done\n")


def by_hand(lab: Lab, script: str) -> float:
    data = lab.inventory_data()
    cluster, node = data["cluster"], data["nodes"][0]
    argv = floor.ssh_argv(node["host"], cluster["user"], Path(cluster["ssh_key"]),
                          Path(cluster["known_hosts"]), int(cluster.get("ssh_port", 22)))
    started = time.perf_counter()
    proc = subprocess.run(argv, input=script.encode(), capture_output=True, timeout=600, check=False)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise ValueError(f"by hand: exit {proc.returncode}: {proc.stderr.decode()[-300:]}")
    return seconds


def breakdown(report: dict[str, Any], wall: float) -> str:
    """The steps that took longest (seconds summed over nodes), and the rest of the wall time
    (start-up, connections, facts, phases' bookkeeping)."""
    steps: dict[str, float] = {}
    for host in (report.get("hosts") or {}).values():
        for step in host.get("steps") or []:
            key = f"{step.get('phase')}/{step.get('step')}"
            steps[key] = max(steps.get(key, 0.0), float(step.get("seconds") or 0.0))
    top = sorted(steps.items(), key=lambda item: -item[1])[:5]
    rest = wall - sum(seconds for _, seconds in steps.items())
    return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in top) + (
        f"; everything else (start-up, connections, facts) {rest:.1f} s of {wall:.1f} s")


def bench_launch(s: Settings, res: Results, workdir: Path) -> None:
    lab = Lab(s.lab_id, 2, "b2b", workdir)
    s.log("launch overhead: lab up, up, first launch (image and model put in place)")
    lab.up(s.engine_load_seconds, s.model_bytes)
    try:
        if not lab.sparkctl("up", "--yes").ok:
            res.notes.append("launch overhead: `up` failed")
            return
        first = lab.sparkctl("launch", RECIPE, "--yes", "--timeout", "300")
        if not first.ok:
            res.notes.append(f"launch overhead: first launch failed: {first.failure()}")
            return
        logs = sorted((workdir / "state" / "logs").glob("*-launch.log"))
        script = hand_script(hand_command(logs[-1].read_text()))
        head = lab.node_names()[0]
        ours = res.row(f"launch {RECIPE} (real llama-server), model in place",
                       note="checks, server, readiness, smoke test, record")
        hand = res.row(f"floor: the same docker run by hand + /health, {RECIPE}",
                       note="1 OpenSSH conn, same argv")
        for run in range(s.runs):
            s.log(f"launch overhead run {run + 1}/{s.runs}")
            lab.sparkctl("down", "--server", RECIPE, "--yes")
            timed = lab.sparkctl("launch", RECIPE, "--yes", "--timeout", "300")
            res.add(ours.name, timed)
            lab.sparkctl("down", "--server", RECIPE, "--yes")
            try:
                hand.runs.append(by_hand(lab, script))
            except (ValueError, subprocess.SubprocessError) as exc:
                hand.runs.append(None)
                res.notes.append(f"launch overhead: {exc}")
            lab.exec(head, STOP, check=False)
        if ours.value is not None and hand.value is not None:
            res.row("launch: seconds sparkctl adds", note="median - median").runs.append(
                ours.value - hand.value)
        if timed.ok:
            res.notes.append("launch overhead, where the last sparkctl run went: "
                             + breakdown(timed.report, timed.seconds))
    finally:
        lab.sparkctl("down", "--yes")
        lab.down()
