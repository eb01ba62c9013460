"""The gateway's gaps of issue 29: it follows launch and `down --server` (a leaver without a
restart, a joiner by a graceful restart whose new config keeps the key on the node), `down`
finds and stops every relay by process and verifies none is left, `gateway up/down` take the
cluster lock."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeTransport, as_servers, make_inventory
from conftest import node_facts as parsed

from orchestrator.commands import Secret
from orchestrator.engines.serverctl import down_parts
from orchestrator.gateway import control as gateway
from orchestrator.gateway import follow as gateway_follow
from orchestrator.node import script
from orchestrator.phases import gateway_down, teardown
from orchestrator.phases import gateway_spec as gs
from orchestrator.records import Server

KEY = "sk-unit-follow-0123456789"
SWAP = 'a["model_list"]'  # in the node script that swaps the model list


def server(name: str, node: str) -> Server:
    (found,) = as_servers([{"name": name, "node": node, "nodes": [node], "model": "Qwen/Qwen3-8B",
                            "port": 30000, "recipe": "qwen3-8b", "alive": True, "health": 200}])
    return found


def spec_of(*servers: Server, key: str | None = KEY) -> gs.GatewaySpec:
    return gateway.desired(make_inventory(), "spark-a", "0.0.0.0", 4000,
                           Secret(key) if key else None, list(servers))


def test_changes_name_who_joined_and_who_left() -> None:
    before = spec_of(server("a", "spark-a"), server("b", "spark-b")).record()["replicas"]
    now = spec_of(server("a", "spark-a"), server("c", "spark-b")).replicas
    assert gateway_follow.changes(before, now) == (["c"], ["b"])
    moved = spec_of(server("a", "spark-a"), server("b", "spark-a")).replicas
    assert gateway_follow.changes(before, moved) == (["b"], ["b"])  # another node: out and in
    assert gateway_follow.changes(before, spec_of(server("a", "spark-a"), server(
        "b", "spark-b")).replicas) == ([], [])


def test_the_new_config_keeps_the_key_on_the_node_and_the_fingerprint_of_up(
        tmp_path: Path) -> None:
    old = spec_of(server("a", "spark-a"))
    path = tmp_path / "config.yaml"
    path.write_text(old.config_text())
    new = spec_of(server("a", "spark-a"), server("b", "spark-b"))
    request = {"path": str(path), "model_list": new.config()["model_list"],
               "extra": new.fingerprinted(), "salt": "s4lt", "rounds": gs.FINGERPRINT_ROUNDS}
    assert KEY not in json.dumps(request)
    out = subprocess.run([sys.executable, "-c", script("gateway_config.py")], check=True,
                         input=json.dumps(request), capture_output=True, text=True).stdout
    fingerprint = json.loads(out)["fingerprint"]
    assert fingerprint == new.fingerprint("s4lt")  # `gateway up` finds it unchanged
    assert gs.matches({"salt": "s4lt", "fingerprint": fingerprint}, new)
    assert path.read_text() == new.config_text() and path.stat().st_mode & 0o777 == 0o600


def gateway_nodes(record: dict[str, Any], relays_b: dict[str, Any]) -> dict[str, FakeTransport]:
    a, b = FakeTransport("spark-a"), FakeTransport("spark-b")
    a.on('"dir"', stdout=json.dumps({"state": record, "live": True, "port_free": False,
                                      "relays": {"a": {"alive": True, "accepting": True}}}))
    b.on('"dir"', stdout=json.dumps({"state": None, "relays": relays_b}))
    a.on(r'a\["model_list"\]', stdout=json.dumps({"fingerprint": "f2"}))
    return {"spark-a": a, "spark-b": b}


def test_a_joining_replica_restarts_litellm_gracefully_without_the_key_leaving(
        monkeypatch: pytest.MonkeyPatch) -> None:
    record = spec_of(server("a", "spark-a")).record()
    ts = gateway_nodes(record, {})
    monkeypatch.setattr(gateway, "live_servers", lambda *_: [server("a", "spark-a"),
                                                              server("b", "spark-b")])
    notes: list[str] = []
    outcome = gateway_follow.follow(ts, make_inventory(), notes.append)  # type: ignore[arg-type]
    assert outcome == "restarted" and any("so b joins" in n for n in notes)
    head = ts["spark-a"]
    order = [c for c in head.commands if "docker stop" in c or "docker start" in c
             or SWAP in c]
    assert SWAP in order[0] and "docker stop -t 60" in order[1]
    assert "docker start" in order[2] and not any("docker run" in c for c in head.commands)
    assert all(KEY not in c.command + str(c.stdin) for c in head.calls)
    written = [c for c in head.calls if "gateway.json" in c.command and c.stdin]
    doc = json.loads(str(written[-1].stdin))
    assert [r["server"] for r in doc["replicas"]] == ["a", "b"]
    assert doc["key"] is True and doc["fingerprint"] == "f2"
    assert any("setsid" in c for c in ts["spark-b"].commands)  # b's relay started


def test_a_leaving_replica_needs_no_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    record = spec_of(server("a", "spark-a"), server("b", "spark-b")).record()
    ts = gateway_nodes(record, {"b": {"alive": True, "accepting": False}})
    monkeypatch.setattr(gateway, "live_servers", lambda *_: [server("a", "spark-a")])
    outcome = gateway_follow.follow(ts, make_inventory(), lambda _l: None)  # type: ignore[arg-type]
    assert outcome == "followed"
    assert not any("docker" in c for c in ts["spark-a"].commands)
    assert any("kill -TERM" in c and "relay-b" in c for c in ts["spark-b"].commands)
    doc = json.loads(str([c for c in ts["spark-a"].calls if "gateway.json" in c.command][-1].stdin))
    assert [r["server"] for r in doc["replicas"]] == ["a"]
    assert doc["fingerprint"] == record["fingerprint"]  # LiteLLM still runs that config
    assert doc["salt"] == record["salt"]  # under the salt it was computed with


def test_no_gateway_nothing_to_follow() -> None:
    a = FakeTransport("spark-a").on('"dir"', stdout=json.dumps({"state": None, "relays": {}}))
    assert gateway_follow.follow({"spark-a": a}, make_inventory(), print) == "none"  # type: ignore[dict-item]


def test_relays_are_found_by_their_pid_files_and_only_while_they_are_relays(tmp_path: Path) -> None:
    argv = json.dumps({"state": f"{gs.GATEWAY_RUN}/relay-x.json"})
    relay = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", argv])
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", argv])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "relay-x.pid").write_text(f"{relay.pid}\n")
        (tmp_path / "relay-y.pid").write_text(f"{other.pid}\n")  # reused: not a relay now
        (tmp_path / "relay-z.pid").write_text("garbage\n")
        found = subprocess.run(["sh", "-c", gs.relay_pids_cmd(str(tmp_path))],
                               capture_output=True, text=True).stdout.split()
        # the stranger looks like a relay but no pid file of this node names it
        assert found == [str(relay.pid)]
    finally:
        for proc in (relay, stranger, other):
            proc.kill()
            proc.wait()


def test_down_stops_relays_and_its_verify_names_any_left() -> None:
    class Ctx:
        facts = parsed({"commands": {"gateway_relays": {"out": "123\n456\n"}}})

    change = gateway_down.StopRelays().check(Ctx())  # type: ignore[arg-type]
    assert "2 gateway relay(s)" in change.summary and gs.stop_relays_cmd() in change.commands
    Ctx.facts = parsed({"commands": {"gateway_relays": {"out": ""}}})
    assert gateway_down.StopRelays().check(Ctx()).reason == "no gateway relay"  # type: ignore[arg-type]
    verify = teardown.verify_cmd(make_inventory(), network=False)
    assert gs.RELAY_PATTERN in verify and "gateway relay: pid" in verify
    names = [s.name for s in teardown.down_phase(make_inventory(), False, down_parts()).steps]
    assert names.index("gateway-relays") < names.index("files")  # before the pid files go
