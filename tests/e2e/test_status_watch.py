"""`status --json` carries each node's available memory (read from the node's /proc/meminfo),
and `status --watch` redraws in place on a real terminal (tmux), ending on Ctrl-C."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, Lab, e2e_state

pytestmark = pytest.mark.lab

STATE = e2e_state("status-watch")
SPARKCTL = [sys.executable, "-m", "orchestrator.cli"]


def test_status_json_has_every_nodes_available_memory(lab: Lab) -> None:
    result = subprocess.run([*SPARKCTL, "status", "--inventory", str(lab.inventory), "--json"],
                            cwd=REPO, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "SPARKCTL_STATE_DIR": STATE})
    doc = json.loads(result.stdout)
    for node in lab.nodes:
        memory = doc["nodes"][node]["memory"]
        meminfo = lab.exec(node, "grep MemAvailable /proc/meminfo").stdout.split()[1]
        # the node's own figure, within what a few seconds of other work can move it: 5 % of
        # the node (the lab shows its cgroup 64 times larger, so 6.4 GB here are 100 MB of it)
        assert abs(memory["available_gb"] - int(meminfo) / 1024**2) < 0.05 * memory["total_gb"], memory
        assert memory["total_gb"] >= memory["available_gb"] > 0
        assert memory["guard_min_available_gb"] > 0
        assert "gpu_memory_used_gb" not in memory  # a GB10 says [N/A]: left out, not 0


def _pane(socket: str) -> str:
    return subprocess.run(["tmux", "-L", socket, "capture-pane", "-p", "-t", "watch"],
                          capture_output=True, text=True, check=True).stdout


def row_of(text: str, screen: str) -> int:
    return screen[: screen.index(text)].count("\n")


def test_status_watch_redraws_in_place_on_a_terminal(lab: Lab, tmp_path: Path) -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    socket = f"sparkctl-e2e-{os.getpid()}"
    # COLUMNS/LINES from pytest's own terminal would override the pane's size for rich
    command = (f"cd {REPO} && unset COLUMNS LINES && SPARKCTL_STATE_DIR={STATE} "
               f"{sys.executable} -m orchestrator.cli status --inventory {lab.inventory} --watch 1; "
               f"echo exited $? > {tmp_path}/rc")
    subprocess.run(["tmux", "-L", socket, "new-session", "-d", "-s", "watch", "-x", "220", "-y", "40",
                    command], check=True)
    try:
        first = second = screen = ""
        for _ in range(60):  # until two different looks were drawn
            time.sleep(1)
            screen = _pane(socket)
            if "Ctrl-C ends" in screen:
                if not first:
                    first = screen
                elif screen != first:
                    second = screen
                    break
        assert first and second, screen
        for screen in (first, second):
            assert screen.count("sparkctl status:") == 1, screen  # redrawn, not appended
            assert "┃ node" in screen and "GB available" in screen
        # on the same row: the title is centred, so its column moves with its length (a problem
        # count that changes between looks), its row only if the view were appended
        assert row_of("sparkctl status:", first) == row_of("sparkctl status:", second)
        subprocess.run(["tmux", "-L", socket, "send-keys", "-t", "watch", "C-c"], check=True)
        for _ in range(30):
            if (tmp_path / "rc").exists():
                break
            time.sleep(1)
        assert (tmp_path / "rc").read_text().strip() == "exited 0"
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)
