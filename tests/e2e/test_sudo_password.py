"""Nodes whose sudo asks for a password: sparkctl prompts once on a terminal, never logs it, and
without a terminal says what to do instead of hanging."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_in_terminal

pytestmark = pytest.mark.lab

LAB_ID = os.environ.get("SPARKLAB_SUDO_ID", "2")
PASSWORD = "lab-sudo-pw-7731"
BIN = Path(sys.executable).parent
STATE = Path(f"/var/lib/sparklab/{LAB_ID}")
ENV = {**os.environ, "SPARKLAB_ID": LAB_ID, "SPARKCTL_STATE_DIR": str(STATE / "ctl"),
       "SPARKLAB_SUDO_PASSWORD": PASSWORD}


@pytest.fixture(scope="module")
def inventory() -> Iterator[Path]:
    up = subprocess.run([str(BIN / "sparkctl"), "lab", "up", "--force", "--sudo-password"],
                        env=ENV, capture_output=True, text=True, timeout=180, check=False)
    assert up.returncode == 0, up.stderr
    try:
        yield STATE / "inventory.yml"
    finally:
        subprocess.run([str(BIN / "sparkctl"), "lab", "down"], env=ENV, capture_output=True,
                       timeout=180, check=False)


def terminal(argv: list[str], answer: str, timeout: float = 120,
             confirm: str | None = None) -> tuple[int, str]:
    """Run argv on a pseudo-terminal as a person would: answer the sudo password prompt with
    `answer` and, when given, the "Apply these changes?" question with `confirm`."""
    replies = [(b"sudo password for nvidia", answer)]
    if confirm is not None:
        replies.append((b"Apply these changes", confirm))
    return run_in_terminal(argv, ENV, replies, timeout)


def test_prompts_once_for_all_nodes_and_never_echoes_it(inventory: Path) -> None:
    code, output = terminal(
        [str(BIN / "sparkctl"), "up", "--inventory", str(inventory), "--dry-run"], PASSWORD
    )
    assert code == 0, output
    assert output.count("sudo password for nvidia") == 1, "one prompt for both nodes"
    assert PASSWORD not in output
    logs = list((STATE / "ctl" / "logs").glob("*.log"))
    assert logs and all(PASSWORD not in log.read_text() for log in logs)


def test_wrong_password_is_a_clear_failure(inventory: Path) -> None:
    code, output = terminal(
        [str(BIN / "sparkctl"), "up", "--inventory", str(inventory), "--dry-run", "--json"],
        "wrong-password",
    )
    assert code == 1, output
    report = json.loads(output[output.index("{"):])
    for node in ("spark-a", "spark-b"):
        assert "sudo refused the password for nvidia" in report["hosts"][node]["steps"][0]["message"]


def test_without_a_terminal_it_says_what_to_do(inventory: Path) -> None:
    result = subprocess.run(
        [str(BIN / "sparkctl"), "up", "--inventory", str(inventory), "--dry-run", "--json"],
        env=ENV, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 1
    assert "allow passwordless sudo for sparkctl" in result.stdout
    assert "sudo_password_file" in result.stdout and "run it from a terminal" in result.stdout


def test_interactive_up_shows_the_plan_and_asks_before_changing(inventory: Path) -> None:
    up = [str(BIN / "sparkctl"), "up", "--inventory", str(inventory)]
    netplan = "ls /etc/netplan"
    code, output = terminal(up, PASSWORD, confirm="n")
    assert code == 1 and "cancelled; nothing was changed" in output, output
    assert re.search(r"/etc/netplan/40-sparkctl-fabric.yaml: new file \(\d+ lines\) on spark-a, "
                     r"spark-b", output), "the plan shows a line per changed file"
    assert "+++ /etc/netplan" not in output, "the full diff only with --diff"
    assert "40-sparkctl" not in node_exec("spark-a", netplan), "no means nothing changed"
    code, output = terminal(up, PASSWORD, confirm="y", timeout=240)
    assert code == 0, output
    assert output.count("sudo password for nvidia") == 1, "one prompt for plan and apply"
    assert "40-sparkctl-fabric.yaml" in node_exec("spark-a", netplan)
    code, output = terminal(up, PASSWORD, confirm="y")
    assert code == 0 and "Nothing to change." in output, output
    assert "Apply these changes" not in output


def node_exec(node: str, command: str) -> str:
    result = subprocess.run([str(BIN / "sparkctl"), "lab", "exec", node, "--", "sh", "-c", command],
                            env=ENV, capture_output=True, text=True, timeout=60, check=True)
    return result.stdout
