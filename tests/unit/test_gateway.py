"""The gateway: LiteLLM's config and container from the live servers, the key's handling, the
refusals before any change, idempotence, the relay's drain switch, and the rolling rules."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeTransport, as_servers, cluster_of, make_inventory

from orchestrator.cli import gateway as cli_gateway
from orchestrator.cli import rolling
from orchestrator.commands import Secret
from orchestrator.errors import InputError, SparkctlError
from orchestrator.gateway import control as gateway
from orchestrator.node import script
from orchestrator.phases import gateway_spec as gs
from orchestrator.records import Server

KEY = "sk-unit-sentinel-0123456789"


def server(name: str, node: str, alive: bool = True, health: int = 200, **more: Any) -> Server:
    """A server node/servers.py listed on NODE, read as every reader gets it."""
    (found,) = as_servers([{"name": name, "node": node, "nodes": [node], "model": "Qwen/Qwen3-8B",
                            "port": 30000, "recipe": "qwen3-8b", "alive": alive, "health": health,
                            "engine": "sglang", **more}])
    return found


def spec(key: str | None = KEY, host: str = "0.0.0.0", port: int = 4000) -> gs.GatewaySpec:
    inventory = make_inventory()
    found = [server("r-b", "spark-b"), server("r-a", "spark-a"), server("dead", "spark-b", False)]
    return gateway.desired(inventory, "spark-a", host, port, Secret(key) if key else None, found)


def test_every_live_server_of_a_model_is_one_deployment_of_it() -> None:
    config = spec().config()
    deployments = config["model_list"]
    assert [d["model_info"]["id"] for d in deployments] == ["r-a", "r-b"]  # the dead one: out
    assert {d["model_name"] for d in deployments} == {"Qwen/Qwen3-8B"}
    bases = [d["litellm_params"]["api_base"] for d in deployments]
    assert all(b.startswith("http://192.168.") and b.endswith(":30000/v1") for b in bases)
    router = config["router_settings"]
    assert router["routing_strategy"] == "least-busy" and router["num_retries"] >= 1
    assert router["cooldown_time"] == gs.COOLDOWN_SECONDS
    assert config["general_settings"]["master_key"] == KEY
    assert "master_key" not in spec(None, "127.0.0.1").config()["general_settings"]


def test_the_key_is_only_in_the_config_file() -> None:
    s = spec()
    command = gs.run_cmd(s, "cluster")
    assert KEY not in command and KEY not in json.dumps(s.record())
    assert "--env=LITELLM_LOCAL_MODEL_COST_MAP=True" in command  # no outbound price-map fetch
    assert f"ghcr.io/berriai/litellm@{gs.IMAGE_DIGEST}" in command  # pinned by digest
    assert "--entrypoint litellm" in command and f"{gs.GATEWAY_CONFIG_DIR}:" in command
    assert s.record()["key"] is True and KEY in s.config_text()
    assert s.fingerprint("salt") != spec("sk-another-key-0123456").fingerprint("salt")


def test_a_replica_with_an_api_key_gets_it_in_the_config_file_only() -> None:
    """A server launched with --api-key-file: LiteLLM sends that key to it (read from its
    node's file over SSH, on stdout), from the 0600 config; a server bound beyond loopback
    is no replica (its relay would need the address it holds)."""
    replica_key = "sk-replica-sentinel-42"
    keyed = server("r-k", "spark-b", api_key_file="/var/lib/sparkctl/run/servers/r-k/api_key")
    exposed = server("r-x", "spark-a", host="192.168.200.12", api_key_file="/x")
    transports = {"spark-b": FakeTransport("spark-b").on("cat ", stdout=replica_key + "\n")}
    s = gateway.desired(make_inventory(), "spark-a", "0.0.0.0", 4000, Secret(KEY),
                        [server("r-a", "spark-a"), keyed, exposed], gateway.key_reader(transports))
    keys = {d["model_info"]["id"]: d["litellm_params"]["api_key"] for d in s.config()["model_list"]}
    assert keys == {"r-a": "none", "r-k": replica_key}
    (read,) = transports["spark-b"].calls
    assert read.sudo and replica_key not in read.command and "servers/r-k/api_key" in read.command
    assert replica_key not in gs.run_cmd(s, "c") + json.dumps(s.record())
    assert replica_key not in gs.relay_start_cmd(s.replicas[1], s.client)


def test_no_server_no_gateway() -> None:
    with pytest.raises(SparkctlError, match="no model server runs"):
        gateway.desired(make_inventory(), "spark-a", "127.0.0.1", 4000, None, [])


@pytest.mark.parametrize(("content", "mode", "message"), [
    ("", 0o600, "is empty"),
    ("sk-0123456789ab\n", 0o644, "chmod 600"),
    ("sk-0123456789ab\n", 0o640, "readable or writable by others"),
    ("sk-01234\nsk-56789abcdef\n", 0o600, "one line"),
    ("hunter2hunter2\n", 0o600, "starts with sk-"),
])
def test_bad_key_files_are_refused_without_showing_them(
        tmp_path: Path, content: str, mode: int, message: str) -> None:
    path = tmp_path / "key"
    path.write_text(content)
    path.chmod(mode)
    with pytest.raises(InputError, match=message) as caught:
        cli_gateway.read_key_file(str(path))
    assert caught.value.exit_code == 2
    assert not content.strip() or content.strip().splitlines()[0] not in str(caught.value)


def test_a_good_key_file_gives_a_secret(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text(KEY + "\n")
    path.chmod(0o600)
    secret = cli_gateway.read_key_file(str(path))
    assert secret.reveal() == KEY and KEY not in repr(secret)
    with pytest.raises(InputError, match="not found"):
        cli_gateway.read_key_file(str(tmp_path / "missing"))


def test_other_addresses_need_a_key() -> None:
    with pytest.raises(InputError, match="--api-key-file"):
        cli_gateway._check_host("0.0.0.0", None)
    with pytest.raises(InputError, match="not an IP address"):
        cli_gateway._check_host("my host", None)
    cli_gateway._check_host("127.0.0.1", None)
    cli_gateway._check_host("0.0.0.0", Secret(KEY))


def answers(state: dict[str, Any] | None = None, port_free: bool = True, live: bool = False,
            relays: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"state": state, "port_free": port_free, "live": live, "relays": relays or {}}


def transports(head: dict[str, Any], other: dict[str, Any]) -> dict[str, FakeTransport]:
    """Both nodes answer the gateway probe (its JSON argument names "dir"); the head answers
    live once a container was started on it."""
    a, b = FakeTransport("spark-a"), FakeTransport("spark-b")

    def head_probe(call: Any) -> dict[str, Any]:
        started = any("docker run" in c for c in a.commands)
        return {**head, "live": head["live"] or started}

    a.on('"dir"', answer=head_probe)
    b.on('"dir"', answer=other)
    return {"spark-a": a, "spark-b": b}


def test_a_taken_port_is_refused_before_any_change() -> None:
    ts = transports(answers(port_free=False), answers())
    with pytest.raises(InputError, match="port 4000 on spark-a"):
        gateway.up(ts, make_inventory(), spec(), lambda line: None)  # type: ignore[arg-type]
    for t in ts.values():
        assert all('"dir"' in c for c in t.commands), t.commands  # probes only


def test_up_twice_is_a_no_op() -> None:
    s = spec()
    door = {"alive": True, "accepting": True, "allow": [s.client]}
    state = {**s.record()}
    ts = transports(answers(state, port_free=False, live=True, relays={"r-a": door}),
                    answers(relays={"r-b": door}))
    assert gateway.up(ts, make_inventory(), s, lambda line: None) == "unchanged"  # type: ignore[arg-type]
    assert not any("docker" in c for t in ts.values() for c in t.commands)


def test_up_writes_the_key_on_stdin_then_starts_the_container() -> None:
    ts = transports(answers(), answers())
    outcome = gateway.up(ts, make_inventory(), spec(), lambda line: None)  # type: ignore[arg-type]
    assert outcome == "started"
    head = ts["spark-a"]
    writes = [c for c in head.calls if gs.CONFIG_FILE in c.command and c.stdin]
    assert writes and KEY in str(writes[0].stdin) and KEY not in writes[0].command
    assert any("docker run -d --name sparkctl-gateway" in c for c in head.commands)
    assert all(KEY not in c for t in ts.values() for c in t.commands)
    assert any("relay" in c and "setsid" in c for c in ts["spark-b"].commands)


def test_rolling_needs_two_replicas_unless_downtime_is_allowed() -> None:
    found = [server("r-a", "spark-a"), server("r-a", "spark-a"),
             server("x", "spark-b", recipe="other")]
    replicas = rolling.replicas_of(found, "qwen3-8b")
    assert [r.name for r in replicas] == ["r-a"]
    with pytest.raises(InputError, match="--allow-downtime"):
        rolling.check_replicas(replicas, "qwen3-8b", False)
    rolling.check_replicas(replicas, "qwen3-8b", True)
    with pytest.raises(InputError, match="no server of recipe"):
        rolling.check_replicas([], "qwen3-8b", True)
    rolling.check_replicas([server("r-a", "spark-a"), server("r-b", "spark-b")], "qwen3-8b", False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(path: Path, check: Any, seconds: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state = json.loads(path.read_text())
            if check(state):
                return state  # type: ignore[no-any-return]
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"{path} never satisfied the check")


def test_the_relay_passes_bytes_and_its_door_closes_and_opens(tmp_path: Path) -> None:
    import signal

    engine = socket.socket()
    engine.bind(("127.0.0.1", 0))
    engine.listen(4)
    port, target = free_port(), engine.getsockname()[1]
    state = tmp_path / "relay.json"
    args = {"listen": "127.0.0.1", "port": port, "target": target, "state": str(state),
            "pidfile": str(tmp_path / "relay.pid")}
    relay = subprocess.Popen([sys.executable, "-c", script("relay.py"), json.dumps(args)])
    try:
        wait_for(state, lambda s: s["accepting"])
        with socket.create_connection(("127.0.0.1", port)) as client:
            inner, _ = engine.accept()
            client.sendall(b"ping")
            assert inner.recv(4) == b"ping"
            wait_for(state, lambda s: s["busy"] == 1)  # a request went up, no answer yet
            inner.sendall(b"pong")
            assert client.recv(4) == b"pong"
            os.kill(relay.pid, signal.SIGUSR1)  # out of the gateway
            wait_for(state, lambda s: not s["accepting"])
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
            client.sendall(b"next")  # a new request on the kept-alive connection: refused
            inner.settimeout(5)
            assert inner.recv(4) == b""  # closed before a byte of it reached the engine
            wait_for(state, lambda s: s["connections"] == 0)
            inner.close()
        os.kill(relay.pid, signal.SIGUSR2)
        wait_for(state, lambda s: s["accepting"])
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        relay.terminate()
        relay.wait(10)
        engine.close()


def test_status_summarises_the_gateway_from_the_probe_facts() -> None:
    s = spec()
    open_door = {"alive": True, "accepting": True, "requests": 7, "errors": 1}
    facts = {
        "spark-a": {"commands": {"gateway": {"out": json.dumps(answers(
            s.record(), live=True, relays={"r-a": open_door}))}}},
        "spark-b": {"commands": {"gateway": {"out": json.dumps(answers(
            relays={"r-b": {"alive": True, "accepting": False}}))}}},
    }
    doc = gateway.summary(cluster_of(facts))
    assert doc == {"running": True, "node": "spark-a", "host": "0.0.0.0", "port": 4000,
                   "key": True, "live": True,
                   "models": {"Qwen/Qwen3-8B": {"replicas": 2, "in_rotation": 1,
                                                "requests": 7, "errors": 1}},
                   "out_of_rotation": ["r-b"],  # a relay without counters (older): none
                   "relays": {"spark-a/r-a": {"model": "Qwen/Qwen3-8B", "requests": 7,
                                              "errors": 1}}}
    assert gateway.summary(cluster_of({"spark-a": {"commands": {"gateway": {"out": "garbage"}}}})) == {
        "running": False}
    from orchestrator.status.assess import status_facts

    inventory = make_inventory()
    assert "gateway_probe" in json.dumps(status_facts(inventory, inventory.head)) or \
        '"dir"' in status_facts(inventory, inventory.head)["commands"]["gateway"]


def test_litellm_runs_without_an_access_log(tmp_path: Any) -> None:
    # issue 41: uvicorn's access log (LiteLLM's) wrote a query-string key in clear
    import json
    import logging
    import logging.config

    from orchestrator.phases import gateway_spec as gs

    spec = type("Spec", (), {"host": "127.0.0.1", "port": 4000, "image": "litellm:x"})()
    assert f"--log_config {gs.LOG_CONFIG_FILE}" in gs.run_cmd(spec, "c")  # type: ignore[arg-type]
    assert gs.LOG_CONFIG_FILE.endswith(".json")  # (uvicorn reads a .json file as dictConfig)
    manager = logging.Manager(logging.RootLogger(logging.WARNING))
    config = json.loads(json.dumps(gs.LOG_CONFIG))
    saved = logging.Logger.manager
    logging.Logger.manager = manager
    try:
        logging.config.dictConfig(config)
        assert not logging.getLogger("uvicorn.access").isEnabledFor(logging.CRITICAL - 1)
        assert logging.getLogger("uvicorn.error").isEnabledFor(logging.INFO)
    finally:
        logging.Logger.manager = saved
