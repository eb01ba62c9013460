"""cli/__init__.py: plugin commands (installed or not), the error-to-exit-code wrapper and
`python -m orchestrator.cli`."""

from __future__ import annotations

import runpy
import sys
from typing import Any

import click
import pytest
from click.testing import CliRunner

from orchestrator import __version__, cli
from orchestrator.errors import EXIT_INTERRUPTED, InputError


def no_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("importlib.metadata.entry_points", lambda **kwargs: [])


def test_a_missing_plugin_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    no_plugins(monkeypatch)
    result = CliRunner().invoke(cli.cli, ["lab", "up", "--nodes", "2"])
    assert result.exit_code == 2
    assert result.stderr == ("sparkctl: `sparkctl lab` is not installed: the simulated lab is the "
                             "separate `sparklab` package: `make install` in a sparkctl checkout "
                             "installs it (or `pip install ./lab`)\n")
    helped = CliRunner().invoke(cli.cli, ["lab", "--help"])
    assert helped.exit_code == 0 and "package). Not installed here." in " ".join(helped.output.split())


def test_an_installed_plugin_is_loaded_from_its_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    @click.command()
    def fake_lab() -> None:
        click.echo("lab ran")

    class Entry:
        def load(self) -> click.Command:
            return fake_lab

    asked: list[dict[str, Any]] = []

    def entry_points(**kwargs: Any) -> list[Entry]:
        asked.append(kwargs)
        return [Entry()]
    monkeypatch.setattr("importlib.metadata.entry_points", entry_points)
    result = CliRunner().invoke(cli.cli, ["lab"])
    assert result.exit_code == 0 and result.output == "lab ran\n"
    assert asked == [{"group": "sparkctl.plugins", "name": "lab"}]


def test_help_lists_plugins_with_their_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    no_plugins(monkeypatch)
    result = CliRunner().invoke(cli.cli, ["--help"])
    assert "A simulated cluster of Sparks on this machine" in result.output
    assert cli.cli.get_command(click.Context(cli.cli), "no-such") is None


@pytest.mark.parametrize(("body", "code", "message"), [
    (lambda: 0, 0, ""),
    (lambda: 1, 1, ""),
    (lambda: (_ for _ in ()).throw(InputError("bad inventory")), 2, "sparkctl: bad inventory\n"),
    (lambda: (_ for _ in ()).throw(KeyboardInterrupt()), EXIT_INTERRUPTED, "sparkctl: interrupted\n"),
])
def test_run_command_turns_errors_into_exit_codes(body: Any, code: int, message: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.run_command(body)
    assert exited.value.code == code
    assert capsys.readouterr().err == message


def test_python_dash_m_runs_the_cli(monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["sparkctl", "--version"])
    monkeypatch.delitem(sys.modules, "orchestrator.cli.__main__", raising=False)
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("orchestrator.cli", run_name="__main__")
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"sparkctl, version {__version__}\n"
