"""Nodes whose sudo asks for a password: sparkctl prompts once on a terminal, never logs it, and
without a terminal says what to do instead of hanging."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

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


def run_in_terminal(argv: list[str], answer: str, timeout: float = 120) -> tuple[int, str]:
    """Run argv on a pseudo-terminal, answer the first password prompt, return (exit, output)."""
    pid, fd = pty.fork()
    if pid == 0:  # child
        os.execve(argv[0], argv, ENV)
    output = b""
    prompts = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            output += chunk
            if output.count(b"sudo password for nvidia") > prompts:
                prompts += 1
                os.write(fd, answer.encode() + b"\n")
        finished, status = os.waitpid(pid, os.WNOHANG)
        if finished:
            break
    else:
        os.kill(pid, 9)
        raise AssertionError(f"timed out; output so far:\n{output.decode(errors='replace')}")
    _, status = os.waitpid(pid, 0) if not finished else (pid, status)
    return os.waitstatus_to_exitcode(status), output.decode(errors="replace")


def test_prompts_once_for_all_nodes_and_never_echoes_it(inventory: Path) -> None:
    code, output = run_in_terminal(
        [str(BIN / "sparkctl"), "up", "--inventory", str(inventory), "--dry-run"], PASSWORD
    )
    assert code == 0, output
    assert output.count("sudo password for nvidia") == 1, "one prompt for both nodes"
    assert PASSWORD not in output
    logs = list((STATE / "ctl" / "logs").glob("*.log"))
    assert logs and all(PASSWORD not in log.read_text() for log in logs)


def test_wrong_password_is_a_clear_failure(inventory: Path) -> None:
    code, output = run_in_terminal(
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
    assert "allow passwordless sudo for sparkctl or run it from a terminal" in result.stdout
