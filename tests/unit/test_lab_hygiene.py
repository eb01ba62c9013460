"""The lab behaves like machines, not like children of the caller's shell (issue 41): a node
starts with a clean environment (no caller's HF_TOKEN in its /proc/1/environ), `lab exec`
ends a command that overruns with one line naming the node (no traceback, no argv), and a
node's host key is the same at every `lab up` of its lab id (a key pinned by `init
--trust-new-hosts` stays valid)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sparklab import cli, identity, node, node_fs
from sparklab.identity import LabIdentity


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(identity, "SPARKLAB_ROOT", tmp_path)
    return tmp_path


def test_a_node_starts_with_a_clean_environment(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_caller_secret")
    seen: dict[str, Any] = {}

    class Started:
        pid = 4242

    def popen(argv: list[str], **kwargs: Any) -> Started:
        seen.update(kwargs)
        return Started()

    monkeypatch.setattr(node.subprocess, "Popen", popen)
    monkeypatch.setattr(node, "record_pid", lambda path, pid: None)
    ident = LabIdentity(19)
    ident.node_dir("spark-a").mkdir(parents=True)
    node.start_node(ident, "spark-a")
    assert seen["env"] == node.NODE_ENV and "HF_TOKEN" not in seen["env"] and seen["cwd"] == "/"


def test_lab_exec_past_its_timeout_says_so_without_a_traceback_or_the_argv(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def overrun(argv: list[str], **kwargs: Any) -> Any:
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])

    monkeypatch.setattr(node, "node_pid", lambda ident, name: 1)
    monkeypatch.setattr(node.subprocess, "run", overrun)
    monkeypatch.setenv("SPARKLAB_ID", "19")
    result = CliRunner().invoke(cli.lab, ["exec", "--timeout", "2", "spark-a", "--", "sleep",
                                          "secret-argument"])
    assert result.exit_code == 1, result.output
    assert "did not finish within 2 s" in result.output and "spark-a" in result.output
    assert "secret-argument" not in result.output and "Traceback" not in result.output
    assert not isinstance(result.exception, subprocess.TimeoutExpired)


def test_a_node_keeps_its_host_key_from_one_lab_up_to_the_next(root: Path) -> None:
    ident = LabIdentity(19)
    first = node_fs.stable_host_key(ident, "spark-a", root / "up1" / "etc" / "ssh")
    again = node_fs.stable_host_key(ident, "spark-a", root / "up2" / "etc" / "ssh")
    other = node_fs.stable_host_key(ident, "spark-b", root / "up2b" / "etc" / "ssh")
    elsewhere = node_fs.stable_host_key(LabIdentity(27), "spark-a", root / "up3" / "etc" / "ssh")
    assert first == again and first.startswith("ssh-ed25519 ")
    assert len({first, other, elsewhere}) == 3
    private = root / "up2" / "etc" / "ssh" / "ssh_host_ed25519_key"
    assert private.stat().st_mode & 0o777 == 0o600
    assert not str(node_fs.host_key_store(ident, "spark-a")).startswith(str(ident.state_dir))
