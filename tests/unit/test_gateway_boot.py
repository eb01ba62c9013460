"""The gateway after a reboot of one of its nodes: LiteLLM's container came back by docker's
restart policy; the router and the relays are processes, so `gateway up` leaves a boot unit
(sparkctl-gateway.service) on every node that holds a piece of it, and `gateway down` and
`sparkctl down` remove it. Each test failed before the unit existed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from conftest import make_inventory
from test_gateway import KEY, answers, free_port, spec, transports

from orchestrator.core.step import Change, Unchanged
from orchestrator.gateway import control as gateway
from orchestrator.node import script
from orchestrator.phases import gateway_spec as gs

BOOT = script("gateway_boot.py")


def quiet(_line: str) -> None:
    pass


def test_up_leaves_the_boot_unit_on_every_node_of_the_gateway() -> None:
    ts = transports(answers(), answers())
    gateway.up(ts, make_inventory(), spec(), quiet)  # type: ignore[arg-type]
    for node, t in ts.items():
        (call,) = [c for c in t.calls if c.command.endswith(" install")]
        request = json.loads(str(call.stdin))
        files = {path: text for path, _mode, text in request["files"]}
        assert request["unit"] == gs.BOOT_UNIT, node
        unit = files[gs.BOOT_UNIT_PATH]
        assert f"ExecStart=/usr/bin/python3 {gs.GATEWAY_BOOT_DIR}/gateway_boot.py" in unit
        assert "WantedBy=multi-user.target" in unit and "KillMode=process" in unit
        assert files[f"{gs.GATEWAY_BOOT_DIR}/relay.py"] == script("relay.py")
        assert files[f"{gs.GATEWAY_BOOT_DIR}/gateway_router.py"] == script("gateway_router.py")
        assert KEY not in str(call.stdin)  # the keys stay in router.json (0600)
    # on the replica's node, after its relay (whose arguments it starts again)
    b = ts["spark-b"].commands
    relay = next(i for i, c in enumerate(b) if "relay-r-b.args" in c and "setsid" in c)
    assert relay < next(i for i, c in enumerate(b) if c.endswith(" install"))


def test_down_removes_the_boot_unit_before_the_processes() -> None:
    s = spec()
    door = {"alive": True, "accepting": True, "allow": [s.client]}
    ts = transports(answers(s.record(), relays={"r-a": door}), answers(relays={"r-b": door}))
    gateway.down(ts)  # type: ignore[arg-type]
    for t in ts.values():
        changes = [c for c in t.commands if '"dir"' not in c]
        assert changes[0] == gs.boot_remove_cmd(), changes
        assert any("kill -TERM" in c for c in changes[1:])


def test_sparkctl_down_removes_the_boot_unit_too() -> None:
    from orchestrator.phases import gateway_down

    assert "sparkctl-gateway.service" in json.dumps(gateway_down.facts())
    change = gateway_down.StopRelays().check(
        _Ctx({"gateway_relays": "", "gateway_boot_unit": "present"}))  # type: ignore[arg-type]
    assert isinstance(change, Change) and change.commands[0] == gs.boot_remove_cmd()
    assert change.summary == "remove sparkctl-gateway.service"
    nothing = gateway_down.StopRelays().check(
        _Ctx({"gateway_relays": "", "gateway_boot_unit": ""}))  # type: ignore[arg-type]
    assert isinstance(nothing, Unchanged)


class _Facts:
    def __init__(self, outputs: dict[str, str]) -> None:
        self.outputs = outputs

    def output(self, name: str) -> str:
        return self.outputs.get(name, "")


class _Ctx:
    def __init__(self, outputs: dict[str, str]) -> None:
        self.facts = _Facts(outputs)


def test_relay_arguments_are_kept_for_the_boot_and_go_with_the_relay() -> None:
    s = spec()
    start = gs.relay_start_cmd(s.replicas[1], s.client)
    assert ">/var/lib/sparkctl/run/gateway/relay-r-b.args" in start.replace("'", "")
    assert "/var/lib/sparkctl/run/gateway/relay-r-b.args" in gs.relay_signal_cmd("r-b", "TERM")


def fake(tmp: Path, name: str) -> str:
    """A stand-in for the relay or the router's launcher: writes its argument and stays."""
    path = tmp / name
    path.write_text("import sys, time\nopen(sys.argv[0] + '.ran', 'w').write(sys.argv[1])\n"
                    "time.sleep(30)\n")
    return str(path)


def boot_world(tmp: Path, gateway_here: bool) -> tuple[Path, dict[str, Any]]:
    run = tmp / "run"
    run.mkdir()
    args = {"listen": "127.0.0.1", "port": free_port(), "target": 1, "allow": ["127.0.0.2"],
            "state": str(run / "relay-r-a.json"), "pidfile": str(run / "relay-r-a.pid")}
    (run / "relay-r-a.args").write_text(json.dumps(args) + "\n")
    (run / "relay-r-a.pid").write_text(f"{os.getpid()}\n")  # a reused number: not a relay
    (run / "relay-r-a.json").write_text('{"pid": 1}')
    config = tmp / "router.json"
    if gateway_here:
        config.write_text("{}")
        (run / "gateway.json").write_text("{}")
    plan = {"run": str(run), "config": str(config), "tree": "/nowhere", "module": "the_router",
            "relay": fake(tmp, "relay.py"), "router": fake(tmp, "router.py"), "address_wait": 2}
    (tmp / "plan.json").write_text(json.dumps(plan))
    return tmp / "plan.json", plan


def run_boot(plan: Path) -> str:
    (plan.parent / "gateway_boot.py").write_text(BOOT)
    done = subprocess.run([sys.executable, str(plan.parent / "gateway_boot.py"), str(plan)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def ran(path: str) -> dict[str, Any]:
    for _ in range(100):
        written = Path(path + ".ran").read_text() if os.path.exists(path + ".ran") else ""
        if written:
            return json.loads(written)
        time.sleep(0.05)
    raise AssertionError(f"{path} was not started")


def test_at_boot_the_relays_and_the_router_start_again(tmp_path: Path) -> None:
    plan_path, plan = boot_world(tmp_path, gateway_here=True)
    out = run_boot(plan_path)
    assert "relay r-a started on 127.0.0.1" in out and "router started" in out, out
    relay = ran(plan["relay"])
    assert relay["allow"] == ["127.0.0.2"] and relay["pidfile"].endswith("relay-r-a.pid")
    # the pid file of the last life named a process that is no relay: replaced, not trusted
    assert not os.path.exists(relay["state"])
    assert ran(plan["router"]) == {"config": plan["config"], "tree": "/nowhere",
                                   "module": "the_router", "pidfile": plan["run"] + "/router.pid"}


def test_at_boot_a_relay_node_starts_no_router(tmp_path: Path) -> None:
    plan_path, plan = boot_world(tmp_path, gateway_here=False)
    out = run_boot(plan_path)
    assert "no gateway on this node" in out and "relay r-a started" in out, out
    ran(plan["relay"])
    assert not os.path.exists(plan["router"] + ".ran")


def test_a_relay_whose_address_never_comes_is_said_and_skipped(tmp_path: Path) -> None:
    plan_path, plan = boot_world(tmp_path, gateway_here=False)
    args = json.loads((Path(plan["run"]) / "relay-r-a.args").read_text())
    (Path(plan["run"]) / "relay-r-a.args").write_text(json.dumps({**args, "listen": "192.0.2.77"}))
    out = run_boot(plan_path)
    assert "relay r-a: 192.0.2.77 is not on this node after 2s: not started" in out, out


def test_install_writes_what_changed_and_enables_the_unit(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\necho \"$@\" >>{tmp_path}/systemctl.log\n")
    (bin_dir / "systemctl").chmod(0o755)
    target = tmp_path / "etc" / "unit.service"
    request = json.dumps({"files": [[str(target), 0o644, "[Unit]\n"]], "unit": "u.service"})
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def install() -> str:
        done = subprocess.run([sys.executable, "-c", BOOT, "install"], input=request, env=env,
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert install() == "installed"
    assert target.read_text() == "[Unit]\n" and (target.stat().st_mode & 0o777) == 0o644
    assert install() == "unchanged"
    calls = (tmp_path / "systemctl.log").read_text().splitlines()
    assert calls == ["daemon-reload", "enable u.service", "enable u.service"]
