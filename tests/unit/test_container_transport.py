"""Run inside a container (remote/container.py): the one place docker's argv for one container
is written. Commands are checked word by word (shlex), run through a recording transport, and
`put`/`read` for real against a fake `docker` that runs the words locally."""

from __future__ import annotations

import ast
import itertools
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

from orchestrator.remote.container import ContainerCommands, ContainerTransport
from orchestrator.remote.transport import Result

ROOT = Path(__file__).resolve().parents[2]


class Recorder:
    """A transport that records each call and answers OUT."""

    node = "spark1"

    def __init__(self, out: str = "", rc: int = 0) -> None:
        self.calls: list[dict[str, Any]] = []
        self.out, self.rc = out, rc

    def run(self, command: str, *, stdin: bytes | str | None = None, sudo: bool = False,
            timeout: float | None = None, display: str | None = None) -> Result:
        self.calls.append({"command": command, "stdin": stdin, "sudo": sudo, "timeout": timeout,
                           "display": display})
        return Result(self.node, command, self.rc, self.out, "", 0.0)


def test_exec_quotes_every_word_and_orders_the_flags() -> None:
    box = ContainerCommands("my box")
    words = shlex.split(box.exec_cmd(["sh", "-c", "echo 'a b' $HOME"], env={"B": "2", "A": "x y"},
                                     detach=True, interactive=True))
    assert words == ["docker", "exec", "-d", "-i", "-e", "A=x y", "-e", "B=2", "my box", "sh",
                     "-c", "echo 'a b' $HOME"]
    assert box.exec_argv([1, "x"]) == ["docker", "exec", "my box", "1", "x"]


def test_logs_inspect_and_lifecycle_commands() -> None:
    box = ContainerCommands("c1")
    assert box.logs_cmd() == "docker logs c1"
    assert shlex.split(box.logs_cmd(30, since=1700000000.4, follow=True)) == [
        "docker", "logs", "--since", "1700000000", "--tail", "30", "--follow", "c1"]
    assert shlex.split(box.running_cmd()) == ["docker", "inspect", "--type", "container", "-f",
                                              "{{.State.Running}}", "c1"]
    assert shlex.split(box.inspect_cmd()) == ["docker", "inspect", "--type", "container", "c1"]
    assert box.remove_cmd() == "docker rm -f c1" and box.start_cmd() == "docker start c1"
    assert box.stop_cmd(10) == "docker stop -t 10 c1"
    assert box.shown("python3 -c <probe>") == "docker exec c1 python3 -c <probe>"
    assert box.shown("vllm serve m", detach=True) == "docker exec -d c1 vllm serve m"


def test_run_hands_the_command_and_its_options_to_the_node_transport() -> None:
    node = Recorder(out="hello\n")
    inside = ContainerTransport(node, "c1")
    result = inside.run(["echo", "hello"], sudo=True, timeout=9, display="say hello")
    assert result.stdout == "hello\n"
    assert node.calls == [{"command": "docker exec c1 echo hello", "stdin": None, "sudo": True,
                           "timeout": 9, "display": "say hello"}]
    inside.run(["cat"], stdin="data")
    assert node.calls[-1]["command"] == "docker exec -i c1 cat" and node.calls[-1]["stdin"] == "data"


def test_logs_never_raise_and_read_raises_on_failure() -> None:
    node = Recorder(out="Error: No such container: c1\n", rc=0)
    assert ContainerTransport(node, "c1").logs(5, sudo=True) == "Error: No such container: c1\n"
    assert node.calls[0]["command"] == "docker logs --tail 5 c1 2>&1; true"
    assert node.calls[0]["display"] == "docker logs c1"
    failing = Recorder(rc=1)
    try:
        ContainerTransport(failing, "c1").read("/etc/x")
    except Exception as exc:
        assert "docker exec c1 cat /etc/x" in str(exc)
    else:
        raise AssertionError("a failed read must raise")


class LocalDocker:
    """A node whose `docker exec [-i] NAME ARGV` runs ARGV here (a fake docker on PATH)."""

    node = "local"

    def __init__(self, tmp_path: Path) -> None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        docker = bin_dir / "docker"
        docker.write_text('#!/bin/sh\n[ "$1" = exec ] || exit 9\nshift\n'
                          '[ "$1" = -i ] && shift\nshift\nexec "$@"\n')
        docker.chmod(0o755)
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def run(self, command: str, *, stdin: bytes | str | None = None, sudo: bool = False,
            timeout: float | None = None, display: str | None = None) -> Result:
        data = stdin.encode() if isinstance(stdin, str) else stdin
        done = subprocess.run(["sh", "-c", command], input=data, capture_output=True,
                              env=self.env, timeout=timeout or 30)
        return Result(self.node, command, done.returncode, done.stdout.decode(),
                      done.stderr.decode(), 0.0)


def test_put_writes_from_stdin_with_its_mode_and_read_reads_it_back(tmp_path: Path) -> None:
    inside = ContainerTransport(LocalDocker(tmp_path), "c1")
    target = tmp_path / "dir with space" / "key"
    target.parent.mkdir()
    inside.put(str(target), "sk-secret\n", mode=0o600)
    assert target.read_text() == "sk-secret\n" and target.stat().st_mode & 0o777 == 0o600
    assert inside.read(str(target)) == "sk-secret\n"


# ------------------------------------------------------------------ one place builds the argv
EXEC = re.compile(r"\bdocker\s+exec\b")


def docker_execs_in(path: Path) -> list[int]:
    """Lines of code (docstrings aside) that write `docker exec` or docker_cmd("exec"/"logs")."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(
                node) not in docstrings and EXEC.search(node.value):
            lines.add(node.lineno)
        elif isinstance(node, (ast.List, ast.Tuple)):
            words = [e.value for e in node.elts if isinstance(e, ast.Constant)]
            if any(a == "docker" and b in ("exec", "logs") for a, b in itertools.pairwise(words)):
                lines.add(node.lineno)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "docker_cmd" and (
                node.args and isinstance(node.args[0], ast.Constant)
                and node.args[0].value in ("exec", "logs")):
            lines.add(node.lineno)
    return sorted(lines)


def test_only_the_container_transport_writes_docker_exec() -> None:
    package = ROOT / "orchestrator"
    found = {p.relative_to(ROOT).as_posix(): lines for p in sorted(package.rglob("*.py"))
             if "node" not in p.relative_to(package).parts[:1]
             and p != package / "remote" / "container.py" and (lines := docker_execs_in(p))}
    assert not found, f"`docker exec`/`docker logs` built outside remote/container.py: {found}"


def test_the_docker_exec_finder_sees_each_way_of_writing_one(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text('"""docker exec in prose is fine."""\n'
                      'A = f"docker exec {c} ls"\n'
                      'B = ["docker", "exec", c, "ls"]\n'
                      'C = docker_cmd("logs", c)\n'
                      'D = docker_cmd("ps", "-aq")\n')
    assert docker_execs_in(sample) == [2, 3, 4]
