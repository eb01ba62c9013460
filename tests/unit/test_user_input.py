"""Every file read from user input is bounded before it is read, and refused by kind when it is
not a regular file (issue #20: `sparkctl launch /dev/zero` read forever). Tokens are checked
up front and never echoed."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli import cli
from orchestrator.cli.launch import read_hf_token
from orchestrator.errors import InputError
from orchestrator.yamlio import MAX_FILE_BYTES, load_yaml_mapping, read_user_file


@pytest.fixture(autouse=True)
def deadline() -> Iterator[None]:
    """A reader that does not bound itself would hang on /dev/zero or a FIFO: fail instead."""
    def expired(*_: object) -> None:
        raise TimeoutError("the read did not stop: unbounded")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def special_files(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "fifo.yml"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock.yml"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    directory = tmp_path / "dir.yml"
    directory.mkdir()
    return {"a character device": Path("/dev/zero"), "a named pipe": fifo,
            "not a regular file": sock_path, "a directory": directory}


def test_special_files_are_refused_by_kind_naming_the_file(tmp_path: Path) -> None:
    for kind, path in special_files(tmp_path).items():
        with pytest.raises(InputError) as caught:
            load_yaml_mapping(path, "recipe")
        assert str(path) in caught.value.message and kind in caught.value.message, caught.value.message


def test_a_big_file_is_refused_after_reading_at_most_limit_plus_one(tmp_path: Path) -> None:
    path = tmp_path / "big.yml"
    path.write_bytes(b"#" * (MAX_FILE_BYTES + 10))
    with pytest.raises(InputError, match="larger than"):
        load_yaml_mapping(path, "inventory")
    assert read_user_file(path, "x", limit=MAX_FILE_BYTES + 10) == path.read_bytes()


@pytest.mark.parametrize("argv", [["launch", "/dev/zero", "--dry-run"], ["recipes", "show", "/dev/zero"],
                                  ["status", "--inventory", "/dev/zero"]])
def test_cli_refuses_dev_zero_with_exit_2(argv: list[str]) -> None:
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 2, result.output
    assert "/dev/zero" in result.output and "character device" in result.output


def test_token_file_that_is_a_device_or_huge_is_refused(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(InputError, match="character device"):
        read_hf_token("/dev/zero")
    big = tmp_path / "token"
    big.write_text("hf_" + "a" * 10000)
    with pytest.raises(InputError, match="larger than"):
        read_hf_token(str(big))


@pytest.mark.parametrize("value", ["hf_abc\nhf_def", "hf_abc def", "hf_abc\x07", "hf_äbc"])
def test_malformed_tokens_are_refused_without_echoing_them(value: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", value)
    with pytest.raises(InputError) as caught:
        read_hf_token(None)
    assert "HF_TOKEN" in caught.value.message and value not in caught.value.message
    monkeypatch.delenv("HF_TOKEN")
    path = tmp_path / "token"
    path.write_text(value + "\n")
    with pytest.raises(InputError) as caught:
        read_hf_token(str(path))
    assert str(path) in caught.value.message and value not in caught.value.message


def test_a_good_token_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    path = tmp_path / "token"
    path.write_text("hf_GoodToken123\n")
    assert read_hf_token(str(path)).reveal() == "hf_GoodToken123"


def remembered_inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    inventory = tmp_path / "remembered.yml"
    inventory.write_text((Path(__file__).parents[2] / "inventories" / "two-sparks.yml").read_text())
    state = tmp_path / "state"
    state.mkdir()
    (state / "last-inventory").write_text(str(inventory) + "\n")
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(state))
    monkeypatch.delenv("SPARKCTL_INVENTORY", raising=False)
    monkeypatch.chdir(tmp_path)
    return inventory


@pytest.mark.parametrize("argv", [["down", "--yes"], ["up", "--yes"], ["launch", "qwen3-235b", "--yes"]])
def test_yes_off_a_terminal_on_a_remembered_inventory_is_refused(
        argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inventory = remembered_inventory(tmp_path, monkeypatch)
    monkeypatch.setenv("HF_TOKEN", "hf_UnitTestToken42")
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 2, result.output
    assert "--inventory" in result.output and "SPARKCTL_INVENTORY" in result.output
    assert "two-sparks" in result.output and str(inventory) in result.output


def test_a_named_inventory_passes_and_an_implicit_one_is_shown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.core import runner

    inventory = remembered_inventory(tmp_path, monkeypatch)
    monkeypatch.setenv("SPARKCTL_INVENTORY", str(inventory))
    named, _ = runner.load_inventory_option(None)
    runner.check_named_cluster(runner.RunRequest("down", named, lambda s: None, yes=True))  # type: ignore[arg-type,return-value]
    monkeypatch.delenv("SPARKCTL_INVENTORY")
    runner.IMPLICIT.clear()
    implicit, _ = runner.load_inventory_option(None)
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    runner.check_named_cluster(runner.RunRequest("down", implicit, lambda s: None))  # type: ignore[arg-type,return-value]
    err = capsys.readouterr().err
    assert "acting on cluster two-sparks (head spark-a" in err and "remembered from the last `up`" in err


@pytest.mark.parametrize(("stdin", "message"), [(b"caf\xe9 au lait\n", "not UTF-8"),
                                                (b"", "empty"), (b"  \n\t\n", "empty")])
def test_chat_refuses_bad_stdin_before_connecting(stdin: bytes, message: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.cli import launch as launch_cli

    def never(*args: object) -> None:
        raise AssertionError("chat connected with a prompt it should have refused")

    monkeypatch.setattr(launch_cli, "_server_on_head", never)
    result = CliRunner().invoke(cli, ["chat"], input=stdin)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_chat_refuses_an_empty_prompt_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.cli import launch as launch_cli

    monkeypatch.setattr(launch_cli, "_server_on_head", lambda *a: (_ for _ in ()).throw(AssertionError))
    result = CliRunner().invoke(cli, ["chat", "   "])
    assert result.exit_code == 2 and "empty" in result.output
