"""`launch --persist` (phases/persist.py, the engines' parts, node/boot.py), its removal by
`down` (phases/persist_down.py) and `up --oom-guard` (phases/oomguard.py)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import make_context, make_inventory
from nodescript import run_node_script

from orchestrator.core.step import Change, Unchanged
from orchestrator.engines import get_engine, load_recipe
from orchestrator.errors import SparkctlError
from orchestrator.phases import boot_units, oomguard, persist, persist_down
from orchestrator.phases.container import ContainerSpec
from orchestrator.recipe import LaunchOptions
from orchestrator.remote.fact_records import CommandResult

HOME = {"commands": {"home": {"rc": 0, "out": "/home/nvidia\n"}}}


def persist_spec(recipe: str, **options: Any) -> persist.PersistSpec:
    r = load_recipe(recipe)
    phases = get_engine(r.engine).launch_phases(r, make_inventory(), LaunchOptions(persist=True,
                                                                                   **options))
    assert phases[-1].name == "persist"
    step = phases[-1].steps[1]
    assert isinstance(step, persist.EnableUnit)
    return step.spec


def test_without_persist_no_boot_unit_only_a_stale_one_removed() -> None:
    r = load_recipe("minimax-m2.7")
    phases = get_engine("vllm").launch_phases(r, make_inventory(), LaunchOptions())
    assert [s.name for s in phases[-1].steps] == ["stale-boot-units"]
    # it reads the boot units alone: no docker call for restart policies `down` would read
    inv = make_inventory()
    assert phases[-1].facts(inv, inv.nodes[1]) == {"commands": {"boot_units": boot_units.units_cmd()}}
    args = ContainerSpec(name="c", image="img", command=["x"]).run_args()
    assert "--restart" not in args


def test_a_launch_without_persist_makes_only_its_own_unit_stale() -> None:
    units = {"trt": "trtllm", "vl": "vllm", "sgl": "sglang", "ll": "llamacpp"}
    for server in units:  # every engine runs named servers side by side: never another's unit
        assert persist.stale(server)(units) == [server]
    assert persist.stale("other")(units) == []
    r = load_recipe("minimax-m2.7")
    phase = get_engine("vllm").launch_phases(r, make_inventory(), LaunchOptions(persist=True))[-1]
    assert [type(s) for s in phase.steps] == [persist.ManagedFiles, persist.EnableUnit]


def test_restart_policy_is_in_the_docker_run_argv_before_the_image() -> None:
    args = ContainerSpec(name="c", image="img", command=["x"], restart="unless-stopped").run_args()
    assert args[args.index("--restart") + 1] == "unless-stopped"
    assert args.index("--restart") < args.index("img")


@pytest.mark.parametrize("recipe", ["qwen3-235b", "minimax-m2.7", "qwen3.6-27b-tp2"])
def test_every_engine_gets_the_persist_phase_and_a_boot_plan_per_node(recipe: str) -> None:
    spec = persist_spec(recipe)
    inv = make_inventory()
    assert spec.nodes[0] == inv.head_name and len(spec.nodes) == 2
    head, peer = (persist.boot_plan(spec, inv.node(n), "/home/nvidia/.cache/huggingface")
                  for n in spec.nodes)
    assert head["role"] == "head" and peer["role"] == "peer"
    assert head["health_port"] == spec.recipe.port and peer["health_port"] is None
    assert head["models"][0].startswith("/home/nvidia/.cache/huggingface/hub/models--")
    assert [f["interface"] for f in head["fabric"]] == inv.fabric.interfaces
    if recipe.startswith("qwen3.6"):  # SGLang: docker's restart policy brings the server back,
        # it loads already when the unit runs: a memory check there would race it
        assert head["memory"] is None and peer["memory"] is None and not head["start"]
    else:
        assert head["memory"]["loaded_gb"] > 0 and head["memory"]["guard_gb"] == 2.0


def test_trtllm_head_waits_for_its_peers_then_starts_guard_mpirun_and_record() -> None:
    spec = persist_spec("qwen3-235b")
    inv = make_inventory()
    head = persist.boot_plan(spec, inv.head, "/h")
    peer = persist.boot_plan(spec, inv.node(spec.nodes[1]), "/h")
    assert head["containers"] == ["trtllm-multinode"]
    peer_ip = inv.mpi_address(inv.node(spec.nodes[1]))
    assert [w["what"] for w in head["wait"]] == [
        f"sshd in trtllm-multinode on {spec.nodes[1]} ({peer_ip}:2233)"]
    assert [s["what"].split(" ")[0] for s in head["start"]] == ["memory", "mpirun", "the"]
    assert "trtllm-serve" in head["start"][1]["cmd"] and "docker exec -d" in head["start"][1]["cmd"]
    assert "@SPARKCTL_BOOT_TIME@" in head["start"][2]["cmd"]
    # every part of it in the server's own directory (the guard's, mpirun's, the record's)
    assert all("/run/servers/qwen3-235b" in s["cmd"] for s in head["start"] + peer["start"])
    assert peer["wait"] == [] and [s["what"] for s in peer["start"]] == ["memory guard"]


def test_vllm_and_sglang_containers_get_the_restart_policy_only_with_persist() -> None:
    from orchestrator.engines.sglang.serve import ServeSpec
    from orchestrator.engines.vllm import serve as vllm_serve
    from orchestrator.engines.vllm.ray import ray_spec

    inv = make_inventory()
    vllm = vllm_serve.ServeSpec(load_recipe("minimax-m2.7"), inv, LaunchOptions())
    assert "--restart" in ray_spec(vllm, inv.head, ["rocep1s0f1"], "/h", False,
                                   "unless-stopped").run_args()
    sgl = load_recipe("qwen3.6-27b-tp2")
    for persist_flag, want in ((True, True), (False, False)):
        spec = ServeSpec(sgl, inv, LaunchOptions(persist=persist_flag))
        args = spec.container_spec(inv.head, ["rocep1s0f1", "roceP2p1s0f1"], "/h", False).run_args()
        assert ("--restart" in args) is want


def test_unit_runs_the_boot_script_after_docker_and_the_network_at_boot() -> None:
    text = persist.unit_text("s1", "trtllm", ["a", "b"])
    assert "ExecStart=/usr/bin/python3 /etc/sparkctl/boot/sparkctl-boot.py /etc/sparkctl/boot/s1.json" in text
    assert "After=network-online.target docker.service" in text
    # exec, so the head's wait for its peers never holds the boot (oneshot would)
    assert "WantedBy=multi-user.target" in text and "Type=exec" in text and "oneshot" not in text
    assert boot_units.server_of_unit("/etc/systemd/system/sparkctl-serve-s1.service") == "s1"
    assert boot_units.server_of_unit("/etc/systemd/system/ssh.service") is None


def test_persist_files_go_through_the_ledger_and_the_unit_is_enabled() -> None:
    spec = persist_spec("qwen3-235b")
    inv = make_inventory()
    # a copy per node: the test writes into one node's commands below (HOME stays as it is)
    facts = {n.name: {**copy.deepcopy(HOME), "files": {}} for n in inv.nodes}
    ctx = make_context(inv, inv.head_name, facts)
    files = persist.render(spec)(ctx)
    assert [f.path for f in files] == ["/etc/sparkctl/boot/sparkctl-boot.py",
                                       "/etc/sparkctl/boot/qwen3-235b.json",
                                       "/etc/systemd/system/sparkctl-serve-qwen3-235b.service"]
    assert json.loads(files[1].content)["node"] == inv.head_name
    step = persist.EnableUnit(spec)
    assert isinstance(step.check(ctx), Change)
    facts[inv.head_name]["commands"]["unit_enabled"] = {"rc": 0, "out": "enabled\n"}
    ctx = make_context(inv, inv.head_name, facts)
    assert isinstance(step.check(ctx), Change)  # enabled but not running: its watcher is not
    facts[inv.head_name]["commands"]["unit_enabled"] = {"rc": 0, "out": "enabled active\n"}
    ctx = make_context(inv, inv.head_name, facts)
    assert step.check(ctx) == Unchanged("sparkctl-serve-qwen3-235b.service enabled and watching")
    ctx.shared.changed_steps = [f"{inv.head_name}: persist/boot-files"]  # a new plan: restart
    assert isinstance(step.check(ctx), Change)


def test_status_reads_the_units_and_says_where_the_server_is_persistent() -> None:
    from orchestrator.status.render import persistence_text

    answer = CommandResult(0, "sparkctl-serve-s1.service enabled\nsparkctl-serve-s2.service disabled\n", "")
    units = {"a": boot_units.parse_units(answer), "b": {"s1": True}, "c": {}}
    assert units["a"] == {"s1": True, "s2": False}
    found = boot_units.persistence(units, "s1")
    assert found == {"persistent": True, "unit": "sparkctl-serve-s1.service", "nodes": ["a", "b"]}
    assert persistence_text(found) == "persistent: yes, sparkctl-serve-s1.service enabled on a, b"
    assert boot_units.persistence(units, "s2")["persistent"] is False
    assert persistence_text(boot_units.persistence(units, "s3")).startswith("persistent: no")


def test_down_disables_and_removes_the_units_and_names_the_restart_policies() -> None:
    inv = make_inventory()
    facts = {n.name: {"commands": {
        "boot_units": {"out": "sparkctl-serve-s1.service enabled\n"},
        "restart_policies": {"out": "/trtllm-multinode unless-stopped\n/other no\n"}}}
        for n in inv.nodes}
    ctx = make_context(inv, inv.head_name, facts)
    change = persist_down.RemoveBootUnits().check(ctx)
    assert isinstance(change, Change)
    assert change.summary.startswith("disable and remove sparkctl-serve-s1.service")
    assert "trtllm-multinode (unless-stopped) goes with the containers" in change.summary
    assert "other" not in change.summary
    assert change.payload["files"][-1] == boot_units.BOOT_SCRIPT  # no unit left: the script too
    # launch's marker that the server runs goes too (in /run: it would stay until a reboot)
    assert ("rm -f -- /run/sparkctl/launched-s1; rmdir /run/sparkctl 2>/dev/null"
            in change.commands[0])
    only = persist_down.RemoveBootUnits("s2").check(ctx)
    assert isinstance(only, Unchanged)


def boot_plan_file(tmp_path: Path, **overrides: Any) -> Path:
    model = tmp_path / "models--x"
    model.mkdir()
    (model / "config.json").write_text("{}")
    marker = tmp_path / "started"
    plan = {"server": "s1", "engine": "trtllm", "node": "a", "role": "head", "nodes": ["a", "b"],
            "fabric": [], "containers": [], "models": [str(model)],
            "memory": {"loaded_gb": 0.0, "guard_gb": 0.0},
            "wait": [{"what": "peer b", "cmd": "true"}],
            "start": [{"what": "server", "cmd": f"echo @SPARKCTL_BOOT_TIME@ > {marker}"}],
            "ready": [{"what": "marker", "cmd": f"test -s {marker}"}], "health_port": None,
            "deadline_seconds": 5, "log": str(tmp_path / "log" / "boot-s1.log")}
    plan.update(overrides)
    path = tmp_path / "s1.json"
    path.write_text(json.dumps(plan))
    return path


def test_boot_script_checks_in_order_then_starts_and_logs(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    ran = run_node_script("boot.py", [str(boot_plan_file(tmp_path))], monkeypatch)
    assert ran.code == 0, ran.stdout
    steps = [line.split(" ", 2)[2] for line in ran.stdout.splitlines()]
    assert [s.split(":")[0] for s in steps] == ["boot of server s1 (trtllm) on a, head of a, b",
                                                "containers running", "models present", "memory",
                                                "ready", "started", "up"]
    assert "@" not in (tmp_path / "started").read_text()  # the boot time went in
    assert (tmp_path / "log" / "boot-s1.log").read_text().splitlines() == ran.stdout.splitlines()


def test_boot_script_refuses_without_the_model_or_the_memory(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    plan = boot_plan_file(tmp_path, models=[str(tmp_path / "absent")])
    ran = run_node_script("boot.py", [str(plan)], monkeypatch)
    assert ran.code == 1 and "FAILED: models missing on this node" in ran.stdout
    (tmp_path / "models--x" / "config.json").unlink()
    (tmp_path / "models--x").rmdir()
    plan = boot_plan_file(tmp_path, memory={"loaded_gb": 1e6, "guard_gb": 2.0})
    ran = run_node_script("boot.py", [str(plan)], monkeypatch)
    assert ran.code == 1 and re.search(r"FAILED: memory: MemAvailable [\d.]+ GB < 1000002.0 GB",
                                       ran.stdout)
    assert "started" not in ran.stdout


def test_oom_guard_acts_below_the_memory_guard_and_spares_sshd_dockerd_and_the_guard() -> None:
    from orchestrator.phases.memory import GUARD_DEFAULT_GB

    text = oomguard.defaults_text()
    args = re.search(r'^EARLYOOM_ARGS="(.*)"$', text, re.M)
    assert args is not None
    words = args.group(1).split()  # as systemd splits $EARLYOOM_ARGS
    term, kill = (int(v) for v in words[words.index("-M") + 1].split(","))
    guard_kib = GUARD_DEFAULT_GB * 1024 * 1024
    assert kill < term < guard_kib
    assert words[words.index("-s") + 1] == "100,100"
    avoid = re.compile(words[words.index("--avoid") + 1])
    for name in ("sshd", "dockerd", "containerd", "systemd", "earlyoom", oomguard.GUARD_COMM):
        assert avoid.search(name), name
    for name in ("python3", "trtllm-serve", "vllm", "sshd-session-x"):
        assert not avoid.search(name), name
    assert not set("'\"*?[ ") & set(oomguard.AVOID)  # same regex for systemd and /bin/sh


def test_the_memory_guard_names_itself_as_earlyoom_spares_it() -> None:
    source = (Path(persist.__file__).parents[1] / "node" / "memguard.py").read_text()
    assert f'COMM = "{oomguard.GUARD_COMM}"' in source
    assert len(oomguard.GUARD_COMM) <= 15  # /proc/PID/comm keeps 15 characters


def test_down_removes_earlyoom_only_when_sparkctl_installed_it() -> None:
    inv = make_inventory()

    def ctx_with(files: dict[str, Any]) -> Any:
        return make_context(inv, inv.head_name, {n.name: {"files": files} for n in inv.nodes})

    assert isinstance(oomguard.Remove().check(ctx_with({})), Unchanged)
    marker = {"exists": True, "sha256": "x"}
    change = oomguard.Remove().check(ctx_with({oomguard.MARKER: marker}))
    assert isinstance(change, Change) and change.commands == (oomguard.remove_cmd(True, False),)
    assert "remove the earlyoom package" in change.summary
    assert "apt-get remove -y -q earlyoom" in change.commands[0]
    change = oomguard.Remove().check(ctx_with({oomguard.ENABLED: marker}))
    assert isinstance(change, Change) and "package was there before: kept" in change.summary
    assert "apt-get remove" not in change.commands[0] and "disable --now" in change.commands[0]


def test_the_oom_guard_steps_list_the_commands_their_apply_runs(fake_cluster: Any) -> None:
    absent = {"earlyoom": {"rc": 0, "out": "absent\ndisabled\ninactive\n"}}
    cluster = fake_cluster(facts={"spark-a": {"files": {}, "commands": absent}})
    head = cluster["spark-a"].on("ledger", stdout=json.dumps({"written": []}))
    ctx = cluster.context("spark-a")
    for step, command in ((oomguard.Install(), oomguard.INSTALL),
                          (oomguard.Configure(), "systemctl try-restart earlyoom"),
                          (oomguard.Enable(), "systemctl enable --now earlyoom")):
        change = step.check(ctx)
        assert isinstance(change, Change) and change.commands == (command,)
        step.apply(ctx, change)
        assert command in head.commands[-2:]  # (and its marker or config, written on stdin)
    assert len(head.commands) == 6 and all(c.sudo for c in head.calls)
    head.on("systemctl enable", status=1, stderr="Failed to enable unit")
    with pytest.raises(SparkctlError, match=r"spark-a: `systemctl enable --now earlyoom` failed "
                                            r"\(exit 1\): Failed to enable unit"):
        oomguard.Enable().apply(ctx, oomguard.Enable().check(ctx))


def test_boot_script_skips_the_memory_check_where_the_server_came_back_by_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = boot_plan_file(tmp_path, memory=None, start=[],
                          ready=[{"what": "container", "cmd": "true"}])
    ran = run_node_script("boot.py", [str(plan)], monkeypatch)
    assert ran.code == 0, ran.stdout
    assert "memory: not checked here (this node's server came back with its container)" in ran.stdout


def test_a_launch_removing_the_last_stale_unit_removes_the_boot_script_too() -> None:
    inv = make_inventory()

    def stale_check(lines: str, persistent: bool) -> Any:
        facts = {inv.head_name: {"commands": {"boot_units": {"rc": 0, "out": lines}}}}
        step = persist_down.RemoveBootUnits(select=persist.stale("mine"))
        return step.check(make_context(inv, inv.head_name, facts))

    only_mine = "sparkctl-serve-mine.service enabled vllm\n"
    change = stale_check(only_mine, persistent=False)
    assert isinstance(change, Change) and change.payload["files"][-1] == boot_units.BOOT_SCRIPT
    both = only_mine + "sparkctl-serve-other.service enabled sglang\n"
    change = stale_check(both, persistent=False)
    assert isinstance(change, Change) and boot_units.BOOT_SCRIPT not in change.payload["files"]


def test_the_first_node_watches_and_restarts_a_server_a_lone_reboot_left_stalled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 27: a worker rebooted alone came back, and the head's server stayed stalled (a Ray
    worker died); nothing restarted it. The head's unit stays and does, after 3 silent checks;
    a server the memory guard stopped is left stopped."""
    guard = tmp_path / "memguard-stopped.json"
    restarted = tmp_path / "restarted"
    plan_path = boot_plan_file(
        tmp_path, health_port=1, ready=[], watch=True, guard_record=str(guard),
        restart=[{"what": "stop the stalled server", "cmd": f"touch {restarted} {guard}"}])
    plan = json.loads(plan_path.read_text())
    (tmp_path / "x").mkdir()  # a first, plain run: the script's functions, to drive watch()
    ns = run_node_script("boot.py", [str(boot_plan_file(tmp_path / "x"))], monkeypatch).namespace
    answers = iter([503, 0, 503, 200, 503, 503, 503])  # stalled, restarted and up, stalled again
    ns["health"] = lambda port: next(answers)
    ns["PLAN"] = plan
    assert ns["watch"](plan, every=0) == 0
    out = capsys.readouterr().out
    lines = [line.split(" ", 2)[2] for line in out.splitlines()]
    assert lines[0] == "watching: the server's answer every 0s"
    assert lines[1] == "server s1 has not answered for 3 checks (0s): restarting this node's part"
    assert lines[2] == "stop the stalled server: ok" and restarted.exists()
    assert "started: server" in lines and "up: server s1 answers on 127.0.0.1:1" in lines
    assert lines[-1] == (f"server s1 stopped by the memory guard ({guard}): not restarted; "
                         "stopped watching")


def test_a_peers_boot_log_says_only_what_it_achieved(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    plan = boot_plan_file(tmp_path, role="peer", node="b")
    ran = run_node_script("boot.py", [str(plan)], monkeypatch)
    assert ran.code == 0, ran.stdout
    assert ran.stdout.splitlines()[-1].split(" ", 2)[2] == (
        "up: this node's part of server s1 (marker); whether the server answers is for a to say "
        "(its boot log, `sparkctl status`)")


def test_a_unit_launch_started_only_watches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "launched-s1"
    marker.write_text("")
    ran = run_node_script("boot.py", [str(boot_plan_file(tmp_path, launch_marker=str(marker)))],
                          monkeypatch)
    assert ran.code == 0 and not marker.exists()
    assert "started by `sparkctl launch`, which started the server: nothing to bring up" in ran.stdout
    assert "started: server" not in ran.stdout
