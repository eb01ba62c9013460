"""`launch --api-key-file`'s glue, per engine: the key reaches the node on stdin as a 0600 file,
each engine's container or start command names only the file (llama-server --api-key-file,
SGLang's --config written by the entry wrapper, vLLM's VLLM_API_KEY exported by the wrapper),
the record says where the node file is, never the key; the lab's engines refuse what the real
ones refuse (401) and leave open what they leave open."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import as_servers, make_context, make_inventory

from orchestrator.commands import Secret
from orchestrator.core.step import Change
from orchestrator.engines import apikey, get_engine, load_recipe
from orchestrator.phases.files import FileSpec
from orchestrator.recipe import LaunchOptions

SENTINEL = "sk-unit-sentinel-7f3a"
KEY = Secret(SENTINEL)
IMAGE = Path(__file__).resolve().parents[2] / "lab" / "sparklab" / "image"


def keyed(host: str = "10.0.0.5") -> LaunchOptions:
    return LaunchOptions(host=host, api_key=KEY, name="srv")


def test_every_engine_says_how_it_takes_a_key_and_what_it_leaves_open() -> None:
    ways = {name: get_engine(name).api_key for name in ("llamacpp", "sglang", "vllm")}
    for way in ways.values():
        assert way is not None and way.how
    assert ways["llamacpp"].is_open("/health") and not ways["llamacpp"].is_open("/v1/models")
    assert not ways["llamacpp"].is_open("/metrics")  # llama-server guards its metrics
    assert ways["sglang"].is_open("/health_generate") and ways["sglang"].is_open("/metrics")
    assert not ways["sglang"].is_open("/v1/chat/completions")
    assert not ways["sglang"].is_open("/get_model_info")
    assert ways["vllm"].is_open("/metrics") and ways["vllm"].is_open("/health")
    assert not ways["vllm"].is_open("/v1/models")


def test_the_key_digest_is_slow_salted_and_never_the_key() -> None:
    one, other = apikey.key_digest(KEY, "a"), apikey.key_digest(Secret("sk-other"), "a")
    assert one != other and one != apikey.key_digest(KEY, "b") and SENTINEL not in one


def test_the_key_file_step_writes_0600_on_stdin_and_never_shows_the_key() -> None:
    step = apikey.key_files_step("srv", ["spark-a"], KEY)
    inventory = make_inventory()
    facts: dict[str, dict[str, Any]] = {"spark-a": {"files": {}}, "spark-b": {"files": {}}}
    ctx = make_context(inventory, "spark-a", facts)
    outcome = step.check(ctx)
    assert isinstance(outcome, Change) and SENTINEL not in outcome.diff + outcome.summary
    (spec,) = outcome.payload
    assert spec == FileSpec(f"{apikey.node_key_file('srv')}", 0o600, SENTINEL + "\n", secret=True)
    other = make_context(inventory, "spark-b", facts)
    assert not isinstance(step.check(other), Change)  # not a serving node: nothing written
    assert apikey.key_facts("srv") == {"files": {apikey.node_key_file("srv"): False}}  # no content


def test_llama_server_reads_the_mounted_file_itself() -> None:
    from orchestrator.engines.llamacpp.serve import ServeSpec

    inventory = make_inventory()
    spec = ServeSpec(load_recipe("lab-tiny-llama"), inventory, keyed())
    args = spec.server_spec(inventory.node(spec.first), "/hf", []).run_args()
    text = " ".join(args)
    assert "--api-key-file /run/sparkctl/api_key" in text and "--host 10.0.0.5" in text
    assert f"{apikey.node_key_file('srv')}:/run/sparkctl/api_key:ro" in args
    assert SENTINEL not in text and "--api-key " not in text
    assert spec.record()["api_key_file"] == apikey.node_key_file("srv")
    assert SENTINEL not in json.dumps(spec.record())
    plain = ServeSpec(load_recipe("lab-tiny-llama"), inventory, LaunchOptions(name="srv"))
    assert "api_key_file" not in plain.record() and plain.digest != spec.digest


def test_sglang_gets_a_config_file_written_in_its_container(tmp_path: Path) -> None:
    from orchestrator.engines.sglang.serve import ServeSpec, key_config

    inventory = make_inventory()
    spec = ServeSpec(load_recipe("qwen3-8b"), inventory, keyed())
    container = spec.container_spec(inventory.node(spec.first), [], "/hf", False)
    args = container.run_args()
    assert SENTINEL not in " ".join(args) and "--api-key" not in args
    assert args[args.index("--entrypoint") + 1] == "/bin/sh"
    assert f"{apikey.node_key_file('srv')}:/run/sparkctl/api_key:ro" in args
    assert "--host" in container.command and container.command[2] == "sglang"
    assert spec.record()["api_key_file"] == apikey.node_key_file("srv")
    # the wrapper's YAML holds the key as a double-quoted string SGLang's yaml.safe_load reads
    import yaml

    script = container.command[1]
    key = tmp_path / "key"
    key.write_text('a"b\\c#d:e\n')
    out = tmp_path / "k.yaml"
    script = script.replace(apikey.CONTAINER_KEY, str(key)).replace(key_config("srv"), str(out))
    done = subprocess.run(["sh", "-c", script, "sglang", "echo"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == f"--config {out}", done.stderr
    assert yaml.safe_load(out.read_text()) == {"api-key": 'a"b\\c#d:e'}
    assert out.stat().st_mode & 0o777 == 0o600


def test_vllm_gets_its_variable_from_the_wrapper_never_its_argv() -> None:
    from orchestrator.engines.vllm.serve import ServeSpec, start_cmd

    inventory = make_inventory()
    spec = ServeSpec(load_recipe("gpt-oss-120b-vllm"), inventory,
                     LaunchOptions(host="10.0.0.5", name="srv", api_key=KEY))
    command = start_cmd("c", spec.directory, spec.argv, spec.key_file)
    assert f'VLLM_API_KEY="$(cat {apikey.node_key_file("srv")})"; export VLLM_API_KEY' in command
    assert SENTINEL not in command and "--api-key" not in command
    assert spec.record()["api_key_file"] == apikey.node_key_file("srv")


def _ask(port: int, path: str, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{port}{path}", headers=headers), timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.mark.parametrize(("engine", "open_paths", "guarded"), [
    ("sglang", ["/health", "/health_generate"], ["/v1/models", "/get_model_info"]),
    ("vllm", ["/health", "/version"], ["/v1/models"])])
def test_the_lab_engines_refuse_without_the_key_as_the_real_ones(
        engine: str, open_paths: list[str], guarded: list[str]) -> None:
    sys.path.insert(0, str(IMAGE))
    from sparklab_engine import sglang_http, vllm_http

    server: Any
    if engine == "vllm":
        server = vllm_http.start_vllm_http("org/m", "m", None, "127.0.0.1", 0, SENTINEL)
    else:
        server = sglang_http.start_sglang_http({"model": "m", "tp": 1, "host": "127.0.0.1",
                                                "port": 0, "api_key": SENTINEL}, {})
    port = server.server_address[1]
    try:
        for path in guarded:
            assert _ask(port, path, None) == 401 and _ask(port, path, "sk-wrong") == 401
            assert _ask(port, path, SENTINEL) == 200
        for path in open_paths:
            assert _ask(port, path, None) == 200
    finally:
        server.shutdown_quietly()


def test_the_lab_sglang_reads_api_key_from_its_config_file(tmp_path: Path) -> None:
    sys.path.insert(0, str(IMAGE))
    from sparklab_engine import sglang_cli
    from sparklab_engine.common import UsageError, option_table

    config = tmp_path / "k.yaml"
    config.write_text('api-key: "a\\"b"\n')
    opts = sglang_cli.parse(["--model-path", "m", "--config", str(config)], option_table("sglang"))
    assert opts["api_key"] == 'a"b'
    with pytest.raises(UsageError, match="YAML"):
        sglang_cli.parse(["--model-path", "m", "--config", str(tmp_path / "k.txt")],
                         option_table("sglang"))


def test_trtllm_serve_binds_loopback_behind_the_relay_that_holds_host_and_port() -> None:
    from orchestrator.engines.trtllm import keyrelay
    from orchestrator.engines.trtllm.serve import LaunchSpec, start_cmd

    inventory = make_inventory()
    recipe = load_recipe("qwen3-235b")
    plain = LaunchSpec(recipe, inventory, LaunchOptions(host="10.0.0.5", name="srv"))
    spec = LaunchSpec(recipe, inventory, LaunchOptions(host="10.0.0.5", name="srv", api_key=KEY))
    words = " ".join(spec.argv)
    inner = keyrelay.inner_port(recipe.port)
    assert f"--port {inner} --host 127.0.0.1" in words and "10.0.0.5" not in words
    assert f"--port {recipe.port} --host 10.0.0.5" in " ".join(plain.argv) and not plain.relay
    command = start_cmd("c", spec.argv, spec.run_dir, spec.relay)
    assert SENTINEL not in command and apikey.node_key_file("srv") in command
    # the relay's pid file next to mpirun's, in the server's directory: stopped with it
    assert f"{spec.run_dir}/keyrelay.pid" in command
    assert '"listen": "10.0.0.5", "open": ["/health"]' in command and "setsid python3" in command
    assert spec.record()["api_key_file"] == apikey.node_key_file("srv") and spec.digest != plain.digest
    assert keyrelay.inner_port(60000) == 50000 and get_engine("trtllm").api_key.relay


def test_the_key_relay_checks_each_request_and_passes_the_rest_untouched(tmp_path: Path) -> None:
    import http.client
    import http.server
    import socket
    import threading
    import time

    from orchestrator.node import script

    class Engine(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.answer(b"")

        def do_POST(self) -> None:
            self.answer(self.rfile.read(int(self.headers["Content-Length"])))

        def answer(self, body: bytes) -> None:
            data = json.dumps({"path": self.path, "body": body.decode()}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None: ...

    engine = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    key = tmp_path / "key"
    key.write_text(SENTINEL + "\n")
    args = {"listen": "127.0.0.1", "port": port, "target": engine.server_address[1],
            "key_file": str(key), "open": ["/health", "/metrics*"],
            "pidfile": str(tmp_path / "relay.pid"), "role": "test"}
    relay = subprocess.Popen([sys.executable, "-c", script("keyrelay.py"), json.dumps(args)])
    try:
        while not (tmp_path / "relay.pid").exists():
            assert relay.poll() is None
            time.sleep(0.05)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

        def ask(method: str, path: str, auth: str | None, body: str | None = None) -> int:
            headers = {"Authorization": f"Bearer {auth}"} if auth else {}
            conn.request(method, path, body=body, headers=headers)
            answer = conn.getresponse()
            data = answer.read()
            if answer.status == 200:
                assert json.loads(data) == {"path": path, "body": body or ""}
            return answer.status

        # one kept-alive connection: each request is checked, bodies pass whole
        assert ask("GET", "/health", None) == 200 and ask("GET", "/metrics/x", None) == 200
        assert ask("POST", "/v1/chat/completions", SENTINEL, '{"m": 1}') == 200
        assert ask("GET", "/v1/models", SENTINEL) == 200
        assert ask("GET", "/v1/models", "sk-wrong") == 401
        conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        assert ask("POST", "/v1/chat/completions", None, '{"m": 2}') == 401
        conn.close()
    finally:
        relay.terminate()
        relay.wait(timeout=30)
        engine.shutdown()
    assert relay.returncode == 0


def test_the_port_behind_the_relay_is_proven_free_first() -> None:
    from orchestrator.phases.launch_checks import with_checks

    inventory = make_inventory()
    recipe = load_recipe("qwen3-235b")
    way = get_engine("trtllm").api_key
    assert apikey.relayed_port(way, None, 8355) is None  # no key: no relay
    assert apikey.relayed_port(get_engine("llamacpp").api_key, KEY, 8080) is None  # its own
    inner = apikey.relayed_port(way, KEY, recipe.port)
    assert inner == 18355
    (check,) = with_checks([], recipe, ["spark-a", "spark-b"], "img", inventory, False,
                           "10.0.0.5", inner)
    wanted = {(p.port, p.address) for p in check.steps[0].wanted}  # type: ignore[attr-defined]
    assert (8355, "10.0.0.5") in wanted and (18355, "127.0.0.1") in wanted


def test_down_of_a_migrated_server_takes_its_key_file_along() -> None:
    """(an earlier sparkctl's single server, migrated: its key lives in its directory, which
    its stop removes with its record)"""
    from orchestrator.engines.servers import stop_commands

    inventory = make_inventory()
    (server,) = as_servers([{"name": "qwen3-235b", "engine": "trtllm", "nodes": ["spark-a"],
                             "port": 8355, "main": "mpirun.pid",
                             "container": inventory.container.name,
                             "migrated_from": "/var/lib/sparkctl/run/server.json",
                             "api_key_file": apikey.node_key_file("qwen3-235b")}])
    (command,) = stop_commands(server, inventory).values()
    assert command.endswith("; rm -rf -- /var/lib/sparkctl/run/servers/qwen3-235b")
    assert apikey.node_key_file("qwen3-235b").startswith("/var/lib/sparkctl/run/servers/qwen3-235b/")
