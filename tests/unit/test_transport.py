"""The local transport (sparkctl run on a node itself) and sudo handling, without SSH."""

from __future__ import annotations

import os

import pytest

from orchestrator.errors import CommandError, TransportError
from orchestrator.remote.transport import LocalTransport, SudoPassword, is_local_host


def transport() -> LocalTransport:
    return LocalTransport("spark-a", "nvidia", SudoPassword(prompt=False), default_timeout=5)


def test_local_commands_run_with_stdin_and_exit_status() -> None:
    result = transport().run("tr a-z A-Z", stdin="spark\n")
    assert result.ok and result.stdout == "SPARK\n"
    failed = transport().run("echo oops >&2; exit 3")
    assert failed.exit_status == 3 and failed.stderr == "oops\n"
    with pytest.raises(CommandError, match=r"spark-a: `exit 3` exited 3"):
        transport().run("exit 3").check()


def test_local_commands_time_out() -> None:
    with pytest.raises(TransportError, match="timed out after 1s"):
        transport().run("sleep 5", timeout=1)


def test_sudo_is_wrapped_unless_already_root() -> None:
    local = transport()
    command, _, _ = local._command("id -u", sudo=True, stdin=b"")
    if os.geteuid() == 0:
        assert command == "id -u"
    else:
        assert command.startswith("sudo -n -- sh -c ")
    local.user_is_root = False
    command, _, _ = local._command("echo 'a b'", sudo=True, stdin=b"")
    assert command == "sudo -n -- sh -c 'echo '\"'\"'a b'\"'\"''"


def test_password_goes_on_stdin_never_on_the_command_line() -> None:
    local = transport()
    local.user_is_root = False
    local._needs_password = True
    local.sudo_password._password = "s3cret-pw"
    command, stdin, _ = local._command("true", sudo=True, stdin=b"data")
    assert "s3cret-pw" not in command and command.startswith("sudo -S -p '' -- ")
    assert stdin == b"s3cret-pw\ndata"


def test_no_terminal_means_a_clear_error_instead_of_a_prompt() -> None:
    with pytest.raises(TransportError, match="passwordless sudo"):
        SudoPassword(prompt=False).get("nvidia")


def test_localhost_is_local() -> None:
    assert is_local_host("localhost") and is_local_host("127.0.0.1")
    assert not is_local_host("192.0.2.77")
