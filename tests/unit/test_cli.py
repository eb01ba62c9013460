"""Every cli module through click's CliRunner, with the run/session layer faked underneath:
bad input exits 2 with a message, --json prints one object, exit codes follow the report."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import SERVERS_CMD, servers_listing

from orchestrator.cli import cli
from orchestrator.core.runner import RunRequest
from orchestrator.netcheck.checks import CheckResult

INVENTORY = """\
cluster: {name: two-sparks, ssh_key: /k}
nodes:
  - {name: spark-a, host: a}
  - {name: spark-b, host: b}
"""


@pytest.fixture
def inv(tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("SPARKCTL_INVENTORY", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "two.yml"
    path.write_text(INVENTORY)
    return str(path)


@pytest.fixture
def executed(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Replaces core.runner.execute: records the request, returns `code` (0 unless set)."""
    seen: dict[str, Any] = {"code": 0}

    def execute(request: RunRequest) -> int:
        seen["request"] = request
        return int(seen["code"])
    monkeypatch.setattr("orchestrator.core.runner.execute", execute)
    return seen


def sparkctl(*args: str, input: str | None = None) -> Any:
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def test_help_lists_every_command_and_an_unknown_one_is_bad_input() -> None:
    result = sparkctl("--help")
    assert result.exit_code == 0
    for name in ("up", "plan", "netcheck", "launch", "chat", "tunnel", "status", "logs", "down",
                 "recipes", "lab"):
        assert f"  {name} " in result.output
    bad = sparkctl("explode")
    assert bad.exit_code == 2 and "No such command 'explode'" in bad.output


def test_a_missing_inventory_exits_2_with_a_message(inv: str) -> None:
    result = sparkctl("up", "--yes", "-i", "nope.yml")
    assert result.exit_code == 2
    assert "sparkctl: inventory file not found: nope.yml" in result.stderr


def test_a_bad_option_exits_2() -> None:
    result = sparkctl("launch", "x", "--timeout", "0")
    assert result.exit_code == 2 and "--timeout" in result.output


def test_up_runs_the_up_plan_and_remembers_the_inventory(inv: str, executed: dict[str, Any],
                                                        fake_cluster: Any, state_dir: Path) -> None:
    result = sparkctl("up", "-i", inv, "--yes", "--json", "--trust-new-hosts", "--break-lock", "--verify")
    assert result.exit_code == 0, result.output
    request = executed["request"]
    assert (request.command, request.yes, request.as_json, request.trust_new_hosts, request.break_lock,
            request.dry_run) == ("up", True, True, True, True, False)
    assert (request.options.verify, request.options.distribute_image) == (True, False)
    assert callable(request.options.progress_note)  # the registry check's notes, up front
    plan = request.build(fake_cluster().session())
    assert [p.name for p in plan.phases][:2] == ["preflight", "network"]
    assert (state_dir / "last-inventory").read_text().strip() == inv
    again = sparkctl("up", "-i", inv, "--yes", "--distribute-image")
    assert again.exit_code == 0 and executed["request"].options.distribute_image is True


def test_a_failed_up_exits_1_and_is_not_remembered(inv: str, executed: dict[str, Any],
                                                   state_dir: Path) -> None:
    executed["code"] = 1
    assert sparkctl("up", "-i", inv, "--yes").exit_code == 1
    assert not (state_dir / "last-inventory").exists()


def test_plan_is_a_dry_run_of_up(inv: str, executed: dict[str, Any], state_dir: Path) -> None:
    assert sparkctl("plan", "-i", inv).exit_code == 0
    request = executed["request"]
    assert request.command == "plan" and request.dry_run and not request.yes
    assert not (state_dir / "last-inventory").exists()


def test_down_tolerates_unreachable_nodes_and_says_what_it_kept(inv: str, executed: dict[str, Any],
                                                               fake_cluster: Any) -> None:
    assert sparkctl("down", "-i", inv, "--yes", "--network").exit_code == 0
    request = executed["request"]
    assert not request.require_all_nodes and request.lock_optional
    session = fake_cluster(unreachable={"spark-b": "cannot reach b:22"}).session("down")
    plan = request.build(session)
    assert [p.name for p in plan.phases]
    assert session.report.extra["not_reached"] == ["spark-b"]
    assert session.report.notes[0].startswith("Not reached: spark-b.")
    assert not any("fabric network config" in note for note in session.report.notes)
    sparkctl("down", "-i", inv, "--yes")
    kept = fake_cluster().session("down")
    executed["request"].build(kept)
    assert any("Kept: the fabric network config" in note for note in kept.report.notes)


def test_status_prints_json_and_exits_on_health(inv: str, monkeypatch: pytest.MonkeyPatch) -> None:
    answer = {"ok": False, "nodes": {}, "problems": ["spark-b: unreachable"], "servers": []}
    monkeypatch.setattr("orchestrator.status.assess.gather_status", lambda inventory: answer)
    result = sparkctl("status", "-i", inv, "--json")
    assert result.exit_code == 1 and json.loads(result.stdout) == answer
    answer["ok"] = True
    shown: list[Any] = []
    monkeypatch.setattr("orchestrator.status.render.render_status", shown.append)
    assert sparkctl("status", "-i", inv).exit_code == 0 and shown == [answer]


def test_logs_checks_tail_and_passes_the_options_on(inv: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []

    def run_logs(inventory: Any, nodes: list[str], follow: bool, since: str | None, tail: int | None,
                 server: str | None = None, as_json: bool = False) -> int:
        calls.append((nodes, follow, since, tail, as_json))
        return 0
    monkeypatch.setattr("orchestrator.status.logs.run_logs", run_logs)
    bad = sparkctl("logs", "-i", inv, "--tail", "ten")
    assert bad.exit_code == 2 and "--tail 'ten': give a number of lines or 'all'" in bad.stderr
    followed = sparkctl("logs", "-i", inv, "-n", "spark-b", "-f", "--since", "10m", "--tail", "all")
    assert followed.exit_code == 0
    assert sparkctl("logs", "-i", inv).exit_code == 0
    assert sparkctl("logs", "-i", inv, "--json").exit_code == 0
    assert calls == [(["spark-b"], True, "10m", None, False), ([], False, None, 100, False),
                     ([], False, None, 100, True)]


def test_netcheck_json_shape_and_exit_code(inv: str, fake_cluster: Any,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("orchestrator.remote.connect.connect_all", fake_cluster().connect_all)
    results = [CheckResult("ping", "spark-a", "pass", "ok."),
               CheckResult("mtu", "spark-b", "fail", "MTU 1500, want 9000.", fix="set it")]
    monkeypatch.setattr("orchestrator.cli.netcheck.run_netcheck", lambda session, deep: results)
    result = sparkctl("netcheck", "-i", inv, "--json", "--deep")
    payload = json.loads(result.stdout)
    assert result.exit_code == 1
    assert set(payload) == {"command", "ok", "seconds", "deep", "checks"}
    assert payload["ok"] is False and payload["deep"] is True and len(payload["checks"]) == 2
    table = sparkctl("netcheck", "-i", inv, "-v")
    assert table.exit_code == 1 and "MTU 1500, want 9000." in table.stdout


def test_launch_refuses_an_unknown_recipe(inv: str, executed: dict[str, Any]) -> None:
    result = sparkctl("launch", "no-such-recipe", "-i", inv, "--yes")
    assert result.exit_code == 2 and "no-such-recipe" in result.stderr and "request" not in executed


def test_launch_hands_a_plan_and_a_health_wait_to_the_runner(inv: str, executed: dict[str, Any],
                                                             tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("hf_secret_value\n")
    result = sparkctl("launch", "gpt-oss-120b", "-i", inv, "--yes", "--json", "--hf-token-file", str(token),
                      "--timeout", "60")
    assert result.exit_code == 0, result.output
    request = executed["request"]
    assert request.command == "launch" and request.after is not None
    token_value = request.options.hf_token
    assert str(token_value) == "***" and token_value.reveal() == "hf_secret_value"
    assert "memory:" in result.stderr
    assert request.options.distribute_image is False
    missing = sparkctl("launch", "gpt-oss-120b", "-i", inv, "--yes", "--hf-token-file", "/nonexistent")
    assert missing.exit_code == 2 and "HF token file not found: /nonexistent" in missing.stderr


def test_launch_distribute_image_reaches_the_run(inv: str, executed: dict[str, Any]) -> None:
    result = sparkctl("launch", "qwen3-8b", "-i", inv, "--yes", "--distribute-image")
    assert result.exit_code == 0, result.output
    assert executed["request"].options.distribute_image is True
    shown = sparkctl("launch", "--help")
    assert "--distribute-image" in shown.stdout and "over the fabric" in shown.stdout


def test_recipes_list_and_show(inv: str) -> None:
    listed = sparkctl("recipes")
    assert listed.exit_code == 0
    names = [line.split()[0] for line in listed.stdout.splitlines()]
    assert {"gpt-oss-120b", "qwen3-235b", "llama-3.3-70b"} <= set(names)
    shown = sparkctl("recipes", "show", "gpt-oss-120b", "--json")
    payload = json.loads(shown.stdout)
    assert {"recipe", "engine", "memory"} <= set(payload) and payload["engine"] == "trtllm"
    text = sparkctl("recipes", "show", "gpt-oss-120b")
    assert text.stdout.startswith("# ") and "# memory: " in text.stdout
    assert sparkctl("recipes", "show", "nope").exit_code == 2


# ------------------------------------------------------------------ chat, through a real forward


class Completions(BaseHTTPRequestHandler):
    seen: list[tuple[str | None, str]] = []  # (Authorization, model) of each request

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Completions.seen.append((self.headers.get("Authorization"), body["model"]))
        reply = {"choices": [{"message": {"content": f"echo: {body['messages'][0]['content']}"}}],
                 "usage": {"completion_tokens": 3}}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server_port() -> Iterator[int]:
    httpd = HTTPServer(("127.0.0.1", 0), Completions)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1]
    httpd.shutdown()


def head_with_server(fake_cluster: Any, monkeypatch: pytest.MonkeyPatch, port: int,
                     alive: bool = True) -> Any:
    c = fake_cluster()
    # orchestrator/node/servers.py's answer: the record, and whether its server lives
    c["spark-a"].on(SERVERS_CMD, answer=servers_listing(
        {"name": "gpt-oss-120b", "port": port, "model": "openai/gpt-oss-120b"}, alive=alive))

    @contextmanager
    def open_session(inventory: Any, command: str, **kwargs: Any) -> Iterator[Any]:
        yield c.session(command)
    monkeypatch.setattr("orchestrator.core.session.open_session", open_session)
    return c


def test_chat_goes_through_the_tunnel(inv: str, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch,
                                      server_port: int) -> None:
    head_with_server(fake_cluster, monkeypatch, server_port)
    result = sparkctl("chat", "bonjour", "-i", inv, "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["reply"] == "echo: bonjour" and payload["completion_tokens"] == 3
    plain = sparkctl("chat", "-i", inv, input="from stdin\n")
    assert plain.stdout == "echo: from stdin\n" and "3 tokens in" in plain.stderr


GATEWAY_PROBE = r"What the gateway has on this node"
GATEWAY_KEY = r"master key, for `sparkctl chat --gateway`"


def test_chat_through_the_gateway_sends_its_key_read_on_its_node(
        inv: str, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch, server_port: int) -> None:
    c = head_with_server(fake_cluster, monkeypatch, 1)
    state = {"node": "spark-b", "host": "0.0.0.0", "port": server_port, "key": True,
             "replicas": [{"server": "r-a", "model": "Qwen/Qwen3-8B", "node": "spark-a"}]}
    c["spark-a"].on(GATEWAY_PROBE, answer={"state": None})
    c["spark-b"].on(GATEWAY_PROBE, answer={"state": state})
    c["spark-b"].on(GATEWAY_KEY, 0, "sk-gateway-sentinel\n")
    Completions.seen.clear()
    result = sparkctl("chat", "bonjour", "-i", inv, "--gateway", "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["reply"] == "echo: bonjour" and payload["gateway"] is True
    assert payload["node"] == "spark-b" and payload["model"] == "Qwen/Qwen3-8B"
    assert Completions.seen == [("Bearer sk-gateway-sentinel", "Qwen/Qwen3-8B")]
    read = [call for call in c["spark-b"].calls if re.search(GATEWAY_KEY, call.command)]
    assert len(read) == 1 and read[0].sudo and "/etc/sparkctl/gateway/router.json" in read[0].command
    assert not any("sk-gateway-sentinel" in call.command for node in ("spark-a", "spark-b")
                   for call in c[node].calls)
    assert "sk-gateway-sentinel" not in result.output
    # the key is read only when the gateway has one
    c["spark-b"].rules.clear()
    c["spark-b"].on(GATEWAY_PROBE, answer={"state": {**state, "key": False}})
    Completions.seen.clear()
    assert sparkctl("chat", "hi", "-i", inv, "--gateway").exit_code == 0
    assert Completions.seen == [(None, "Qwen/Qwen3-8B")]


def test_chat_through_the_gateway_without_one_or_with_server_is_refused(
        inv: str, fake_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    c = head_with_server(fake_cluster, monkeypatch, 1)
    for node in ("spark-a", "spark-b"):
        c[node].on(GATEWAY_PROBE, answer={"state": None})
    result = sparkctl("chat", "hi", "-i", inv, "--gateway")
    assert result.exit_code == 1 and "no gateway runs: `sparkctl gateway up` first" in result.stderr
    both = sparkctl("chat", "hi", "-i", inv, "--gateway", "--server", "x")
    assert both.exit_code == 2 and "--gateway and --server exclude each other" in both.stderr


def test_chat_without_a_server_says_how_to_start_one(inv: str, fake_cluster: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    head_with_server(fake_cluster, monkeypatch, 1, alive=False)
    result = sparkctl("chat", "hi", "-i", inv)
    assert result.exit_code == 1 and "no model server is running" in result.stderr


def test_help_imports_neither_paramiko_nor_the_command_modules() -> None:
    """`sparkctl --help` stays under 0.15 s: click only (benchmarks/ measures the time)."""
    import subprocess
    import sys

    code = ("import sys; from orchestrator.cli import cli\n"
            "try:\n    cli(['--help'], prog_name='sparkctl')\nexcept SystemExit:\n    pass\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('paramiko', 'cryptography', 'pydantic')"
            " or m.startswith('orchestrator.remote') or m == 'orchestrator.cli.doctor']\n"
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
