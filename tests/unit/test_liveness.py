"""A server that was ready and stops answering is stalled, a rank that ended makes it dead (not
"starting"), and `launch` of the same recipe restarts either (engines/liveness.py, for every
engine: status, the TensorRT-LLM and vLLM guards, SGLang's placement, the node scripts)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from conftest import as_servers, cluster_of, make_context, make_inventory
from nodescript import run_node_script
from test_serve import ctx as serve_ctx
from test_serve import spec as serve_spec
from test_serve import status_facts
from test_status import INVENTORY, SERVER, node_facts

from orchestrator.core.step import Change, NodeContext, RunOptions, RunState, Unchanged
from orchestrator.engines import liveness, load_recipe, serverctl, verify
from orchestrator.engines.base import Ready
from orchestrator.engines.placed import Placement
from orchestrator.engines.sglang.serve import ServeSpec
from orchestrator.engines.trtllm import steps
from orchestrator.engines.vllm import serve as vllm_serve
from orchestrator.recipe import LaunchOptions
from orchestrator.remote.gathered import NodeFacts
from orchestrator.status import assess as status
from orchestrator.status.server import server_state

READY = {**SERVER, "ready_at": "2025-06-15T14:02:00+00:00"}


@pytest.mark.parametrize(("health", "ready", "dead", "second", "main", "state"), [
    (200, None, [], None, None, "healthy"),
    (200, "t", [], ("/health_generate", 200), True, "healthy"),
    (503, None, [], None, True, "starting"),
    (503, "t", [], None, True, "stalled"),
    ("Connection refused", "t", [], None, True, "stalled"),
    (0, "t", [], None, None, "stalled"),
    (200, "t", [], ("/health_generate", 503), True, "stalled"),
    (200, None, [], ("/health_generate", 503), True, "unhealthy"),
    (503, None, ["rank-1 on spark-b (pid 9)"], None, True, "dead"),
    (200, "t", ["rank-1 on spark-b (pid 9)"], None, True, "dead"),
    ("Connection refused", None, [], None, None, "down"),
    (503, "t", ["rank-1 on spark-b (pid 9)"], None, False, "down"),
])
def test_judge(health: Any, ready: str | None, dead: list[str], second: Any, main: bool | None,
               state: str) -> None:
    verdict = liveness.judge(health, ready, dead, second, 8355, main_alive=main)
    assert verdict.state == state
    assert verdict.restart == (state in ("stalled", "dead"))
    assert bool(verdict.problem) == (state != "healthy")


def test_ready_comes_from_the_record_or_the_engines_log() -> None:
    assert liveness.was_ready(READY) == "2025-06-15T14:02:00+00:00"
    assert liveness.was_ready(SERVER) is None
    assert liveness.was_ready(SERVER, ready_log=True) == "(its log says so)"
    assert liveness.was_ready(None) is None


def test_dead_ranks_name_their_node() -> None:
    pids = {"spark-b": {"rank-1.pid": {"pid": 9, "alive": False}, "mpirun.pid": {"alive": False}},
            "spark-a": {"rank-0.pid": {"pid": 3, "alive": True}}}
    assert liveness.dead_ranks(pids) == ["rank-1 on spark-b (pid 9)"]


# --- status -----------------------------------------------------------------------------------

def two(head: dict[str, Any], worker: dict[str, Any] | None = None) -> dict[str, Any]:
    return status.assess(INVENTORY, cluster_of({"spark-a": head, "spark-b": worker or node_facts("spark-b")}),
                         {})


def test_a_ready_server_answering_503_is_stalled_with_its_log_tail() -> None:
    result = two(node_facts("spark-a", server=READY, probe={"/health": 503},
                            pids={"mpirun.pid": {"pid": 7, "alive": True}}))
    server = result["server"]
    assert server["state"] == "stalled" and not result["ok"]
    assert server["ready_at"] == READY["ready_at"]
    assert "it was ready (2025-06-15T14:02:00+00:00) and now answers /health 503" in server["problem"]
    assert "`sparkctl launch` of the same recipe restarts it" in server["problem"]
    assert "Traceback: boom" in server["log_tail"]
    assert f"server qwen3 (trtllm): {server['problem']}" in result["nodes"]["spark-a"]["problems"]


def test_the_engines_ready_line_is_enough_to_call_it_stalled() -> None:
    head = node_facts("spark-a", server=SERVER, probe={"/health": 503})
    head["commands"]["processes"] = {"rc": 0, "out": json.dumps(
        {"pids": {"mpirun.pid": {"pid": 7, "alive": True}}, "ready_log": True})}
    assert two(head)["server"]["state"] == "stalled"
    head["commands"]["processes"]["out"] = json.dumps({"pids": {"mpirun.pid": {"pid": 7, "alive": True}}})
    assert two(head)["server"]["state"] == "starting"  # never ready yet: still loading


def test_a_dead_rank_is_dead_with_its_node_not_starting() -> None:
    result = two(node_facts("spark-a", server=SERVER, probe={"/health": 503},
                            pids={"mpirun.pid": {"pid": 7, "alive": True},
                                  "rank-0.pid": {"pid": 8, "alive": True}}),
                 node_facts("spark-b", pids={"rank-1.pid": {"pid": 9, "alive": False}}))
    assert result["server"]["state"] == "dead"
    assert "rank process ended: rank-1 on spark-b (pid 9)" in result["server"]["problem"]
    assert any("rank-1 (pid 9)" in p for p in result["nodes"]["spark-b"]["problems"])


def test_status_asks_the_head_whether_the_engine_logged_ready() -> None:
    head = status.status_facts(INVENTORY, INVENTORY.node("spark-a"))["commands"]["processes"]
    worker = status.status_facts(INVENTORY, INVENTORY.node("spark-b"))["commands"]["processes"]
    # only the head reads the engine's log for its ready line (the server runs there)
    assert '"ready_log": true' in head and '"ready_log": false' in worker
    assert "rank-0.log" in status.status_facts(INVENTORY, INVENTORY.node("spark-a"))["commands"]["server_log"]


def typed(server: dict[str, Any]) -> Any:
    """A listed server as status reads it (orchestrator/records.py)."""
    return as_servers([{"name": "s", "port": 1, **server}])[0]


@pytest.mark.parametrize(("server", "state"), [
    ({"alive": True, "health": 200}, "healthy"),
    ({"alive": True, "health": 503}, "loading"),
    ({"alive": True, "health": 503, "ready_at": "t"}, "stalled"),
    ({"alive": True, "health": 503, "ready_log": True}, "stalled"),
    ({"alive": True, "health": 0}, "not answering"),
    ({"alive": False}, "dead"),
    ({"alive": False, "migrated_from": "/var/lib/sparkctl/run/server.json"}, "dead"),
])
def test_the_servers_listing(server: dict[str, Any], state: str) -> None:
    assert server_state(typed(server)) == state


# --- launch: TensorRT-LLM, vLLM, SGLang ----------------------------------------------------------

def test_trtllm_restarts_a_stalled_server_of_the_same_recipe() -> None:
    launch = serve_spec()
    stalled = status_facts({"config_hash": launch.digest, "recipe": "qwen3-235b",
                            "ready_at": "2025-06-15T14:02:00+00:00"}, True, 503)
    facts = {"spark-a": stalled, "spark-b": {"commands": {"serve": {"rc": 0, "out": "{}"}}}}
    assert launch.decision(serve_ctx("spark-a", facts)) == "restart"
    start = steps.StartServer(launch).check(serve_ctx("spark-a", facts))
    assert isinstance(start, Change)
    assert start.summary.startswith("restart (stalled: ready at 2025-06-15T14:02:00+00:00, /health now 503)")
    stop = steps.StopPrevious(launch).check(serve_ctx("spark-a", facts))
    assert isinstance(stop, Change) and ": restart, stalled: ready at 2025" in stop.summary
    # never ready: still loading, kept
    facts["spark-a"] = status_facts({"config_hash": launch.digest}, True, 503)
    assert launch.decision(serve_ctx("spark-a", facts)) == "loading"


def test_trtllm_names_the_dead_rank_when_it_restarts() -> None:
    launch = serve_spec()
    facts = {"spark-a": status_facts({"config_hash": launch.digest}, True, 200),
             "spark-b": {"commands": {"serve": {"rc": 0, "out": json.dumps(
                 {"pids": {"rank-1.pid": {"alive": False, "pid": 9}}})}}}}
    assert launch.restart_reason(serve_ctx("spark-a", facts)) == (
        "dead: rank ended (rank-1 on spark-b (pid 9))")


def test_vllm_restarts_a_stalled_server_of_the_same_name() -> None:
    from orchestrator.engines.vllm import check

    inv = make_inventory()
    spec = vllm_serve.ServeSpec(load_recipe("gpt-oss-120b-vllm"), inv, LaunchOptions())
    record = {**spec.record(), "alive": True, "health": 503}
    loading = check.Placement(spec).check(make_context(inv, "spark-a", sglang_facts(record)))
    assert isinstance(loading, Unchanged) and "already runs" in loading.reason
    stalled = check.Placement(spec).check(make_context(inv, "spark-a", sglang_facts(
        {**record, "ready_at": "t"})))
    assert isinstance(stalled, Change)
    assert stalled.summary == f"restart {spec.name}: stalled: ready at t, /health now 503"
    logged = check.Placement(spec).check(make_context(inv, "spark-a", sglang_facts(
        {**record, "ready_log": True})))
    assert isinstance(logged, Change) and logged.payload.name == spec.name


def sglang_facts(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {"spark-a": {"commands": {"servers": {"rc": 0, "out": json.dumps({"servers": [record]})}}},
            "spark-b": {"commands": {"servers": {"rc": 0, "out": json.dumps({"servers": []})}}}}


def test_sglang_restarts_a_stalled_server_of_the_same_name() -> None:
    inv = make_inventory()
    spec = ServeSpec(load_recipe("qwen3-8b"), inv, LaunchOptions())
    record = {"name": spec.name, "engine": "sglang", "model": spec.recipe.model,
              "nodes": spec.nodes, "port": spec.recipe.port, "memory_gb": 20.0,
              "config_hash": spec.digest, "alive": True, "health": 503}
    loading = Placement(spec).check(make_context(inv, "spark-a", sglang_facts(record)))
    assert isinstance(loading, Unchanged) and "already runs" in loading.reason
    stalled = Placement(spec).check(make_context(inv, "spark-a", sglang_facts(
        {**record, "ready_at": "t"})))
    assert isinstance(stalled, Change) and stalled.summary.startswith(f"restart {spec.name}: stalled")
    assert stalled.payload.name == spec.name
    assert "probe" in spec_facts_command(spec, inv)


def spec_facts_command(spec: ServeSpec, inv: Any) -> str:
    from orchestrator.engines.placed import check_phase

    return str(check_phase(spec).facts(inv, inv.node("spark-a"))["commands"]["servers"])


# --- recording ready ---------------------------------------------------------------------------

def test_wait_ready_records_ready_and_says_when_it_could_not() -> None:
    marked: list[Any] = []
    step = verify.WaitReady(lambda transports, timeout, note: Ready(1.0, ["m"]), 60, "x",
                            mark=lambda transports: marked.append(transports) or None)
    inv = make_inventory()
    context = NodeContext(inventory=inv, node=inv.node("spark-a"), facts=NodeFacts("spark-a"),
                          cluster_facts={}, transport=None, options=RunOptions(), shared=RunState(),
                          transports={})
    assert step.apply(context, Change("wait")) == "answering: m (1.0s)" and marked == [{}]
    step.mark = lambda transports: "could not record ready_at in /x: denied"
    assert step.apply(context, Change("wait")).endswith("; could not record ready_at in /x: denied")


def test_mark_ready_adds_ready_at_once_and_keeps_the_mode(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / "server.json"
    record.write_text(json.dumps({"recipe": "r"}))
    record.chmod(0o644)
    ran = run_node_script("probe.py", ["--mark", str(record), "T1"], monkeypatch)
    assert ran.json == {"ready_at": "T1"}
    assert json.loads(record.read_text()) == {"recipe": "r", "ready_at": "T1"}
    assert record.stat().st_mode & 0o777 == 0o644
    assert run_node_script("probe.py", ["--mark", str(record), "T2"], monkeypatch).json == {"ready_at": "T1"}
    assert str(record) in liveness.mark_ready_cmd(str(record), "T3")


def test_marking_ready_imports_no_http_client(tmp_path: Path) -> None:
    """`probe.py --mark` runs on a node just filled by a server's load, within its memory
    guard's margin (the lab shows a node's small processes 64 times their size): it stays as
    small as a script that reads and writes one JSON file, without urllib, ssl or subprocess."""
    import subprocess
    import sys

    from orchestrator.node import script

    record = tmp_path / "server.json"
    record.write_text(json.dumps({"recipe": "r"}))
    probe = tmp_path / "probe.py"
    probe.write_text(script("probe.py"))
    check = ("import runpy, sys; sys.argv = ['probe.py', '--mark', sys.argv[1], 'T1']; "
             f"runpy.run_path({str(probe)!r}, run_name='__main__'); "
             "print(sorted(m for m in ('urllib.request', 'ssl', 'subprocess', 'http.client') "
             "if m in sys.modules))")
    ran = subprocess.run([sys.executable, "-S", "-c", check, str(record)], capture_output=True,
                         text=True, check=True)
    assert ran.stdout.splitlines() == ['{"ready_at": "T1"}', "[]"], ran.stdout + ran.stderr


def test_each_engine_names_its_ready_line_and_status_passes_them_to_the_node() -> None:
    from orchestrator.engines import ready_lines

    lines = ready_lines()
    assert lines == {"trtllm": "Application startup complete.",
                     "vllm": "Application startup complete.",
                     "sglang": "The server is fired up and ready to roll!",
                     "llamacpp": "llama_server: model loaded"}
    def payload(command: str) -> dict[str, Any]:
        return dict(json.loads(shlex.split(command)[-1]))

    assert payload(serverctl.node_cmd("c", action="status"))["ready_lines"] == lines
    assert "ready_lines" not in payload(serverctl.node_cmd("c", action="stop"))


def test_serverctl_reads_the_ready_line_of_the_records_engine(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.engines import DEFAULT_ENGINE, ready_lines

    def ready(run: Path) -> Any:
        ran = run_node_script("serverctl.py", [json.dumps(
            {"action": "status", "run": str(run), "ready_log": True,
             "ready_lines": ready_lines(), "default_engine": DEFAULT_ENGINE})], monkeypatch)
        return ran.json.get("ready_log")

    tmp_path.joinpath("rank-0.log").write_text("loading\n")
    assert ready(tmp_path) is False
    tmp_path.joinpath("rank-0.log").write_text("loading\nINFO:     Application startup complete.\n")
    assert ready(tmp_path) is True  # no record: TensorRT-LLM's (the default engine)
    tmp_path.joinpath("server.json").write_text(json.dumps({"engine": "sglang"}))
    assert ready(tmp_path) is False  # uvicorn's line is not SGLang's: still warming up
    tmp_path.joinpath("server.json").write_text(json.dumps({"engine": "vllm"}))
    assert ready(tmp_path) is True


def test_servers_script_reads_the_ready_line_of_a_record_that_does_not_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(an earlier sparkctl's record, migrated first: its log moves along)"""
    tmp_path.joinpath("server.json").write_text(json.dumps({"recipe": "r", "port": 1}))
    tmp_path.joinpath("server.log").write_text("INFO:     Application startup complete.\n")
    from orchestrator.engines import DEFAULT_ENGINE, ready_lines

    migrate = {"container": "c", "engine": DEFAULT_ENGINE, "ours": ["mpirun"], "nodes": ["spark-a"]}
    args = {"run": str(tmp_path), "probe": True, "migrate": migrate, "ready_lines": ready_lines()}
    ran = run_node_script("servers.py", [json.dumps(args)], monkeypatch, replace={
        "def running(container):": "def running(container):\n    return True\n\ndef _unused(container):",
        "def health(record):": "def health(record):\n    return 503\n\ndef _unused2(record):",
        "main = ((procs or {})": "main = {'alive': True} or ((procs or {})"})
    found = ran.json["servers"][0]
    assert found["health"] == 503 and found["ready_log"] is True
    assert server_state(typed(found)) == "stalled"


def test_servers_script_reads_an_sglang_containers_log_for_sglangs_own_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.engines import ready_lines

    log = tmp_path / "container.log"  # stands for `docker logs CONTAINER`
    record = tmp_path / "servers" / "qwen" / "server.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"engine": "sglang", "port": 1, "container": str(log),
                                  "nodes": ["spark-a"]}))
    args = {"run": str(tmp_path), "probe": True, "ready_lines": ready_lines()}

    def listed() -> Any:
        ran = run_node_script("servers.py", [json.dumps(args)], monkeypatch, replace={
            "def running(container):": "def running(container):\n    return True\n\ndef _unused(container):",
            "def health(record):": "def health(record):\n    return 503\n\ndef _unused2(record):",
            '["docker", "logs", record.container]': '["cat", record.container]'})
        return typed(ran.json["servers"][0])

    log.write_text("INFO:     Application startup complete.\n")  # uvicorn's, before warm-up
    assert listed().ready_log is False and server_state(listed()) != "stalled"
    log.write_text("INFO:     Application startup complete.\nThe server is fired up and ready to roll!\n")
    assert listed().ready_log is True and server_state(listed()) == "stalled"


@pytest.mark.parametrize(("keyless", "words"), [(401, "with API key"), (200, "NOT enforced")])
def test_servers_script_asks_a_keyed_server_without_its_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keyless: int, words: str) -> None:
    # issue 41: a `#` key made llama-server serve with no key while status said "with API key"
    import http.server
    import threading

    from orchestrator.status.render import servers_line

    class Server(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # /health open; /v1/models as the case says, never a key
            code = 200 if self.path == "/health" or "Authorization" in self.headers else keyless
            self.send_response(code)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        record = tmp_path / "servers" / "k" / "server.json"
        record.parent.mkdir(parents=True)
        record.write_text(json.dumps({"engine": "llamacpp", "name": "k", "container": "c",
                                      "port": httpd.server_address[1], "host": "127.0.0.1",
                                      "api_key_file": str(tmp_path / "key")}))
        args = {"run": str(tmp_path), "probe": True, "ready_lines": {}}
        ran = run_node_script("servers.py", [json.dumps(args)], monkeypatch, replace={
            "def running(container):": "def running(container):\n    return True\n\ndef _unused(container):"})
        found = ran.json["servers"][0]
    finally:
        httpd.shutdown()
    assert found["health"] == 200 and found["keyless"] == keyless
    assert words in servers_line("servers", [{**found, "state": "healthy"}])
