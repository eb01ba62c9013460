"""vLLM's launch: the plan's shape, the steps judged from faked facts, the steps' commands
against FakeTransport, readiness (ready, exited, deadline, Ctrl-C) with the log tails it
collects, the Ray cluster wait, and the engine-neutral verify steps (engines/verify.py). The
server model (names, placement, ports, the migration): test_vllm_servers.py."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest
from conftest import TWO_SPARKS, FakeCluster, FakeTransport
from conftest import make_context as context
from conftest import make_inventory as inventory

from orchestrator.core.step import Change, RunOptions, RunState, Unchanged
from orchestrator.engines import capabilities, config_hash, load_recipe
from orchestrator.engines import readiness as shared
from orchestrator.engines.base import LaunchFailed, Ready
from orchestrator.engines.verify import SmokeTest, WaitReady
from orchestrator.engines.vllm import ENGINE, ray, ready, serve
from orchestrator.errors import EXIT_INTERRUPTED, SparkctlError
from orchestrator.paths import RUN_DIR
from orchestrator.recipe import LaunchOptions
from orchestrator.remote.fact_records import CommandResult

HEAD_IP, WORKER_IP = "192.168.200.12", "192.168.200.13"
CONTAINER = "sparkctl-vllm-minimax-m2.7"
SERVE_DIR = f"{RUN_DIR}/servers/minimax-m2.7/serve"


@pytest.fixture
def recipe() -> Any:
    return load_recipe("minimax-m2.7")


def with_ray(recipe: Any, **fields: Any) -> Any:
    return recipe.model_copy(update={"ray": recipe.ray.model_copy(update=fields)})


def spec(recipe: Any, **options: Any) -> serve.ServeSpec:
    return serve.ServeSpec(recipe, inventory(), LaunchOptions(**options))


def servers_facts(*records: dict[str, Any]) -> dict[str, Any]:
    """Every node's `servers` fact (node/servers.py's answer), the records on spark-a."""
    def answer(found: list[dict[str, Any]]) -> dict[str, Any]:
        return {"commands": {"servers": {"rc": 0, "out": json.dumps({"servers": found})}}}
    return {"spark-a": answer(list(records)), "spark-b": answer([])}


# ------------------------------------------------------------------ the plan
def test_launch_phases_judge_first_then_models_ray_and_serve_with_verify_steps(recipe: Any) -> None:
    inv = inventory()
    phases = ENGINE.launch_phases(recipe, inv, LaunchOptions(timeout=900))
    assert [p.name for p in phases] == ["server-check", "image-check", "models", "ray", "serve",
                                       "persist"]
    check, _, models, ray_phase, serve_phase, _ = phases

    assert [s.name for s in check.steps] == ["placement"]
    servers_cmd = check.facts(inv, inv.node("spark-a"))["commands"]["servers"]
    assert '"probe": true' in servers_cmd  # every node, probed: stalled or dead is restarted

    assert [n.name for n in models.nodes(inv)] == ["spark-a", "spark-b"]
    assert [type(s).__name__ for s in ray_phase.steps] == [
        "NodeGuard", "Image", "ImageShare", "ImageDigest", "RayInImage", "SameNcclDevices",
        "GuardRayPorts", "RayHead", "RayWorker", "RayCluster"]
    guard = ray_phase.steps[0]
    assert guard.containers == [CONTAINER] and guard.record_dir.endswith("/servers/minimax-m2.7")
    head_req = ray_phase.facts(inv, inv.node("spark-a"))
    worker_req = ray_phase.facts(inv, inv.node("spark-b"))
    assert head_req["commands"]["ray"] == ray.probe_cmd(CONTAINER) + " 2>/dev/null"
    assert head_req["commands"]["servers"] == servers_cmd  # the same command: one fact
    assert "ray" not in (worker_req.get("commands") or {}) and worker_req["links"] is True
    assert "vllm_image_record" in worker_req["commands"]  # what the image holds, per image ID
    assert head_req["containers"] == [CONTAINER]

    assert [s.name for s in serve_phase.steps] == ["server", "ready", "smoke-test"]
    assert [s.kind for s in serve_phase.steps][1:] == ["verify", "verify"]
    assert [n.name for n in serve_phase.nodes(inv)] == ["spark-a", "spark-b"]
    assert serve_phase.facts(inv, inv.node("spark-b")) == {}
    assert serve_phase.facts(inv, inv.node("spark-a"))["commands"]["servers"] == servers_cmd
    first = context(inv, "spark-a", {"spark-a": {}})
    assert ray_phase.steps[1].image_of(first) == recipe.image  # the recipe's image, not up's
    wait = serve_phase.steps[1]
    assert isinstance(wait, WaitReady) and wait.timeout == 900 and wait.what == "vLLM (minimax-m2.7)"


def test_the_verify_steps_of_the_plan_reach_the_first_node(
        recipe: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = inventory()
    placed = recipe.model_copy(update={"tensor_parallel_size": 1, "placement": ["spark-b"]})
    *_, serve_phase, _ = ENGINE.launch_phases(placed, inv, LaunchOptions(name="b"))
    wait, smoke = serve_phase.steps[1:]
    cluster = FakeCluster(inv)
    answer = {"pids": {"vllm.pid": {"alive": True}}, "health": 200, "models": [recipe.model]}
    cluster["spark-b"].on(r'"action": "status"', answer=answer)
    cluster["spark-b"].on(r"ready_at", stdout="")
    chat = {"code": 200, "seconds": 0.5, "body": json.dumps(
        {"choices": [{"message": {"content": " Paris is lovely."}}], "usage": {"completion_tokens": 4}})}
    cluster["spark-b"].on(r'"action": "chat"', answer=chat)

    ctx = cluster.context("spark-a")  # the verify steps run on the head, asking the first node
    assert wait.apply(ctx, Change("wait")).startswith(f"answering: {recipe.model} (")
    summary = smoke.apply(ctx, Change("ask"))
    assert summary.startswith("4 tokens in 0.50s") and "Paris is lovely." in summary
    (call,) = [c for c in cluster["spark-b"].calls if '"action": "chat"' in c.command]
    assert "docker exec sparkctl-vllm-b" in call.command and '"port": 8000' in call.command
    status = next(c for c in cluster["spark-b"].calls if '"action": "status"' in c.command)
    assert f'"run": "{RUN_DIR}/servers/b/serve"' in status.command
    assert not cluster["spark-a"].calls


def test_describe_preview_and_the_rest_of_the_engine(recipe: Any) -> None:
    assert capabilities.up_phases(ENGINE, inventory()) == []
    assert capabilities.warnings(ENGINE, recipe) == []
    (ray_title, ray_text), (serve_title, serve_text) = ENGINE.describe(recipe)
    assert f"{CONTAINER} on 2 node(s): the head first" in ray_title and recipe.image in ray_title
    assert ("--port 6379 --node-manager-port 21000 --object-manager-port 22000 "
            "--runtime-env-agent-port 23000 --dashboard-agent-grpc-port 24000 "
            "--dashboard-agent-listen-port 25000 --metrics-export-port 26000 "
            "--min-worker-port 10002 --max-worker-port 10051") in ray_text
    assert "port guard (iptables chain sparkctl-ray-<server>)" in ray_text
    assert "--object-store-memory 2000000000" in ray_text
    assert "vLLM 0.31.0" in serve_title and serve_text.startswith("vllm serve nvidia/MiniMax-M2.7-NVFP4")
    preview = ENGINE.config_preview(recipe)
    assert preview["serve_argv"] == serve.serve_argv(recipe, "127.0.0.1")
    assert preview["container"] == CONTAINER and preview["image"] == recipe.image
    assert ENGINE.estimate_memory(recipe).fits
    assert ENGINE.containers("q") == ["sparkctl-vllm-q"]
    assert ENGINE.containers("") == ["sparkctl-vllm"]  # the single-server layout's, for `down`


def test_serve_argv_names_revision_and_pipeline_only_when_set(recipe: Any) -> None:
    plain = serve.serve_argv(recipe, "0.0.0.0")
    assert "--revision" not in plain and "--pipeline-parallel-size" not in plain
    assert plain[plain.index("--host") + 1] == "0.0.0.0"
    assert plain[plain.index("--gpu-memory-utilization") + 1] == "0.85"
    other = recipe.model_copy(update={"revision": "v2", "tensor_parallel_size": 1,
                                      "pipeline_parallel_size": 2})
    argv = serve.serve_argv(other, "127.0.0.1")
    assert argv[argv.index("--revision") + 1] == "v2"
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    start = serve.start_cmd(CONTAINER, SERVE_DIR, argv)
    assert start.startswith("docker exec -d") and "HF_HUB_OFFLINE=1" in start
    assert f"{SERVE_DIR}/vllm.pid" in start and f"{SERVE_DIR}/server.log" in start


# ------------------------------------------------------------------ the start step from facts
def test_start_server_check_names_what_it_would_do(recipe: Any) -> None:
    inv = inventory()
    s = spec(recipe)
    same = {**s.record(), "alive": True, "health": None}
    noop = serve.StartServer(s).check(context(inv, "spark-a", servers_facts(same)))
    assert isinstance(noop, Unchanged) and "already serving minimax-m2.7" in noop.reason
    start = serve.StartServer(s).check(context(inv, "spark-a", servers_facts()))
    assert isinstance(start, Change)
    assert start.summary == ("start nvidia/MiniMax-M2.7-NVFP4 as minimax-m2.7 with vLLM over Ray on "
                             "spark-a, spark-b (tp 2, pp 1) at 127.0.0.1:8000")
    assert start.diff is not None and start.diff.startswith("vllm serve nvidia/MiniMax-M2.7-NVFP4")
    # another configuration recorded (the check phase stopped it): start
    other = {**same, "config_hash": "x"}
    assert isinstance(serve.StartServer(s).check(context(inv, "spark-a", servers_facts(other))), Change)
    # a dead one (its container ended, or vllm serve in it): start
    dead = {**same, "alive": False}
    assert isinstance(serve.StartServer(s).check(context(inv, "spark-a", servers_facts(dead))), Change)
    # not its first node: nothing to do there
    assert isinstance(serve.StartServer(s).check(context(inv, "spark-b", servers_facts())), Unchanged)


def test_start_server_starts_detached_and_records_the_server(recipe: Any) -> None:
    inv = inventory()
    s = spec(recipe, persist=True)
    head = FakeTransport("spark-a", [(0, "", ""), {"alive": True, "pid": 4321}, (0, "", "")])
    ctx = context(inv, "spark-a", servers_facts(), transports={"spark-a": head})
    planned = serve.StartServer(s).check(ctx)
    assert isinstance(planned, Change)
    assert planned.commands == (serve.start_cmd(CONTAINER, SERVE_DIR, s.argv),)
    assert serve.StartServer(s).apply(ctx, planned) == (
        f"vllm serve started (pid 4321 in {CONTAINER}), config {s.digest}; record "
        f"{RUN_DIR}/servers/minimax-m2.7/server.json")
    start, started, record_call = head.calls
    assert start.command == serve.start_cmd(CONTAINER, SERVE_DIR, s.argv)
    assert start.display == f"docker exec -d {CONTAINER} vllm serve nvidia/MiniMax-M2.7-NVFP4"
    payload = json.loads(shlex.split(started.command)[-1])
    assert payload["action"] == "started" and payload["main"] == "vllm.pid"
    assert payload["run"] == SERVE_DIR
    assert record_call.sudo and f"{RUN_DIR}/servers/minimax-m2.7/server.json" in record_call.command
    record = json.loads(shlex.split(record_call.command.split("printf '%s\\n' ", 1)[1])[0])
    assert record["engine"] == "vllm" and record["config_hash"] == s.digest == config_hash(
        recipe, s.argv, "minimax-m2.7")
    assert record["nodes"] == ["spark-a", "spark-b"] and record["ours"] == ["vllm"]
    assert (record["tp_size"], record["pp_size"], record["port"]) == (2, 1, 8000)
    assert record["container"] == CONTAINER and record["pid_file"] == f"{SERVE_DIR}/vllm.pid"
    assert record["listen_ports"] == [8000, 6379, 21000, 22000, 23000, 24000, 25000, 26000,
                                      *range(10002, 10052)] and record["persistent"] is True
    assert record["port_guard"] == "sparkctl-ray-minimax-m2.7"  # removed when it stops


def test_start_server_that_exits_at_once_shows_the_log_end(recipe: Any) -> None:
    log = "\n".join(f"line {i}" for i in range(30)) + "\nValueError: no GPU\n"
    head = FakeTransport("spark-a", [(0, "", ""), {"alive": False, "pid": 9, "log": log}])
    ctx = context(inventory(), "spark-a", servers_facts(), transports={"spark-a": head})
    with pytest.raises(SparkctlError) as err:
        step = serve.StartServer(spec(recipe))
        step.apply(ctx, step.check(ctx))  # type: ignore[arg-type]
    message = str(err.value)
    assert message.startswith(f"spark-a: vllm serve exited at once; {SERVE_DIR}/server.log ends with:")
    assert message.endswith("ValueError: no GPU") and "line 16" in message and "line 15" not in message

    failed = FakeTransport("spark-a", [(125, "", f"Error: No such container: {CONTAINER}")])
    ctx = context(inventory(), "spark-a", servers_facts(), transports={"spark-a": failed})
    with pytest.raises(SparkctlError, match=f"container {CONTAINER} is not running on spark-a"):
        step = serve.StartServer(spec(recipe))
        step.apply(ctx, step.check(ctx))  # type: ignore[arg-type]


# ------------------------------------------------------------------ readiness
class Clock:
    """Stands in for the wait loop's time (engines/readiness.py) / ray.time: sleeping advances it."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def wait(cluster: FakeCluster, recipe: Any, timeout: float, note: Any) -> Ready:
    return shared.wait_until_ready(cluster.transports, ready.target(spec(recipe)), ready.READINESS,
                                   timeout, note)


def head_cluster(statuses: list[Any]) -> FakeCluster:
    """The head answers serverctl's status with `statuses` in turn; logs and stop as below."""
    cluster = FakeCluster(inventory())
    head = cluster["spark-a"]
    for status in statuses:
        head.on(r'"action": "status"', answer=status, times=1)
    head.on(r"tail -n 30 .*server\.log", stdout="Loading safetensors\nCUDA out of memory\n")
    for name in ("spark-a", "spark-b"):
        cluster[name].on(r"docker logs --tail 8 sparkctl-vllm-minimax-m2.7",
                         stdout=f"raylet on {name}\n")
        cluster[name].on(r"label=sparkctl.server=minimax-m2.7", stdout="")
    return cluster


def test_wait_until_ready_polls_until_health_and_the_model(recipe: Any,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(shared, "time", clock)
    loading = {"pids": {"vllm.pid": {"alive": True}}, "health": None}
    up_wrong_model = {"pids": {"vllm.pid": {"alive": True}}, "health": 200, "models": ["x", None]}
    answering = {"pids": {"vllm.pid": {"alive": True}}, "health": 200, "models": [recipe.model]}
    cluster = head_cluster([loading, loading, up_wrong_model, answering])
    notes: list[str] = []

    result = wait(cluster, recipe, 600, notes.append)

    assert result == Ready(9.0, [recipe.model]) and clock.slept == [3.0, 3.0, 3.0]
    assert notes[0].endswith("minimax-m2.7 on spark-a: loading (/health no answer); deadline in 600s")
    assert "listing models (/v1/models)" in notes[1] and len(notes) == 3  # stages said once
    assert notes[-1] == "[   9.0s] ready: /health and /v1/models answer"
    status_call = cluster["spark-a"].calls[0]
    assert '"deep": true' in status_call.command and '"generate": false' in status_call.command
    assert f'"run": "{SERVE_DIR}"' in status_call.command


def test_a_server_that_exits_while_loading_fails_with_every_nodes_log(
        recipe: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared, "time", Clock())
    cluster = head_cluster([{"pids": {"vllm.pid": {"alive": False}}}])
    notes: list[str] = []
    with pytest.raises(LaunchFailed) as failed:
        wait(cluster, recipe, 600, notes.append)
    reason, details = failed.value.reason, failed.value.details
    assert reason == ("vllm serve of minimax-m2.7 exited on spark-a while loading (after 0s); "
                      "minimax-m2.7 stopped (log tails below)")
    assert f"--- spark-a: last lines of {SERVE_DIR}/server.log\nLoading safetensors\nCUDA out of memory" \
        in details
    assert f"--- spark-a: Ray ({CONTAINER})\nraylet on spark-a" in details
    assert f"--- spark-b: Ray ({CONTAINER})\nraylet on spark-b" in details
    assert notes == ["vllm serve of minimax-m2.7 exited on spark-a while loading (after 0s); "
                     "stopping minimax-m2.7"]
    for name in ("spark-a", "spark-b"):  # the server's containers and record, on each node
        (stop,) = [c for c in cluster[name].commands if "label=sparkctl.server=minimax-m2.7" in c]
        assert f"rm -rf -- {RUN_DIR}/servers/minimax-m2.7" in stop


def test_not_ready_by_the_deadline_stops_the_server_and_says_what_is_left(
        recipe: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared, "time", Clock())
    loading = {"pids": {"vllm.pid": {"alive": True}}, "health": 503}
    cluster = head_cluster([loading] * 5)
    cluster["spark-a"].rules = [r for r in cluster["spark-a"].rules if "sparkctl.server" not in
                                r.pattern.pattern]
    cluster["spark-a"].on(r"label=sparkctl.server", 1, "", "Error: docker is busy")
    del cluster.transports["spark-b"]  # unreachable: its Ray log is simply not there
    with pytest.raises(LaunchFailed) as failed:
        wait(cluster, recipe, 5, lambda line: None)
    assert failed.value.reason.startswith(
        "minimax-m2.7 was not ready within 5s (--timeout); last state: loading (/health 503); "
        "minimax-m2.7 stopped (could not stop it: ")
    assert "spark-b" not in failed.value.details


def test_a_stop_that_fails_is_reported_with_the_reason(recipe: Any) -> None:
    cluster = head_cluster([])
    head = cluster["spark-a"]
    head.rules = [r for r in head.rules if "sparkctl.server" not in r.pattern.pattern]
    head.on(r"label=sparkctl.server", 1, "", "Error: container is not running")
    cluster["spark-b"].on("docker logs", answer=SparkctlError("spark-b: connection lost"))
    cluster["spark-b"].rules.reverse()  # the failing rule first
    with pytest.raises(LaunchFailed) as failed:
        ready.fail_and_clean(cluster.transports, spec(recipe), lambda line: None, "why")
    assert failed.value.reason.startswith("why; minimax-m2.7 stopped (could not stop it: ")
    assert "container is not running" in failed.value.reason
    assert "(could not read its Ray log: spark-b: connection lost)" in failed.value.details


def test_ctrl_c_while_waiting_leaves_the_server_loading_and_exits_130(
        recipe: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared, "time", Clock())
    cluster = head_cluster([KeyboardInterrupt])
    with pytest.raises(SparkctlError) as stopped:
        wait(cluster, recipe, 600, lambda line: None)
    assert stopped.value.exit_code == EXIT_INTERRUPTED
    assert str(stopped.value).startswith("stopped waiting; minimax-m2.7 keeps loading on "
                                         "spark-a.")
    assert "`sparkctl down --server minimax-m2.7`" in str(stopped.value)
    assert not any("sparkctl.server" in c for c in cluster["spark-a"].commands)


# ------------------------------------------------------------------ engines/verify.py
def test_wait_ready_reports_the_models_and_passes_the_progress_note() -> None:
    seen: dict[str, Any] = {}

    def wait(transports: Any, timeout: float, note: Any) -> Ready:
        seen.update(transports=transports, timeout=timeout)
        note("loading")
        return Ready(12.34, ["org/a", "org/b"])

    inv = inventory()
    notes: list[str] = []
    transports = {"spark-a": FakeTransport("spark-a")}
    ctx = context(inv, "spark-a", {"spark-a": {}}, transports=transports,
                  options=RunOptions(command="launch", progress_note=notes.append))
    step = WaitReady(wait, 300, "vLLM")
    assert (step.name, step.kind, step.scope) == ("ready", "verify", "head")
    assert step.apply(ctx, Change("wait")) == "answering: org/a, org/b (12.3s)"
    assert seen == {"transports": transports, "timeout": 300} and notes == ["loading"]
    # without a progress note the lines go nowhere
    assert step.apply(context(inv, "spark-a", {"spark-a": {}}), Change("wait")).startswith("answering")
    hint = step.interrupt_hint(inv)
    assert hint is not None and hint.startswith("Stopped waiting; vLLM keeps loading on spark-a.")
    assert "sparkctl down" in hint


def test_wait_ready_failure_keeps_the_log_tails_for_the_notes_and_the_json() -> None:
    def wait(transports: Any, timeout: float, note: Any) -> Ready:
        raise LaunchFailed("the server exited", "--- spark-a: server.log\nboom")

    shared = RunState(notes=["earlier note"])
    ctx = context(inventory(), "spark-a", {"spark-a": {}}, shared=shared)
    with pytest.raises(SparkctlError) as err:
        WaitReady(wait, 10, "SGLang").apply(ctx, Change("wait"))
    assert str(err.value) == "the server exited"  # the reason alone; the tails go to the notes
    assert not isinstance(err.value, LaunchFailed)
    assert shared.notes == ["earlier note", "--- spark-a: server.log\nboom"]
    assert shared.report_extra == {"log_tails": "--- spark-a: server.log\nboom"}


def test_smoke_test_asks_the_head() -> None:
    head = FakeTransport("spark-a")
    asked: list[Any] = []
    step = SmokeTest(lambda transport: asked.append(transport) or "4 tokens")
    ctx = context(inventory(), "spark-a", {"spark-a": {}}, transports={"spark-a": head})
    assert (step.name, step.kind, step.scope) == ("smoke-test", "verify", "head")
    assert step.apply(ctx, Change("ask")) == "4 tokens" and asked == [head]


# ------------------------------------------------------------------ Ray
def test_ray_environment_is_the_fabric_and_the_store_is_capped(recipe: Any) -> None:
    inv = inventory()
    roce = ["rocep1s0f1", "roceP2p1s0f1"]
    custom = with_ray(recipe.model_copy(update={"env": {"VLLM_LOGGING_LEVEL": "DEBUG"}}),
                      object_store_gb=1.5, num_cpus=16, port=6400)
    server = spec(custom)
    worker = ray.ray_spec(server, inv.node("spark-b"), roce, "/hf", infiniband=True)
    env = worker.env
    assert env["VLLM_HOST_IP"] == WORKER_IP and env["GLOO_SOCKET_IFNAME"] == "enp1s0f1np1"
    # read by nothing vLLM runs: not set
    assert not {"MASTER_ADDR", "TP_SOCKET_IFNAME", "RAY_DISABLE_IMPORT_WARNING"} & set(env)
    assert env["RAY_memory_monitor_refresh_ms"] == "0" and env["VLLM_LOGGING_LEVEL"] == "DEBUG"
    assert not {"HF_TOKEN", "OMPI_MCA_btl_tcp_if_include"} & set(env)
    argv = worker.command
    assert argv[argv.index("--object-store-memory") + 1] == "1500000000"
    assert argv[argv.index("--num-cpus") + 1] == "16"
    assert argv[argv.index("--address") + 1] == f"{HEAD_IP}:6400"
    assert worker.flags[-2:] == ["--device", "/dev/infiniband:/dev/infiniband"]
    assert worker.labels["sparkctl.role"] == "ray-worker"
    assert "did not join the head at 192.168.200.12:6400" in worker.ready_what
    head = ray.ray_spec(server, inv.node("spark-a"), roce, "/hf", infiniband=False)
    assert "--device" not in head.flags and head.hashed == {}
    assert head.labels["sparkctl.role"] == "ray-head" and "--include-dashboard=false" in head.command
    assert ray.ray_spec(spec(recipe), inv.node("spark-a"), roce, "/hf", False).command.count(
        "--num-cpus") == 0


def test_fabric_link_check_tolerates_missing_facts_and_names_each_problem(recipe: Any) -> None:
    inv = inventory()

    def check(links: Any, node: str = "spark-a") -> None:
        ray.check_fabric_link(context(inv, node, {node: {"links": links}}), "spark-a")

    check(None)  # not gathered: ray start will tell
    check({"error": "no ip"})
    check({"enp1s0f1np1": {"up": True, "carrier": True, "addresses": [f"{HEAD_IP}/24"]}})
    with pytest.raises(SparkctlError, match=r"spark-a: the Ray head would use 192\.168\.200\.12 on "
                                            r"enp1s0f1np1, but enp1s0f1np1 does not exist"):
        check({})
    with pytest.raises(SparkctlError, match=r"lacks its address 192\.168\.200\.12/24"):
        check({"enp1s0f1np1": {"up": True, "carrier": True, "addresses": ["10.0.0.1/24"]}})
    with pytest.raises(SparkctlError, match=r"has no link \(\?: cable out"):
        check({"enp1s0f1np1": {"up": False, "addresses": [f"{HEAD_IP}/24"]}})
    # the interface Ray uses is found whatever the order of the node's addresses
    data = json.loads(json.dumps(TWO_SPARKS))
    data["nodes"][1]["addresses"] = dict(reversed(data["nodes"][1]["addresses"].items()))
    with pytest.raises(SparkctlError, match=r"spark-b: its Ray worker would use 192\.168\.200\.13 on "
                                            r"enp1s0f1np1, but enp1s0f1np1 does not exist"):
        ray.check_fabric_link(context(inventory(data), "spark-b", {"spark-b": {"links": {
            "enP2p1s0f1np1": {"up": True, "addresses": ["192.168.201.13/24"]}}}}), "spark-a")


def test_parse_probe(recipe: Any) -> None:
    assert ray.parse_probe(CommandResult(1, "", " ray not installed \n")) == {"error": "ray not installed"}
    assert ray.parse_probe(CommandResult(125, "No such container", "")) == {"error": "No such container"}
    assert ray.parse_probe(CommandResult(0, "warning\n", "")) == {"error": "the Ray probe printed no JSON"}
    assert ray.parse_probe(None) == {"error": "the Ray probe printed no JSON"}  # not gathered
    assert ray.parse_probe(CommandResult(0, '{"nodes": []}\nnoise', "")) == {"nodes": []}
    assert ray.parse_probe(CommandResult(0, '{"error": "ConnectionError: no head"}', "")) == {
        "error": "ConnectionError: no head"}


def ray_answer(*alive_ips: str) -> tuple[int, str, str]:
    nodes = [{"ip": ip, "alive": True} for ip in alive_ips]
    return (0, "Ray warning\n" + json.dumps({"nodes": nodes}), "")


def test_ray_cluster_waits_until_every_serving_node_is_alive(recipe: Any,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(ray, "time", clock)
    cluster = FakeCluster(inventory())
    cluster["spark-a"].answers = [(1, "", "ConnectionError: GCS not up"), ray_answer(HEAD_IP),
                                  ray_answer(HEAD_IP, WORKER_IP)]
    notes: list[str] = []
    ctx = cluster.context("spark-a", options=RunOptions(progress_note=notes.append))
    step = ray.RayCluster(spec(recipe))
    change = step.check(ctx)
    assert isinstance(change, Change) and change.summary == "wait until Ray reports 2 node(s) (deadline 120s)"
    assert step.apply(ctx, change) == f"Ray: 2 node(s) alive ({HEAD_IP}, {WORKER_IP})"
    assert clock.slept == [2, 2]
    assert notes == ["        [  0.0s] Ray: ConnectionError: GCS not up"]  # one line per 10 s
    for call in cluster["spark-a"].calls:
        assert call.sudo and call.command == ray.probe_cmd(CONTAINER)


def test_ray_cluster_names_the_missing_node_with_its_ray_log(recipe: Any,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(ray, "time", clock)
    cluster = FakeCluster(inventory())
    cluster["spark-a"].on("ray.init", answer=ray_answer(HEAD_IP))
    cluster["spark-b"].on(f"docker logs --tail 15 {CONTAINER}", stdout="raylet: cannot reach GCS\n")
    notes: list[str] = []
    ctx = cluster.context("spark-a", options=RunOptions(progress_note=notes.append))
    quick = with_ray(recipe, join_timeout=25)
    with pytest.raises(SparkctlError) as err:
        ray.RayCluster(spec(quick)).apply(ctx, Change("wait"))
    message = str(err.value)
    assert message.startswith("spark-a: Ray shows 1 of 2 node(s) after 25s; missing: spark-b "
                              f"({WORKER_IP}). Each worker must reach the head at {HEAD_IP}:6379")
    assert f"--- spark-b: {CONTAINER} (docker logs and raylet logs)\nraylet: cannot reach GCS" in message
    assert notes[0] == f"        [  0.0s] Ray: 1 alive, waiting for spark-b ({WORKER_IP})"
    assert len(notes) == 3  # at 0, 12 and 24 s: not every 2 s

    # the worker unreachable, and the probe failing: both said
    del cluster.transports["spark-b"]
    cluster["spark-a"].rules = []
    cluster["spark-a"].on("ray.init", 1, "", "ray: command not found")
    with pytest.raises(SparkctlError) as err:
        ray.RayCluster(spec(quick)).apply(cluster.context("spark-a"), Change("wait"))
    assert "(ray: command not found)" in str(err.value) and "(node unreachable)" in str(err.value)


def test_ray_log_tail_says_when_there_is_none(recipe: Any) -> None:
    quiet = FakeTransport("spark-b")
    assert ray.ray_log_tail(quiet, "sparkctl-vllm") == "(no Ray log)"
    (call,) = quiet.calls
    assert call.sudo and "docker logs --tail 15 sparkctl-vllm" in call.command
    assert "/tmp/ray/session_latest/logs/raylet.err" in call.command


def test_a_worker_is_replaced_when_the_head_it_joined_restarted(recipe: Any, fake_transport: Any) -> None:
    """The head's container restarted after the worker joined (status: `docker restart`, a
    crash): the worker must start again to join the new Ray cluster, saying so. A worker that
    started after the head (a reboot with --persist restarts both; it rejoined) is left alone.
    A head started in this very run hands its start time to the workers."""
    from orchestrator.phases.container import HASH_LABEL

    inv = inventory()
    name = CONTAINER
    server = spec(recipe)
    t0, t1, t2 = "2026-11-23T20:00:00.1Z", "2026-11-23T20:05:00.123456789Z", "2026-11-23T20:09:00Z"

    def facts(head_started: str, worker_started: str | None) -> dict[str, Any]:
        home = {"commands": {"home": {"rc": 0, "out": "/home/spark\n"}},
                "ibdev2netdev": {"devices": {"enp1s0f1np1": {"device": "rocep1s0f1"},
                                             "enP2p1s0f1np1": {"device": "roceP2p1s0f1"}}}}
        head = {**home, "containers": {name: {"State": {"Running": True, "StartedAt": head_started}}}}
        worker: dict[str, Any] = {**home, "containers": {name: None}}
        if worker_started is not None:
            wanted = ray.RayWorker(server).spec_for(context(inv, "spark-b", {"spark-b": home}))
            assert wanted is not None
            worker["containers"][name] = {
                "Config": {"Labels": {**wanted.labels, HASH_LABEL: wanted.digest()}},
                "State": {"Running": True, "StartedAt": worker_started}}
        return {"spark-a": head, "spark-b": worker}

    step = ray.RayWorker(server)
    first = step.check(context(inv, "spark-b", facts(t0, None)))
    assert isinstance(first, Change) and first.summary == f"run container {name}"
    assert isinstance(step.check(context(inv, "spark-b", facts(t0, t1))), Unchanged)  # joined after
    again = step.check(context(inv, "spark-b", facts(t1, t0)))
    assert isinstance(again, Change) and again.payload["remove_old"] is True
    assert again.summary == (f"replace container {name}: the Ray head restarted ({t1}) after this "
                             "worker joined it; join the new head")
    restarted_now = context(inv, "spark-b", facts(t0, t1), shared={ray.HEAD_STARTED: t2})
    assert f"restarted ({t2})" in step.check(restarted_now).summary  # type: ignore[union-attr]
    # the head step records its new start time for the workers
    head_ctx = context(inv, "spark-a", facts(t0, None), shared={},
                       transports={"spark-a": fake_transport("spark-a").on(
                           r"inspect --type container -f", 0, "2026-11-23T20:41:28.5Z\n", "")})
    head_step = ray.RayHead(server)
    head_step.apply(head_ctx, Change("run container", payload={"args": ["run"], "remove_old": False}))
    assert head_ctx.shared.engine[ray.HEAD_STARTED] == "2026-11-23T20:41:28.5Z"
