"""Inputs a hostile first hour passed that must not pass (issue 27, item 8): host literals the C
resolver reads as octal or hex, recipe revisions that are paths, a `--server` nobody runs; and
the proof that a recipe's serve_args reach the engine as literal arguments, never a shell."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import SERVERS_CMD, TWO_SPARKS, FakeCluster, as_servers, make_inventory, servers_listing

from orchestrator.cli import cli
from orchestrator.engines import load_recipe, servers
from orchestrator.errors import InputError
from orchestrator.paths import RUN_DIR


def with_host(host: str, jump: str | None = None) -> dict[str, Any]:
    data = json.loads(json.dumps(TWO_SPARKS))
    data["nodes"][1]["host"] = host
    if jump:
        data["cluster"]["proxy_jump"] = jump
    return data


@pytest.mark.parametrize(("host", "dialled"), [
    ("10.213.8.011", "10.213.8.9"),  # the probe's: octal 011 = 9
    ("0x0a.1.2.3", "10.1.2.3"),
    ("10.0.0.01", "10.0.0.1"),
    ("192.168.1", "192.168.0.1"),  # short forms are filled in
])
def test_host_literals_the_resolver_misreads_are_refused(host: str, dialled: str) -> None:
    with pytest.raises(InputError) as err:
        make_inventory(with_host(host))
    message = str(err.value)
    assert f"nodes[1] (spark-b).host: {host!r} is not an IPv4 address as written" in message
    assert f"would be dialled as {dialled}" in message and "without leading zeros" in message
    assert "Value error" not in message


@pytest.mark.parametrize("jump", ["admin@010.0.0.1", "bastion,10.0.0.010:2222"])
def test_jump_host_literals_are_refused_too(jump: str) -> None:
    with pytest.raises(InputError, match=r"cluster\.proxy_jump: '0?10\.0\.0\.0?10?' is not an IPv4"):
        make_inventory(with_host("10.0.0.2", jump))


@pytest.mark.parametrize("host", ["10.213.8.11", "10.0.0.0", "spark-b", "spark-b.lan", "2001:db8::1",
                                  "0a.lan", "10.1.1.1a"])
def test_canonical_addresses_and_names_pass(host: str) -> None:
    assert make_inventory(with_host(host, "admin@[2001:db8::2]:22,jump.lan")).nodes[1].host == host


def recipe_file(tmp_path: Path, name: str, **changes: Any) -> Path:
    data = load_recipe(name).model_dump(mode="json", exclude_none=True)
    data.pop("source", None)
    data.update(changes)
    path = tmp_path / "r.yml"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("revision", ["../../etc", "main/../../x", "/abs", "..", ".hidden", "a\\b"])
def test_a_revision_that_is_a_path_is_refused(tmp_path: Path, revision: str) -> None:
    result = CliRunner().invoke(cli, ["recipes", "show", str(recipe_file(tmp_path, "qwen3-8b",
                                                                         revision=revision))])
    assert result.exit_code == 2
    assert f"revision: {revision!r} is not a revision: a branch, tag or commit" in result.stderr
    assert "never a path" in result.stderr


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/12", "0123456789abcdef" * 2 + "01234567"])
def test_branches_tags_commits_and_pr_refs_pass(tmp_path: Path, revision: str) -> None:
    path = recipe_file(tmp_path, "qwen3-8b", revision=revision)
    assert load_recipe(str(path)).revision == revision


# ------------------------------------------------------- serve_args: one literal argument
TRAP = "$(touch PWNED)`touch PWNED2`;touch PWNED3"
RECORDER = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["ARGV_LOG"], "a") as log:
    log.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
"""


@pytest.fixture
def recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH whose docker, mpirun, vllm, python3 and trtllm-llmapi-launch only record their
    argv (one JSON line each in ARGV_LOG); the work directory is where a shell would touch."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("docker", "vllm", "mpirun", "trtllm-llmapi-launch", "python3"):
        tool = bin_dir / name
        tool.write_text(RECORDER.replace("/usr/bin/env python3", os.path.realpath(
            subprocess.check_output(["sh", "-c", "command -v python3"], text=True).strip())))
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("ARGV_LOG", str(tmp_path / "argv.log"))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def calls(where: Path) -> list[list[str]]:
    return [json.loads(line) for line in (where / "argv.log").read_text().splitlines()]


def run_shell(command: str, where: Path) -> None:
    """A command as a node runs it (the SSH server hands it to a shell); RUN_DIR here."""
    subprocess.run(["bash", "-c", command.replace(RUN_DIR, str(where))], check=True)


def flag_of(name: str) -> str:
    """The flag as the engine spells it (TensorRT-LLM's take underscores)."""
    return "--served_model_name" if load_recipe(name).engine == "trtllm" else "--served-model-name"


def assert_literal(argv: list[str], where: Path, flag: str = "--served-model-name") -> None:
    assert argv[argv.index(flag) + 1] == TRAP  # one argument, as written
    assert not list(where.glob("PWNED*"))  # and no shell ever ran what it says


def serve_args_recipe(tmp_path: Path, name: str) -> Any:
    return load_recipe(str(recipe_file(tmp_path, name, serve_args=[flag_of(name), TRAP])))


@pytest.mark.parametrize("name", ["minimax-m2.7", "qwen3-235b"])
def test_serve_args_reach_vllm_and_trtllm_as_one_literal_argument(recorder: Path, name: str) -> None:
    """The start command (docker exec -d ... bash -c WRAPPER ...) through a real shell, then what
    docker would run in the container, through the wrapper's own bash: the engine's argv."""
    from importlib import import_module

    recipe = serve_args_recipe(recorder, name)
    serve = import_module(f"orchestrator.engines.{recipe.engine}.serve")
    argv = serve.serve_argv(recipe, "127.0.0.1")
    if recipe.engine == "vllm":  # vLLM's pid file and log live in the server's own directory
        run_shell(serve.start_cmd("ctr", serve.serve_dir(recipe.name), argv), recorder)
    else:  # TensorRT-LLM's: a named server's own directory under RUN_DIR
        (recorder / "servers" / recipe.name).mkdir(parents=True)
        run_shell(serve.start_cmd("ctr", argv, serve.server_dir(recipe.name)), recorder)
    (docker,) = calls(recorder)
    inner = docker[docker.index("ctr") + 1:]
    assert inner[:2] == ["bash", "-c"]
    subprocess.run([inner[0], inner[1], inner[2].replace(RUN_DIR, str(recorder)), *inner[3:]],
                   check=True)
    engine = calls(recorder)[-1]
    if engine[0] == "mpirun":  # mpirun execs its command (no shell): through the rank wrapper
        command = engine[engine.index("bash"):]
        subprocess.run([command[0], command[1], command[2].replace(RUN_DIR, str(recorder)),
                        *command[3:]], check=True)
        engine = calls(recorder)[-1]
    assert engine[0] in ("vllm", "trtllm-llmapi-launch")
    assert_literal(engine, recorder, flag_of(name))


def test_serve_args_reach_sglang_as_one_literal_argument(recorder: Path) -> None:
    """SGLang's container runs the server as its command (docker's exec form, no shell): the
    `docker run` in the container step's command, through a real shell, carries it intact."""
    from orchestrator.commands import join
    from orchestrator.engines.sglang.serve import launch_argv

    recipe = serve_args_recipe(recorder, "qwen3-8b")
    argv = launch_argv(recipe, "127.0.0.1")
    run_shell(join(["docker", "run", "-d", "--name", "x", recipe.image, *argv]), recorder)
    (docker,) = calls(recorder)
    assert docker[docker.index(recipe.image) + 1:] == argv
    assert_literal(docker, recorder)


# ------------------------------------------------------- --server that nobody runs: exit 2
RUNNING = [{"name": "qwen3-8b", "engine": "sglang", "alive": True, "port": 30000},
           {"name": "qwen3-8b-b", "engine": "sglang", "alive": True, "port": 30001}]


def test_chat_and_bench_server_nobody_runs_is_bad_input() -> None:
    with pytest.raises(InputError) as err:
        servers.pick(as_servers(RUNNING), "no-such")
    assert err.value.exit_code == 2
    assert "no server named 'no-such' runs (running: qwen3-8b, qwen3-8b-b)" in str(err.value)


def test_down_server_nobody_runs_exits_2_naming_the_known_ones(
        tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch, fake_cluster: Any) -> None:
    monkeypatch.delenv("SPARKCTL_INVENTORY", raising=False)
    inventory = tmp_path / "two.yml"
    inventory.write_text(json.dumps(TWO_SPARKS))
    cluster: FakeCluster = fake_cluster()
    cluster["spark-a"].on(SERVERS_CMD, answer=servers_listing(*RUNNING))
    seen: dict[str, Any] = {}

    def execute(request: Any) -> int:
        seen["plan"] = request.build(cluster.session("down"))
        return 0
    monkeypatch.setattr("orchestrator.core.runner.execute", execute)
    result = CliRunner().invoke(cli, ["down", "-i", str(inventory), "--server", "no-such", "--yes"])
    assert result.exit_code == 2, result.output
    assert "--server no-such: no such server; known: qwen3-8b, qwen3-8b-b" in result.stderr
    assert "plan" not in seen
    result = CliRunner().invoke(cli, ["down", "-i", str(inventory), "--server", "qwen3-8b", "--yes"])
    assert result.exit_code == 0 and [p.name for p in seen["plan"].phases] == ["stop-server"]
