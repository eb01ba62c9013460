"""Shell completion of recipe and server names through click's real completion protocol."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from orchestrator.cli import cli


def complete(words: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    parts = words.split(" ")
    monkeypatch.setenv("COMP_WORDS", words)
    monkeypatch.setenv("COMP_CWORD", str(len(parts) - 1))
    monkeypatch.setenv("_SPARKCTL_COMPLETE", "bash_complete")
    result = CliRunner().invoke(cli, [], prog_name="sparkctl")
    return result.output.splitlines()


def test_launch_completes_builtin_recipes_and_files(monkeypatch: pytest.MonkeyPatch) -> None:
    assert complete("sparkctl launch qwen3.6", monkeypatch) == [
        "plain,qwen3.6-27b", "plain,qwen3.6-27b-tp2"]
    assert complete("sparkctl launch recipes/", monkeypatch) == ["file,recipes/"]
    assert complete("sparkctl launch zzz", monkeypatch) == ["file,zzz"]


@pytest.mark.parametrize("command", ["chat", "tunnel", "bench", "logs", "down"])
def test_server_options_complete_names(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert complete(f"sparkctl {command} --server gpt-oss", monkeypatch) == [
        "plain,gpt-oss-120b", "plain,gpt-oss-120b-gguf", "plain,gpt-oss-120b-vllm"]
