"""The gateway follows launch and `down --server` through the router's own API (issue 29, 40:
a joiner by `POST /workers`, a leaver by `DELETE /workers/ID`, no restart, the keys staying on
the gateway's node), `down` finds and stops every relay and the router by process and verifies
none is left, `gateway up/down` take the cluster lock."""

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
from orchestrator.phases import gateway_down, teardown
from orchestrator.phases import gateway_spec as gs
from orchestrator.records import Server

KEY = "sk-unit-follow-0123456789"
WORKERS = "old_keys"  # in the node script that changes the router's workers


def server(name: str, node: str, model: str = "Qwen/Qwen3-8B") -> Server:
    (found,) = as_servers([{"name": name, "node": node, "nodes": [node], "model": model,
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


def gateway_nodes(record: dict[str, Any], relays_b: dict[str, Any],
                  answer: dict[str, Any]) -> dict[str, FakeTransport]:
    a, b = FakeTransport("spark-a"), FakeTransport("spark-b")
    a.on('"dir"', stdout=json.dumps({"state": record, "live": True, "port_free": False,
                                      "relays": {"a": {"alive": True, "accepting": True}}}))
    b.on('"dir"', stdout=json.dumps({"state": None, "relays": relays_b}))
    a.on(WORKERS, stdout=json.dumps({"fingerprint": "f2", **answer}))
    return {"spark-a": a, "spark-b": b}


def test_a_joining_replica_is_added_through_the_routers_api_without_a_restart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    record = spec_of(server("a", "spark-a")).record()
    ts = gateway_nodes(record, {}, {"added": ["http://192.168.200.13:30000"], "removed": []})
    monkeypatch.setattr(gateway, "live_servers", lambda *_: [server("a", "spark-a"),
                                                              server("b", "spark-b")])
    notes: list[str] = []
    outcome = gateway_follow.follow(ts, make_inventory(), notes.append)  # type: ignore[arg-type]
    assert outcome == "followed" and any("b joined the router" in n for n in notes)
    head = ts["spark-a"]
    (change,) = [c for c in head.calls if WORKERS in c.command]
    request = json.loads(str(change.stdin))
    assert [w["url"] for w in request["workers"]] == ["http://192.168.200.12:30000",
                                                      "http://192.168.200.13:30000"]
    assert request["wait"] > 0  # until the router lists it healthy
    assert not any("Router.from_args" in c or gs.ROUTER_PID in c for c in head.commands)  # no restart
    assert all(KEY not in c.command + str(c.stdin) for c in head.calls)
    written = [c for c in head.calls if "gateway.json" in c.command and c.stdin]
    doc = json.loads(str(written[-1].stdin))
    assert [r["server"] for r in doc["replicas"]] == ["a", "b"]
    assert doc["key"] is True and doc["fingerprint"] == "f2" and doc["salt"] == request["salt"]
    assert any("setsid" in c for c in ts["spark-b"].commands)  # b's relay started


def test_a_leaving_replica_is_removed_without_a_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    record = spec_of(server("a", "spark-a"), server("b", "spark-b")).record()
    ts = gateway_nodes(record, {"b": {"alive": True, "accepting": False}},
                       {"added": [], "removed": ["http://192.168.200.13:30000"]})
    monkeypatch.setattr(gateway, "live_servers", lambda *_: [server("a", "spark-a")])
    outcome = gateway_follow.follow(ts, make_inventory(), lambda _l: None)  # type: ignore[arg-type]
    assert outcome == "followed"
    assert not any("Router.from_args" in c for c in ts["spark-a"].commands)
    assert any("kill -TERM" in c and "relay-b" in c for c in ts["spark-b"].commands)
    doc = json.loads(str([c for c in ts["spark-a"].calls if "gateway.json" in c.command][-1].stdin))
    assert [r["server"] for r in doc["replicas"]] == ["a"]


def test_a_replica_of_another_model_does_not_join(monkeypatch: pytest.MonkeyPatch) -> None:
    record = spec_of(server("a", "spark-a")).record()
    ts = gateway_nodes(record, {}, {"added": [], "removed": []})
    other = server("o", "spark-b", model="other/model")
    monkeypatch.setattr(gateway, "live_servers", lambda *_: [server("a", "spark-a"), other])
    notes: list[str] = []
    assert gateway_follow.follow(ts, make_inventory(), notes.append) == "unchanged"  # type: ignore[arg-type]
    assert any("o serves another model" in n for n in notes)


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


def test_down_removes_the_unpacked_router_and_its_verify_names_any_left(tmp_path: Path) -> None:
    class Ctx:
        facts = parsed({"commands": {"gateway_router_trees": {
            "out": f"{gs.ROUTER_TREE}\n/opt/sparkctl/sglang-router-0.3.1\n"}}})

    change = gateway_down.RemoveRouter().check(Ctx())  # type: ignore[arg-type]
    assert change.summary == f"remove {gs.ROUTER_TREE}, /opt/sparkctl/sglang-router-0.3.1"
    assert change.commands == (gateway_down.remove_router_cmd(),)
    Ctx.facts = parsed({"commands": {"gateway_router_trees": {"out": ""}}})
    assert gateway_down.RemoveRouter().check(Ctx()).reason == "no gateway router installed"  # type: ignore[arg-type]
    names = [s.name for s in teardown.down_phase(make_inventory(), False, down_parts()).steps]
    assert names.index("gateway-relays") < names.index("gateway-router")  # the router stopped first
    # the commands themselves, on a folder of this machine: every version and a staging
    # leftover go, the folder with them only when nothing else is in it
    install = tmp_path / "opt-sparkctl"
    for tree in ("sglang-router-0.3.2/sglang_router", "sglang-router-0.3.1", ".staging-x1"):
        (install / tree).mkdir(parents=True)
    listed = subprocess.run(["sh", "-c", gateway_down.router_trees_cmd(str(install))],
                            capture_output=True, text=True, check=True).stdout.split()
    assert sorted(Path(p).name for p in listed) == [".staging-x1", "sglang-router-0.3.1",
                                                    "sglang-router-0.3.2"]
    (install / "theirs").write_text("a user's file\n")
    subprocess.run(["sh", "-c", gateway_down.remove_router_cmd(str(install))], check=True)
    assert [p.name for p in install.iterdir()] == ["theirs"]
    (install / "theirs").unlink()
    (install / "sglang-router-0.3.2").mkdir()
    subprocess.run(["sh", "-c", gateway_down.remove_router_cmd(str(install))], check=True)
    assert not install.exists()
    # the verify step names a tree and the gateway's boot unit still there
    verify = teardown.verify_cmd(make_inventory(), network=False)
    assert "gateway router: " in verify and f"boot unit: {gs.BOOT_UNIT_PATH}" in verify


def test_a_launch_probes_for_a_gateway_only_when_a_node_holds_its_record() -> None:
    """The launch's gateway check reads the facts gathered up front (one file per node) and
    the follow that ends a launch then costs no probe of every node when none holds a record."""
    from types import SimpleNamespace

    from orchestrator.core.executor import Executor
    from orchestrator.core.progress import Progress
    from orchestrator.core.report import Report
    from orchestrator.core.step import Plan, RunOptions

    inventory = make_inventory()

    def seen(record_on: set[str]) -> list[str] | None:
        ts = {n.name: FakeTransport(n.name, facts={"files": {gateway_follow.RECORD: {
            "exists": n.name in record_on}}}) for n in inventory.nodes}
        report, options = Report("launch"), RunOptions()
        for name in ts:
            report.host(name)
        Executor(inventory, ts, options, report, Progress(quiet=True)).run(  # type: ignore[arg-type]
            Plan("launch", [gateway_follow.seen_phase()]))
        assert report.ok and all(len(t.calls) == 1 for t in ts.values())  # the facts alone
        return options.gateway_nodes

    assert seen(set()) == []
    assert seen({"spark-b"}) == ["spark-b"]
    probed = FakeTransport("spark-a").on('"dir"', stdout=json.dumps({"state": None, "relays": {}}))
    session = SimpleNamespace(transports={"spark-a": probed})
    gateway_follow.after_change(session, inventory, print, [])
    assert probed.calls == []
    gateway_follow.after_change(session, inventory, print, ["spark-a"])
    assert any("gateway_probe" in c or '"dir"' in c for c in probed.commands)
