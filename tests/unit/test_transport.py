"""The local transport (sparkctl run on a node itself) and sudo handling, without SSH."""

from __future__ import annotations

import os
from pathlib import Path

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


def test_a_refused_password_is_asked_again_for_that_node_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import orchestrator.remote.transport as module

    prompts: list[str] = []
    answers = iter(["shared-pw-1", "b-only-pw-2"])

    def answer(prompt: str) -> str:
        prompts.append(prompt)
        return next(answers)
    monkeypatch.setattr(module.getpass, "getpass", answer)
    sudo = SudoPassword(prompt=True)
    assert sudo.get("nvidia", "spark-a") == "shared-pw-1"
    assert sudo.get("nvidia", "spark-b") == "shared-pw-1"  # tried on all
    assert sudo.reject("spark-b", "shared-pw-1")
    assert sudo.get("nvidia", "spark-b") == "b-only-pw-2"
    assert sudo.get("nvidia", "spark-a") == "shared-pw-1"
    assert len(prompts) == 2 and "on the nodes" in prompts[0] and "on spark-b" in prompts[1]
    assert all("pw" not in p for p in prompts)


def test_password_files_are_per_node_and_must_be_private(tmp_path: Path) -> None:
    from orchestrator.errors import InputError

    a, b = tmp_path / "a.pw", tmp_path / "b.pw"
    a.write_text("pw-of-a\n")
    b.write_text("pw-of-b\n")
    a.chmod(0o600)
    b.chmod(0o640)
    with pytest.raises(InputError, match=r"b.pw is readable by group or others \(mode 0640\)"):
        SudoPassword(prompt=False, files={"spark-a": a, "spark-b": b})
    b.chmod(0o400)
    sudo = SudoPassword(prompt=False, files={"spark-a": a, "spark-b": b})
    assert sudo.get("nvidia", "spark-a") == "pw-of-a" and sudo.get("nvidia", "spark-b") == "pw-of-b"
    assert not sudo.reject("spark-a", "pw-of-a"), "a wrong file is not asked again"
