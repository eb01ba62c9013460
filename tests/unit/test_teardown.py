"""`sparkctl down`'s plan: faked facts in, changes and remote commands out."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import node_facts

from orchestrator.core.executor import Executor
from orchestrator.core.progress import Progress
from orchestrator.core.report import Report
from orchestrator.core.step import Change, NodeContext, RunOptions, RunState, Unchanged
from orchestrator.engines.serverctl import down_parts
from orchestrator.errors import SparkctlError
from orchestrator.inventory_checks import inventory_from_data
from orchestrator.phases import teardown
from orchestrator.phases.oomguard import ENABLED
from orchestrator.remote.gathered import NodeFacts
from orchestrator.render import MANAGED_HEADER, sha256

INVENTORY = inventory_from_data(
    {
        "cluster": {"name": "two-sparks", "ssh_key": "/k"},
        "fabric": {"interfaces": ["enp1s0f1np1", "enP2p1s0f1np1"]},
        "nodes": [
            {"name": "spark-a", "host": "a",
             "addresses": {"enp1s0f1np1": "192.168.200.12/24", "enP2p1s0f1np1": "192.168.201.12/24"}},
            {"name": "spark-b", "host": "b",
             "addresses": {"enp1s0f1np1": "192.168.200.13/24", "enP2p1s0f1np1": "192.168.201.13/24"}},
        ],
    },
    "inv.yml",
)
OURS = {"Config": {"Labels": {"sparkctl.managed": "true", "sparkctl.cluster": "two-sparks"}},
        "State": {"Running": True, "Status": "running"}}
FOREIGN = {"Config": {"Labels": {}}, "State": {"Running": True}}


def cmd(out: str = "", rc: int = 0) -> dict[str, Any]:
    return {"rc": rc, "out": out, "err": ""}


def up_facts(node: str = "spark-a", netplan_content: str | None = None) -> dict[str, Any]:
    """A node as `up` + `launch` leave it."""
    suffix = "12" if node == "spark-a" else "13"
    content = netplan_content if netplan_content is not None else f"{MANAGED_HEADER}\nnetwork: {{}}\n"
    ledger = {teardown.NETPLAN_FILE: {"sha256": sha256(f"{MANAGED_HEADER}\nnetwork: {{}}\n"),
                                      "before": {"kind": "absent"}}}
    return {
        "files": {teardown.NETPLAN_FILE: {"exists": True, "content": content, "sha256": sha256(content)},
                  teardown.LEDGER: {"exists": True, "content": json.dumps(ledger)},
                  teardown.CONFIG_DIR: {"exists": True}, teardown.STATE_DIR: {"exists": True},
                  ENABLED: {"exists": True}},
        "netplan": {teardown.NETPLAN_FILE: {"interfaces": ["enp1s0f1np1", "enP2p1s0f1np1"]},
                    "/etc/netplan/50-cloud-init.yaml": {"interfaces": ["eth0"]}},
        "links": {"enp1s0f1np1": {"addresses": [f"192.168.200.{suffix}/24"]},
                  "enP2p1s0f1np1": {"addresses": [f"192.168.201.{suffix}/24"]},
                  "eth0": {"addresses": ["10.0.0.1/24"]}},
        "containers": {"trtllm-multinode": OURS},
        "commands": {
            "managed": cmd("abc123\ttrtllm-multinode\trunning\n"),
            "gateway_relays": cmd("4242\n"),  # a gateway relay (issue 29)
            "gateway_router_trees": cmd("/opt/sparkctl/sglang-router-0.3.2\n"),  # and its router
            "state_entries": cmd("lock\nrun\nnetplan-backup.yaml\n"),
            "pid_files": cmd("mpirun.pid\nrank-0.pid\n"),
            "port_guards": cmd('{"chains": ["sparkctl-ray-minimax-m2.7"]}'),
            # launch --persist and up --oom-guard were run too
            "boot_units": cmd("sparkctl-serve-qwen3-235b.service enabled\n"),
            "restart_policies": cmd("/trtllm-multinode unless-stopped\n"),
            "boot_logs": cmd("/var/log/sparkctl/boot-qwen3-235b.log\n"),
        },
    }


def clean_facts() -> dict[str, Any]:
    return {
        "files": {teardown.NETPLAN_FILE: {"exists": False}, teardown.CONFIG_DIR: {"exists": False},
                  teardown.STATE_DIR: {"exists": False}},
        "netplan": {"/etc/netplan/50-cloud-init.yaml": {"interfaces": ["eth0"]}},
        "links": {"enp1s0f1np1": {"addresses": []}, "enP2p1s0f1np1": {"addresses": []}},
        "containers": {"trtllm-multinode": None},
        "commands": {"managed": cmd(), "state_entries": cmd(), "pid_files": cmd(),
                     "port_guards": cmd('{"chains": []}')},
    }


def ctx_for(facts: dict[str, Any], node: str = "spark-a") -> NodeContext:
    parsed = node_facts(facts, node)
    return NodeContext(INVENTORY, INVENTORY.node(node), parsed, {node: parsed}, None, RunOptions("down"),
                       RunState())


def test_every_step_changes_a_node_that_was_set_up() -> None:
    ctx = ctx_for(up_facts())
    phase = teardown.down_phase(INVENTORY, True, down_parts())
    outcomes = {s.name: s.check(ctx) for s in phase.steps if s.kind == "change"}
    assert all(isinstance(o, Change) for o in outcomes.values()), outcomes
    assert "mpirun.pid" in outcomes["stop-server"].summary
    assert outcomes["containers"].commands == (teardown.remove_containers_cmd(["abc123"]),)
    assert "sparkctl-serve-qwen3-235b.service" in outcomes["boot-units"].summary
    assert "trtllm-multinode (unless-stopped)" in outcomes["boot-units"].summary
    assert "stop and disable earlyoom" in outcomes["oom-guard"].summary
    undo = outcomes["network"].payload
    assert undo.remove_file
    from orchestrator.core import diffs

    found = diffs.step_diffs([("spark-a", [("down/network", outcomes["network"].diff)])])
    (line,) = diffs.summary_lines(found)
    assert line.startswith(f"{teardown.NETPLAN_FILE}: removed (") and line.endswith("on spark-a"), line
    assert undo.addresses == [("enP2p1s0f1np1", "192.168.201.12/24"), ("enp1s0f1np1", "192.168.200.12/24")]
    assert "netplan-backup.yaml" in outcomes["files"].summary and "lock" not in outcomes["files"].summary


def test_a_clean_node_needs_nothing_so_down_twice_is_fine() -> None:
    ctx = ctx_for(clean_facts())
    for step in teardown.down_phase(INVENTORY, True, down_parts()).steps:
        if step.kind == "change":
            assert isinstance(step.check(ctx), Unchanged), step.name


def test_without_network_the_plan_has_no_network_step() -> None:
    names = [s.name for s in teardown.down_phase(INVENTORY, False, down_parts()).steps]
    assert names == ["boot-units", "stop-server", "containers", "port-guards", "gateway-relays",
                     "gateway-router", "oom-guard",
                     "files", "boot-logs", "verify"]
    assert teardown.build_down_plan(INVENTORY, False, down_parts()).phases[0].name == "down"


def test_a_foreign_container_with_our_name_is_left_alone() -> None:
    facts = clean_facts()
    facts["containers"]["trtllm-multinode"] = FOREIGN
    outcome = teardown.RemoveContainers().check(ctx_for(facts))
    assert isinstance(outcome, Unchanged)
    assert "left alone" in outcome.reason


def test_the_list_of_containers_is_filtered_by_our_labels() -> None:
    command = teardown.managed_ps_cmd(INVENTORY)
    assert "label=sparkctl.managed=true" in command
    assert "label=sparkctl.cluster=two-sparks" in command


def test_a_netplan_file_sparkctl_did_not_write_is_left_alone_with_its_addresses() -> None:
    facts = up_facts(netplan_content="network: {ethernets: {enp1s0f1np1: {}}}\n")
    outcome = teardown.RemoveNetwork().check(ctx_for(facts))
    assert isinstance(outcome, Unchanged)
    assert "changed since sparkctl wrote it" in outcome.reason


def test_issue_20_a_users_file_at_our_path_after_a_rollback_is_never_removed() -> None:
    """The rolled-back `up` left no ledger entry (or a stale one); the user then wrote a file
    at sparkctl's own path, even one carrying our header: down --network must keep it."""
    users = f"{MANAGED_HEADER}\n# my own edit\nnetwork: {{}}\n"
    for ledger in ({}, {teardown.NETPLAN_FILE: {"sha256": "0" * 64, "before": {"kind": "absent"}}}):
        facts = up_facts(netplan_content=users)
        facts["files"][teardown.LEDGER] = {"exists": True, "content": json.dumps(ledger)}
        ctx = ctx_for(facts)
        outcome = teardown.RemoveNetwork().check(ctx)
        assert isinstance(outcome, Unchanged), outcome
        assert "left alone" in outcome.reason
        # also a note of the report (stdout, even piped): what down did NOT do
        (note,) = ctx.shared.notes
        assert note.startswith(f"spark-a: left alone: {teardown.NETPLAN_FILE} was "), note


def test_addresses_another_netplan_file_configures_are_kept() -> None:
    facts = up_facts()
    facts["files"][teardown.NETPLAN_FILE] = {"exists": False}
    facts["netplan"] = {"/etc/netplan/30-mine.yaml": {"interfaces": ["enp1s0f1np1"]}}
    outcome = teardown.RemoveNetwork().check(ctx_for(facts))
    assert isinstance(outcome, Change)
    assert outcome.payload.addresses == [("enP2p1s0f1np1", "192.168.201.12/24")]
    assert "another netplan file configures enp1s0f1np1" in outcome.summary


def test_network_command_removes_file_applies_then_deletes_addresses() -> None:
    command = teardown.remove_network_cmd(
        teardown.NetworkUndo(True, False, [("enp1s0f1np1", "192.168.200.12/24")]))
    assert command.index(" undo") < command.index("netplan apply")
    assert command.index("netplan apply") < command.index("ip addr del 192.168.200.12/24 dev enp1s0f1np1")
    assert "eth0" not in command


def test_files_command_keeps_the_held_lock() -> None:
    command = teardown.remove_files_cmd(["lock"])
    assert "purge /etc/sparkctl" in command
    assert "! -name lock" in command


def test_server_not_stopped_when_its_container_is_gone() -> None:
    facts = up_facts()
    facts["containers"]["trtllm-multinode"] = None
    assert isinstance(teardown.StopServer(down_parts()).check(ctx_for(facts)), Unchanged)


@pytest.fixture
def node(fake_transport: Any) -> Any:
    """A node as up + launch leave it; `stop` answers that the server stopped."""
    def node_(name: str, facts: dict[str, Any], journal: list[tuple[str, str]]) -> Any:
        return (fake_transport(name, facts=facts, journal=journal)
                .on(r"action.*stop", answer={"stopped": ["mpirun.pid"], "left": []})
                .on(r"remove '\{\"all\": true\}'", answer={"removed": ["sparkctl-ray-minimax-m2.7"]}))
    return node_


def test_an_unreachable_node_does_not_stop_the_others_cleaning(node: Any) -> None:
    journal: list[tuple[str, str]] = []
    report = Report("down")
    report.host("spark-a")
    report.fail_host("spark-b", "cannot reach b:22")
    executor = Executor(INVENTORY, {"spark-a": node("spark-a", up_facts(), journal)},
                        RunOptions("down"), report, Progress(quiet=True))
    executor.run(teardown.build_down_plan(INVENTORY, True, down_parts()))
    statuses = {s.step: s.status for s in report.hosts["spark-a"].steps}
    assert statuses == {"boot-units": "changed", "stop-server": "changed", "containers": "changed",
                        "port-guards": "changed", "gateway-relays": "changed",
                        "gateway-router": "changed", "network": "changed",
                        "oom-guard": "changed",
                        "files": "changed", "boot-logs": "changed",
                        "verify": "ok"}, report.to_json()
    assert not report.ok and report.exit_code == 1
    assert not any(name == "spark-b" for name, _ in journal)
    removals = [line for _, line in journal if "docker rm -f abc123" in line]
    assert removals, journal


def test_dry_run_changes_nothing(node: Any) -> None:
    journal: list[tuple[str, str]] = []
    report = Report("down")
    transports = {n: node(n, up_facts(n), journal) for n in ("spark-a", "spark-b")}
    for name in transports:
        report.host(name)
    Executor(INVENTORY, transports, RunOptions("down", dry_run=True), report, Progress(quiet=True)).run(
        teardown.build_down_plan(INVENTORY, True, down_parts()))
    assert all(line.startswith("python3 - ") for _, line in journal), journal
    assert report.count("planned") == 20  # 10 changes on each of the 2 nodes


def test_verify_reports_leftovers(fake_transport: Any) -> None:
    leftover = fake_transport("spark-a").on("", 0, "container: trtllm-multinode\n")
    ctx = NodeContext(INVENTORY, INVENTORY.node("spark-a"), NodeFacts("spark-a"), {}, leftover,
                      RunOptions("down"), RunState())
    try:
        teardown.VerifyDown(network=False).apply(ctx, Change("verify"))
    except Exception as exc:
        assert "still present after down: container: trtllm-multinode" in str(exc)
    else:
        raise AssertionError("verify accepted a leftover container")



def test_a_users_file_that_up_replaced_is_restored() -> None:
    facts = up_facts()
    ledger = json.loads(facts["files"][teardown.LEDGER]["content"])
    ledger[teardown.NETPLAN_FILE]["before"] = {"kind": "file", "copy": "/x", "sha256": "y"}
    facts["files"][teardown.LEDGER]["content"] = json.dumps(ledger)
    outcome = teardown.RemoveNetwork().check(ctx_for(facts))
    assert isinstance(outcome, Change)
    assert outcome.payload.restore is True and "restore the" in outcome.summary
    command = teardown.remove_network_cmd(outcome.payload)
    assert " undo" in command
    assert "ip addr del" not in command


def test_without_network_the_ledger_stays_for_a_later_down_network() -> None:
    facts = up_facts()
    facts["commands"]["state_entries"] = cmd("lock\nrun\nledger.json\noriginals\n")
    outcome = teardown.RemoveFiles(network=False).check(ctx_for(facts))
    assert isinstance(outcome, Change)
    assert "ledger.json" not in outcome.summary
    assert outcome.commands == (teardown.remove_files_cmd(
        ["ledger.json", "lock", "lock-generation", "originals"]),)
    outcome = teardown.RemoveFiles(network=True).check(ctx_for(facts))
    assert "ledger.json" in outcome.summary


def test_down_removes_the_boot_logs_unless_asked_to_keep_them(fake_transport: Any) -> None:
    """Issue 27: down left /var/log/sparkctl/boot-<server>.log while verify said "nothing left"."""
    from orchestrator.phases.persist_down import RemoveBootLogs

    ctx = ctx_for(up_facts())
    removed = RemoveBootLogs().check(ctx)
    assert isinstance(removed, Change)
    assert removed.commands == ("rm -f -- /var/log/sparkctl/boot-qwen3-235b.log && "
                                "{ rmdir /var/log/sparkctl 2>/dev/null || true; }",)
    kept = RemoveBootLogs(keep=True).check(ctx)
    assert isinstance(kept, Unchanged)
    assert kept.reason == "left alone (--keep-logs): /var/log/sparkctl/boot-qwen3-235b.log"
    # down --server NAME: only that server's log
    assert isinstance(RemoveBootLogs("other").check(ctx), Unchanged)
    assert isinstance(RemoveBootLogs("qwen3-235b").check(ctx), Change)
    # the verify step looks for them (unless kept) and says exactly what it kept
    assert "boot log: " in teardown.verify_cmd(INVENTORY, False)
    assert "boot log: " not in teardown.verify_cmd(INVENTORY, False, keep_logs=True)
    clean = fake_transport("spark-a").on("", 0, "")
    vctx = NodeContext(INVENTORY, INVENTORY.node("spark-a"), NodeFacts("spark-a"), {}, clean,
                       RunOptions("down"), RunState())
    said = teardown.VerifyDown(network=False).apply(vctx, Change("verify"))
    assert said == "nothing else left; kept: the Hugging Face cache, the fabric network (--network)"
    said = teardown.VerifyDown(network=True, keep_logs=True).apply(vctx, Change("verify"))
    assert said == "nothing else left; kept: the Hugging Face cache, the boot logs (--keep-logs)"
    left = fake_transport("spark-a").on("", 0, "boot log: /var/log/sparkctl/boot-x.log\n")
    lctx = NodeContext(INVENTORY, INVENTORY.node("spark-a"), NodeFacts("spark-a"), {}, left,
                       RunOptions("down"), RunState())
    with pytest.raises(SparkctlError, match=r"after down: boot log: /var/log/sparkctl/boot-x\.log"):
        teardown.VerifyDown(network=False).apply(lctx, Change("verify"))
