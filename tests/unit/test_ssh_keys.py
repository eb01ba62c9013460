"""ssh-keys and ssh-trust phases: faked facts in, changes, files and commands out."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.step import Change, Unchanged
from orchestrator.phases import ssh_keys
from orchestrator.phases.ssh_keys import (
    CLUSTER_KEY,
    HOST_KEY,
    HOST_PUB,
    ClusterKey,
    HostKey,
    generate_cluster_key,
    public_from_private,
    trust_files,
)
from orchestrator.remote.fact_records import FileInfo
from orchestrator.render import sha256

PRIVATE_SHA = "aa" * 32
HOST_KEYS = {
    "spark-a": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyOfSparkA0000000000000000000000000000",
    "spark-b": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyOfSparkB0000000000000000000000000000",
}
CLUSTER_PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIClusterKey000000000000000000000000000000000"


def key_facts(host: bool = True, host_pub: bool = True, cluster_sha: str | None = PRIVATE_SHA,
              name: str = "spark-a") -> dict:
    files: dict = {
        HOST_KEY: {"exists": host, "mode": 0o600},
        HOST_PUB: {"exists": host_pub, "mode": 0o644, "content": HOST_KEYS[name] + " c\n"}
        if host_pub else {"exists": False},
        CLUSTER_KEY: {"exists": cluster_sha is not None, "mode": 0o600, "sha256": cluster_sha},
        ssh_keys.CLUSTER_PUB: {"exists": True, "mode": 0o644, "content": CLUSTER_PUB + " x\n"},
    }
    if cluster_sha is None:
        files[CLUSTER_KEY] = {"exists": False}
        files[ssh_keys.CLUSTER_PUB] = {"exists": False}
    return {"hostname": name, "files": files}


def test_host_key_generated_when_missing(inventory: Any, context: Any, fake_transport: Any) -> None:
    inv = inventory()
    ctx = context(inv, "spark-a", {"spark-a": key_facts(host=False, host_pub=False)})
    outcome = HostKey().check(ctx)
    assert isinstance(outcome, Change) and outcome.commands == (ssh_keys.host_key_cmd("spark-a", False),)
    transport = fake_transport("spark-a", [(0, HOST_KEYS["spark-a"] + " c\n", "")])
    ctx = context(inv, "spark-a", {"spark-a": key_facts(host=False, host_pub=False)},
                  transports={"spark-a": transport})
    HostKey().apply(ctx, outcome)
    command = transport.calls[0]["command"]
    assert "ssh-keygen -q -t ed25519 -N '' -C sparkctl-container@spark-a" in command
    assert transport.calls[0]["sudo"] is True
    assert ctx.shared.host_keys["spark-a"] == HOST_KEYS["spark-a"]


def test_host_key_kept_when_only_pub_missing(inventory: Any, context: Any) -> None:
    ctx = context(inventory(), "spark-a", {"spark-a": key_facts(host_pub=False)})
    outcome = HostKey().check(ctx)
    command = ssh_keys.host_key_cmd("spark-a", keep_private=True)
    assert isinstance(outcome, Change) and outcome.commands == (command,)
    assert "ssh-keygen -y -f" in command and "rm -f" not in command


def test_host_key_present_is_unchanged_with_fingerprint(inventory: Any, context: Any) -> None:
    outcome = HostKey().check(context(inventory(), "spark-a", {"spark-a": key_facts()}))
    assert isinstance(outcome, Unchanged) and "SHA256:" in outcome.reason


def test_cluster_key_generated_when_head_has_none(inventory: Any, context: Any) -> None:
    facts = {"spark-a": key_facts(cluster_sha=None), "spark-b": key_facts(name="spark-b")}
    outcome = ClusterKey().check(context(inventory(), "spark-a", facts))
    assert isinstance(outcome, Change)
    assert outcome.payload == {"generate": True, "targets": ["spark-a", "spark-b"]}


def test_cluster_key_copied_only_where_it_differs(inventory: Any, context: Any) -> None:
    facts = {"spark-a": key_facts(), "spark-b": key_facts(name="spark-b", cluster_sha="bb" * 32)}
    outcome = ClusterKey().check(context(inventory(), "spark-a", facts))
    assert isinstance(outcome, Change) and outcome.payload["targets"] == ["spark-b"]
    same = {"spark-a": key_facts(), "spark-b": key_facts(name="spark-b")}
    assert isinstance(ClusterKey().check(context(inventory(), "spark-a", same)), Unchanged)


def test_cluster_key_travels_on_stdin_only(inventory: Any, context: Any, fake_transport: Any) -> None:
    inv = inventory()
    facts = {"spark-a": key_facts(cluster_sha=None), "spark-b": key_facts(name="spark-b")}
    transports = {"spark-a": fake_transport("spark-a"), "spark-b": fake_transport("spark-b")}
    ctx = context(inv, "spark-a", facts, transports=transports)
    message = ClusterKey().apply(ctx, ClusterKey().check(ctx))  # type: ignore[arg-type]
    assert message == "cluster key installed on spark-a, spark-b"
    payloads = [json.loads(t.calls[0]["stdin"]) for t in transports.values()]
    assert payloads[0] == payloads[1]
    private = payloads[0][0]
    assert private["path"] == CLUSTER_KEY and private["mode"] == "600"
    assert private["content"].startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    for transport in transports.values():
        call = transport.calls[0]
        assert "PRIVATE KEY" not in call["command"] and "secret" in call["display"]
    assert ctx.shared.cluster_public_key == " ".join(payloads[0][1]["content"].split()[:2])


def test_generated_key_pair_matches() -> None:
    private, public = generate_cluster_key("c")
    assert str(private) == "***"
    assert public_from_private(private, "c") == public


@pytest.fixture
def trust_context(inventory: Any, context: Any) -> Any:
    def trust_context_(**container: object) -> Any:
        inv = inventory(**container)
        facts = {name: {"hostname": name, "files": {
            HOST_PUB: {"exists": True, "content": HOST_KEYS[name] + "\n"},
            ssh_keys.CLUSTER_PUB: {"exists": True, "content": CLUSTER_PUB + " sparkctl\n"},
        }} for name in ("spark-a", "spark-b")}
        return context(inv, "spark-a", facts)
    return trust_context_


def test_trust_files_match_golden(golden: Any, trust_context: Any) -> None:
    for spec in trust_files(trust_context()):
        name = Path(spec.path).name
        golden(f"spark-a.{name}", spec.content)
        assert spec.mode == (0o755 if name == "entrypoint.sh" else 0o644)


def test_no_host_key_checking_is_ever_turned_off(trust_context: Any) -> None:
    text = "\n".join(spec.content for spec in trust_files(trust_context())).lower()
    assert "stricthostkeychecking yes" in text
    assert "stricthostkeychecking no" not in text
    assert "knownhostsfile /dev/null" not in text
    assert "curl" not in text


def test_ssh_port_change_touches_only_what_depends_on_it(trust_context: Any) -> None:
    before = {s.path: sha256(s.content) for s in trust_files(trust_context())}
    after = {s.path: sha256(s.content) for s in trust_files(trust_context(ssh_port=2234))}
    changed = sorted(Path(p).name for p in before if before[p] != after[p])
    assert changed == ["known_hosts", "ssh_config", "sshd_config"]


def test_trust_files_refuse_to_write_without_keys(trust_context: Any) -> None:
    ctx = trust_context()
    peer = ctx.cluster_facts["spark-b"]
    ctx.cluster_facts["spark-b"] = replace(peer, files={**peer.files, HOST_PUB: FileInfo(exists=False)})
    step = ssh_keys.TrustFiles("files", trust_files)
    outcome = step.check(ctx)
    assert isinstance(outcome, Change) and ssh_keys.PENDING_KEY in outcome.diff
    with pytest.raises(ssh_keys.SparkctlError, match="host key or the cluster key is missing"):
        step.apply(ctx, outcome)
