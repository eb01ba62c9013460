"""Shared helpers of the fault tests: run sparkctl (plain or with a hook), read its report,
snapshot what must not change, and converge the lab.

Not a test module (no test_ prefix); the fault modules import it by name (pytest puts this
directory on sys.path).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from conftest import REPO, Lab

SPARKCTL = str(REPO / ".venv" / "bin" / "sparkctl")
CONTAINER = "trtllm-multinode"
LOCK_DIR = "/var/lib/sparkctl/lock"
WATCHED = "/etc/netplan /etc/sparkctl"


def env(lab: Lab, **extra: str) -> dict[str, str]:
    out = {**os.environ, "SPARKLAB_ID": str(lab.lab_id),
           "SPARKCTL_STATE_DIR": str(lab.state_dir / "ctl-faults"), **extra}
    out.pop("HF_TOKEN", None)
    out.update(extra)
    return out


def sparkctl(lab: Lab, *args: str, timeout: float = 240, **extra_env: str
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SPARKCTL, *args], capture_output=True, text=True, timeout=timeout,
                          env=env(lab, **extra_env), cwd=REPO)


def report_of(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        return dict(json.loads(result.stdout))
    except json.JSONDecodeError:
        raise AssertionError(f"no JSON on stdout (exit {result.returncode}):\n{result.stdout}\n"
                             f"{result.stderr[-3000:]}") from None


def steps(report: dict[str, Any], status: str | None = None) -> list[tuple[str, str, str, str]]:
    """(node, phase, step, message) of every step (with that status)."""
    return [(node, s["phase"], s["step"], s["message"]) for node, host in report["hosts"].items()
            for s in host["steps"] if status is None or s["status"] == status]


def explain(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-3000:]}"


def up(lab: Lab, inventory: Path | None = None, *extra: str) -> subprocess.CompletedProcess[str]:
    return sparkctl(lab, "up", "--inventory", str(inventory or lab.inventory), "--yes", "--json",
                    *extra)


def converge(lab: Lab, inventory: Path | None = None) -> dict[str, Any]:
    """`up` must succeed; returns its report."""
    result = up(lab, inventory)
    assert result.returncode == 0, explain(result)
    report = report_of(result)
    assert report["ok"], explain(result)
    return report


def converged_twice(lab: Lab) -> None:
    """A re-run converges, and the run after it has nothing left to do."""
    converge(lab)
    again = converge(lab)
    assert again["changed"] == 0, steps(again, "changed")


def snapshot(lab: Lab, node: str, paths: str = WATCHED) -> str:
    """Checksums, modes and mtimes of every file under `paths` on the node."""
    return lab.exec(node, f"find {paths} -type f -exec stat -c '%n %a %Y' {{}} + 2>/dev/null "
                          f"| sort; find {paths} -type f -exec sha256sum {{}} + 2>/dev/null "
                          "| sort; true").stdout


def container_id(lab: Lab, node: str) -> str:
    return lab.exec(node, f"docker inspect -f '{{{{.Id}}}} {{{{.State.Status}}}}' {CONTAINER} "
                          "2>/dev/null || echo none", user="nvidia").stdout.strip()


def wait_for(lab: Lab, node: str, condition: str, seconds: int = 30) -> None:
    """Poll a shell condition inside a node (with a deadline)."""
    tries = seconds * 5
    lab.exec(node, f"for i in $(seq {tries}); do {condition} && exit 0; sleep 0.2; done; exit 1")


def lock_is_free(lab: Lab) -> bool:
    return lab.exec(lab.nodes[0], f"test -e {LOCK_DIR}", check=False).returncode != 0


def wait_for_file(path: Path, seconds: float = 120) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.1)
    return False


# A sparkctl process with one step's apply wrapped (the hook code is formatted in).
HOOKED_CLI = """
import os, sys, time
sys.path.insert(0, {repo!r})
sys.argv = ["sparkctl", *{args!r}]
{hook}
from orchestrator.cli import main
main()
"""


def hooked(lab: Lab, hook: str, *args: str) -> subprocess.Popen[str]:
    code = HOOKED_CLI.format(repo=str(REPO), args=list(args), hook=hook)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env(lab), cwd=REPO)
