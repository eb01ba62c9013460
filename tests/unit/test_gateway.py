"""The gateway: the router's config and process from the live servers, the key's handling, the
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


def test_every_live_server_of_a_model_is_one_worker_of_the_router() -> None:
    config = spec().config()
    workers = config["workers"]
    assert [w["url"] for w in workers] == ["http://192.168.200.12:30000",
                                           "http://192.168.200.13:30000"]  # the dead one: out
    assert {w["model_id"] for w in workers} == {"Qwen/Qwen3-8B"}
    settings = config["settings"]
    # least busy: cache_aware picks the less loaded replica whenever the loads differ
    assert settings["policy"] == "cache_aware" and settings["balance_abs_threshold"] == 0
    assert settings["balance_rel_threshold"] == 1.0 and settings["retry_max_retries"] >= 1
    assert settings["health_check_interval_secs"] <= 5
    assert config["api_key"] == KEY and config["host"] == "0.0.0.0" and config["port"] == 4000
    assert spec(None, "127.0.0.1").config()["api_key"] is None


def test_the_settings_are_the_routers_own_arguments(tmp_path: Path) -> None:
    """Every key of POLICY is a field of the router's RouterArgs at the pinned version (the
    launcher passes them as keyword arguments): a typo would stop the router at start."""
    fields = {"policy", "balance_abs_threshold", "balance_rel_threshold", "retry_max_retries",
              "retry_initial_backoff_ms", "retry_max_backoff_ms", "health_check_interval_secs",
              "health_check_timeout_secs", "health_failure_threshold",
              "health_success_threshold", "request_timeout_secs", "log_level"}
    assert set(gs.POLICY) <= fields
    import glob
    import zipfile

    # the pinned wheel as the lab caches it (lab/sparklab/router_wheel.py), unpacked here
    wheels = glob.glob("/var/lib/sparklab/cache/sglang-router/wheelhouse-*/root/usr/local/"
                       f"share/sparkctl/wheels/sglang_router-{gs.ROUTER_VERSION}-*.whl")
    if not wheels:
        pytest.skip(f"no {gs.ROUTER} wheel cached here (the lab downloads it)")
    with zipfile.ZipFile(wheels[0]) as archive:
        archive.extractall(tmp_path)
    sys.path.insert(0, str(tmp_path))
    try:
        from sglang_router.router_args import RouterArgs  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
    RouterArgs(host="127.0.0.1", port=1, worker_urls=[], api_key=None, **gs.POLICY)


def test_the_key_is_only_in_the_config_file() -> None:
    s = spec()
    commands = gs.start_cmd() + gs.install_cmd() + gs.stop_router_cmd()
    assert KEY not in commands and KEY not in json.dumps(s.record())
    assert gs.CONFIG_FILE in gs.start_cmd() and "setsid" in gs.start_cmd()
    assert s.record()["key"] is True and KEY in s.config_text()
    assert s.fingerprint("salt") != spec("sk-another-key-0123456").fingerprint("salt")


def test_a_replica_without_a_key_never_gets_the_master_key() -> None:
    """The router 0.3.2 sends its own --api-key to a worker that has none: every worker gets
    one, NO_KEY for a replica launched without."""
    workers = spec().config()["workers"]
    assert {w["api_key"] for w in workers} == {gs.NO_KEY} and KEY not in json.dumps(workers)


def test_one_model_only() -> None:
    other = server("o", "spark-b", model="other/model")
    with pytest.raises(InputError, match="routes a request to any of its replicas"):
        gateway.desired(make_inventory(), "spark-a", "127.0.0.1", 4000, None,
                        [server("r-a", "spark-a"), other])


def test_a_replica_with_an_api_key_gets_it_in_the_config_file_only() -> None:
    """A server launched with --api-key-file: the router sends that key to it (read from its
    node's file over SSH, on stdout), from the 0600 config; a server bound beyond loopback
    is no replica (its relay would need the address it holds)."""
    replica_key = "sk-replica-sentinel-42"
    keyed = server("r-k", "spark-b", api_key_file="/var/lib/sparkctl/run/servers/r-k/api_key")
    exposed = server("r-x", "spark-a", host="192.168.200.12", api_key_file="/x")
    transports = {"spark-b": FakeTransport("spark-b").on("cat ", stdout=replica_key + "\n")}
    s = gateway.desired(make_inventory(), "spark-a", "0.0.0.0", 4000, Secret(KEY),
                        [server("r-a", "spark-a"), keyed, exposed], gateway.key_reader(transports))
    keys = {w["url"]: w["api_key"] for w in s.config()["workers"]}
    assert keys == {"http://192.168.200.12:30000": gs.NO_KEY,
                    "http://192.168.200.13:30000": replica_key}
    (read,) = transports["spark-b"].calls
    assert read.sudo and replica_key not in read.command and "servers/r-k/api_key" in read.command
    assert replica_key not in gs.start_cmd() + json.dumps(s.record())
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
    live, listing every replica as a worker, once the router was started on it."""
    a, b = FakeTransport("spark-a"), FakeTransport("spark-b")
    urls = ["http://192.168.200.12:30000", "http://192.168.200.13:30000"]

    def head_probe(call: Any) -> dict[str, Any]:
        if any("gateway_router" in c or "Router.from_args" in c for c in a.commands):
            return {**head, "live": True, "workers": {u: {"healthy": True} for u in urls}}
        return head

    a.on('"dir"', answer=head_probe)
    a.on("old_keys", stdout=json.dumps({"added": [], "removed": [], "workers": []}))
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
    listed = {r.url: {"healthy": True} for r in s.replicas}
    ts = transports({**answers(state, port_free=False, live=True, relays={"r-a": door}),
                     "workers": listed}, answers(relays={"r-b": door}))
    assert gateway.up(ts, make_inventory(), s, lambda line: None) == "unchanged"  # type: ignore[arg-type]
    assert all('"dir"' in c for t in ts.values() for c in t.commands)  # probes only


def test_up_writes_the_keys_on_stdin_then_starts_the_router() -> None:
    ts = transports(answers(), answers())
    outcome = gateway.up(ts, make_inventory(), spec(), lambda line: None)  # type: ignore[arg-type]
    assert outcome == "started"
    head = ts["spark-a"]
    writes = [c for c in head.calls if gs.CONFIG_FILE in c.command and c.stdin]
    assert writes and KEY in str(writes[0].stdin) and KEY not in writes[0].command
    order = [c for c in head.commands if '"dir"' not in c and (
        "\"wheelhouse\"" in c or "Router.from_args" in c or gs.CONFIG_FILE in c)]
    assert "sha256" in order[0] and "Router.from_args" in order[-1]  # unpacked, written, run
    assert not any("docker run" in c for c in head.commands)
    # an older sparkctl's LiteLLM container would hold the port: removed before the router starts
    stop = next(i for i, c in enumerate(head.commands) if gs.remove_legacy_cmd() in c)
    assert stop < next(i for i, c in enumerate(head.commands) if "Router.from_args" in c)
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
