"""Issue 41's gateway defects, each with a test that failed before its fix:
41.2 no door beside the gateway (a relay lets in only the gateway's node),
41.5 Ctrl-C during `launch --rolling` reopens the door it closed, and `gateway up` / `status`
     see a door left closed,
41.7 gateway.json private with a salted slow fingerprint; `--host` the node lacks refused
     before anything; a failed start leaves no config with the key; a running gateway's host
     changes instead of reading as "port taken by another program"."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeTransport, cluster_of, make_inventory
from test_gateway import KEY, answers, free_port, server, spec, transports, wait_for

from orchestrator.cli import gateway as cli_gateway
from orchestrator.cli import rolling
from orchestrator.errors import InputError, SparkctlError
from orchestrator.gateway import control as gateway
from orchestrator.node import script
from orchestrator.phases import gateway_spec as gs


def quiet(_line: str) -> None:
    pass


# ---------------------------------------------------------------- 41.2: no door beside it

def test_a_relay_lets_in_only_the_gateway_node(tmp_path: Path) -> None:
    """The relay binds the fabric address; an engine behind it may have no key. A peer other
    than the gateway's node is closed on before a byte reaches the engine."""
    engine = socket.socket()
    engine.bind(("127.0.0.1", 0))
    engine.listen(4)
    engine.settimeout(1.5)
    port, state = free_port(), tmp_path / "relay.json"
    args = {"listen": "127.0.0.1", "port": port, "target": engine.getsockname()[1],
            "state": str(state), "pidfile": str(tmp_path / "relay.pid"), "allow": ["127.0.0.2"]}
    relay = subprocess.Popen([sys.executable, "-c", script("relay.py"), json.dumps(args)])
    try:
        assert wait_for(state, lambda s: s["accepting"])["allow"] == ["127.0.0.2"]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as stranger:
            try:
                stranger.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n\r\n")
                assert stranger.recv(16) == b""  # closed on
            except ConnectionResetError:
                pass  # closed on, the request unread
        with pytest.raises(socket.timeout):
            engine.accept()  # the engine never saw it
        gateway_side = socket.create_connection(("127.0.0.1", port), timeout=5,
                                                source_address=("127.0.0.2", 0))
        with gateway_side:
            inner, _ = engine.accept()
            gateway_side.sendall(b"ping")
            assert inner.recv(4) == b"ping"
            inner.close()
    finally:
        relay.terminate()
        relay.wait(10)
        engine.close()


def test_relays_are_started_for_the_gateway_node_only() -> None:
    s = spec()
    assert s.client == make_inventory().mpi_address(make_inventory().node("spark-a"))
    command = gs.relay_start_cmd(s.replicas[1], s.client)
    assert f'"allow": ["{s.client}"]' in command


def test_a_relay_started_without_the_peer_check_is_replaced() -> None:
    """Relays started by an older sparkctl (no allow list) are stopped and started again."""
    s = spec()
    old = {"alive": True, "accepting": True}
    ts = transports(answers(s.record(), port_free=False, live=True, relays={"r-a": old}),
                    answers(relays={"r-b": old}))
    assert gateway.up(ts, make_inventory(), s, quiet) == "relays"  # type: ignore[arg-type]
    for node in ("spark-a", "spark-b"):
        commands = ts[node].commands
        term = next(i for i, c in enumerate(commands) if "kill -TERM" in c)
        assert any("setsid" in c for c in commands[term:]), commands


# ---------------------------------------------------------------- 41.5: Ctrl-C in --rolling

def rolling_world(monkeypatch: pytest.MonkeyPatch, relays: dict[str, Any]) -> dict[str, FakeTransport]:
    """rolling() over two routed replicas with every remote step faked."""
    import contextlib

    from orchestrator.core import runner, session
    from orchestrator.engines import servers

    ts = {n: FakeTransport(n) for n in ("spark-a", "spark-b")}

    class Session:
        transports = ts

    monkeypatch.setattr(session, "open_session", lambda *a, **k: contextlib.nullcontext(Session()))
    monkeypatch.setattr(runner, "load_inventory_option", lambda _p: (make_inventory(), None))
    monkeypatch.setattr(servers, "gather", lambda *a, **k: [server("r-a", "spark-a"),
                                                            server("r-b", "spark-b")])
    probes = {n: gateway.Probe(n, None, relays.get(n, {}), None, False) for n in ts}
    monkeypatch.setattr(gateway, "probe_all", lambda *a, **k: probes)
    monkeypatch.setattr(gateway, "drain", lambda t, name, *_: gateway.set_in_rotation(t, name, False))
    return ts


def test_ctrl_c_while_relaunching_reopens_the_door_and_says_what_changed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ts = rolling_world(monkeypatch, {"spark-a": {"r-a": {}}, "spark-b": {"r-b": {}}})
    notes: list[str] = []

    def relaunch(_server: Any, _transport: Any) -> int:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rolling.rolling("qwen3-8b", None, False, relaunch, notes.append)
    signals = [c for c in ts["spark-a"].commands if "relay-r-a" in c and "kill -" in c]
    assert "kill -USR1" in signals[0] and "kill -USR2" in signals[-1]  # out, then back in
    assert "stopped part way: replaced none" in notes[-1]
    assert "relaunching r-a" in notes[-1] and "r-a is back in" in notes[-1]


def test_ctrl_c_that_launch_turns_into_a_failure_still_reopens_the_door(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Launch catches Ctrl-C in its readiness wait and fails its step (exit 1 or 130): the
    signal itself tells rolling that the user stopped it."""
    import os
    import signal

    ts = rolling_world(monkeypatch, {"spark-a": {"r-a": {}}, "spark-b": {"r-b": {}}})
    notes: list[str] = []

    def relaunch(_server: Any, _transport: Any) -> int:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:
            return 1  # what launch makes of it
        return 0

    with pytest.raises(SparkctlError, match="interrupted while relaunching r-a") as raised:
        rolling.rolling("qwen3-8b", None, False, relaunch, notes.append)
    assert raised.value.exit_code == 130
    assert "kill -USR2" in [c for c in ts["spark-a"].commands if "relay-r-a" in c][-1]
    assert "r-a is back in" in notes[-1]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored


def test_a_failed_relaunch_keeps_the_door_closed_and_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ts = rolling_world(monkeypatch, {"spark-a": {"r-a": {}}, "spark-b": {"r-b": {}}})
    notes: list[str] = []
    calls: list[str] = []

    def relaunch(server_: Any, _transport: Any) -> int:
        calls.append(server_.name)
        return 0 if len(calls) == 1 else 1

    with pytest.raises(SparkctlError, match="it stays out of the gateway"):
        rolling.rolling("qwen3-8b", None, False, relaunch, notes.append)
    monkeypatch.setattr("time.sleep", lambda _s: None)
    assert "replaced r-a" in notes[-1] and "r-b is OUT" in notes[-1]
    assert not any("USR2" in c for c in ts["spark-b"].commands)


def test_gateway_up_reopens_a_door_left_closed() -> None:
    s = spec()
    inside = {"alive": True, "accepting": True, "allow": [s.client]}
    closed = {**inside, "accepting": False}
    ts = transports(answers(s.record(), port_free=False, live=True, relays={"r-a": inside}),
                    answers(relays={"r-b": closed}))
    notes: list[str] = []
    assert gateway.up(ts, make_inventory(), s, notes.append) == "relays"  # type: ignore[arg-type]
    assert any("kill -USR2" in c and "relay-r-b" in c for c in ts["spark-b"].commands)
    assert any("r-b on spark-b was out of the rotation" in n for n in notes)


def test_status_exits_1_for_a_closed_door() -> None:
    s = spec()
    facts = {"spark-a": {"commands": {"gateway": {"out": json.dumps(answers(
        s.record(), live=True, relays={"r-a": {"alive": True, "accepting": True}}))}}},
             "spark-b": {"commands": {"gateway": {"out": json.dumps(answers(
                 relays={"r-b": {"alive": True, "accepting": False}}))}}}}
    result: dict[str, Any] = {"ok": True, "nodes": {"spark-a": {"problems": []},
                                                    "spark-b": {"problems": []}}}
    gateway.attach_to_status(result, cluster_of(facts))
    assert result["ok"] is False
    assert "r-b out of the rotation" in result["nodes"]["spark-a"]["problems"][0]


def test_gateway_status_exits_1_for_a_closed_door(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    from orchestrator.cli import launch

    doc = {"running": True, "live": True, "node": "spark-a", "address": "http://x:4000/v1",
           "key": True, "router": "r 1", "replicas": [
               {"server": "r-b", "model": "m", "node": "spark-b", "address": "a", "port": 1,
                "health": "healthy", "in_gateway": False, "in_flight": 0}]}
    monkeypatch.setattr(launch, "_server_on_head",
                        lambda *_: (contextlib.nullcontext(object()), make_inventory()))
    monkeypatch.setattr(cli_gateway, "status_doc", lambda *_: doc)
    assert cli_gateway._status(None, False) == 1
    doc["replicas"][0]["in_gateway"] = True
    assert cli_gateway._status(None, False) == 0


# ---------------------------------------------------------------- 41.7: record, host

def test_the_record_is_private_with_a_salted_slow_fingerprint() -> None:
    s = spec()
    one, two = s.record(), s.record()
    assert one["salt"] != two["salt"] and one["fingerprint"] != two["fingerprint"]
    plain = hashlib.sha256((s.config_text() + json.dumps(s.fingerprinted())).encode()).hexdigest()
    assert one["fingerprint"] != plain and KEY not in json.dumps(one)
    assert gs.matches(one, s) and not gs.matches({**one, "salt": ""}, s)
    assert not gs.matches(one, spec("sk-another-key-0123456"))
    ts = transports(answers(), answers())
    gateway.up(ts, make_inventory(), s, quiet)  # type: ignore[arg-type]
    (write,) = [c for c in ts["spark-a"].commands if "gateway.json.sparkctl-tmp" in c]
    assert "chmod 600" in write


def test_a_host_the_node_lacks_is_refused_before_any_change() -> None:
    ts = transports({**answers(), "address_missing": True}, answers())
    with pytest.raises(InputError, match=r"--host 192\.0\.2\.7: spark-a has no such address"):
        gateway.up(ts, make_inventory(), spec(host="192.0.2.7"), quiet)  # type: ignore[arg-type]
    assert all('"dir"' in c for t in ts.values() for c in t.commands)  # probes only


def test_the_probe_tells_a_missing_address_from_a_taken_port() -> None:
    def probe(host: str, port: int) -> dict[str, Any]:
        args = {"dir": "/nonexistent", "host": host, "port": port, "liveliness": False}
        out = subprocess.run([sys.executable, "-c", script("gateway_probe.py"), json.dumps(args)],
                             check=True, capture_output=True, text=True).stdout
        return dict(json.loads(out))

    assert probe("192.0.2.7", free_port())["address_missing"] is True
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        answer = probe("127.0.0.1", taken.getsockname()[1])
    assert answer["port_free"] is False and answer["address_missing"] is False


def test_a_gateway_that_does_not_start_leaves_no_config_with_the_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def never_live(*_a: Any) -> None:
        raise SparkctlError("did not answer")

    monkeypatch.setattr(gateway, "_wait_live", never_live)
    ts = transports(answers(), answers())
    with pytest.raises(SparkctlError):
        gateway.up(ts, make_inventory(), spec(), quiet)  # type: ignore[arg-type]
    last = ts["spark-a"].commands[-1]
    assert gs.GATEWAY_CONFIG_DIR in last and "rm -rf" in last and "gateway.json" in last


def test_a_running_gateway_moves_to_another_host() -> None:
    """Its own port is not "taken by another program": it is restarted on the new address."""
    s = spec(host="0.0.0.0")
    door = {"alive": True, "accepting": True, "allow": [s.client]}
    ts = transports(answers(s.record(), port_free=False, live=True, relays={"r-a": door}),
                    answers(relays={"r-b": door}))
    moved = spec(host="127.0.0.1")
    assert gateway.up(ts, make_inventory(), moved, quiet) == "restarted"  # type: ignore[arg-type]
    written = [c for c in ts["spark-a"].calls if gs.CONFIG_FILE in c.command and c.stdin]
    assert json.loads(str(written[-1].stdin))["host"] == "127.0.0.1"
    assert any("Router.from_args" in c for c in ts["spark-a"].commands)
    other = spec(port=4001)
    ts = transports(answers(s.record(), port_free=False, live=True), answers())
    with pytest.raises(InputError, match="taken by another program"):
        gateway.up(ts, make_inventory(), other, quiet)  # type: ignore[arg-type]
