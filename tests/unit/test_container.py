"""container phase: faked facts in, docker argv, changes and errors out."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.core.step import Change, Unchanged
from orchestrator.engines.trtllm import container as c
from orchestrator.errors import SparkctlError
from orchestrator.phases import container as shared
from orchestrator.phases import container_image as images

IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc13"
REPO = IMAGE.rsplit(":", 1)[0]
IBDEV = {
    "enp1s0f1np1": {"device": "rocep1s0f1", "state": "Up"},
    "enP2p1s0f1np1": {"device": "roceP2p1s0f1", "state": "Up"},
}


def node_facts(name: str = "spark-a", running: dict[str, Any] | None = None,
               digest: str = "sha256:" + "1" * 64, pulled: bool = True) -> dict[str, Any]:
    return {
        "hostname": name,
        "images": {IMAGE: {"Id": "sha256:" + "9" * 64, "RepoDigests": [f"{REPO}@{digest}"]}
                   if pulled else None},
        "containers": {"trtllm-multinode": running},
        "files": {c.INFINIBAND: {"exists": False}},
        "ibdev2netdev": {"rc": 0, "devices": IBDEV},
        "commands": {"home": {"rc": 0, "out": "/home/nvidia\n", "err": ""}},
    }


@pytest.fixture
def wanted(context: Any) -> Any:
    def wanted_(inv: Any, name: str = "spark-a") -> tuple[list[str], str]:
        ctx = context(inv, name, {name: node_facts(name)})
        return c.Container(c.node_trtllm_spec).wanted(ctx)  # type: ignore[no-any-return]
    return wanted_


def running_container(args: list[str], digest: str, running: bool = True,
                      managed: bool = True) -> dict[str, Any]:
    labels = {"sparkctl.managed": "true", shared.HASH_LABEL: digest} if managed else {}
    env = [args[i + 1] for i, a in enumerate(args) if a == "-e"]
    return {
        "Name": "/trtllm-multinode", "Image": "sha256:" + "9" * 64,
        "Config": {"Image": IMAGE, "Env": ["PATH=/usr/bin", *env], "Labels": labels},
        "HostConfig": {"Binds": [args[i + 1] for i, a in enumerate(args) if a == "-v"]},
        "State": {"Running": running, "Status": "running" if running else "exited",
                  "ExitCode": 0 if running else 255, "StartedAt": "2026-01-01T00:00:00Z"},
    }


def test_run_argv_matches_golden(inventory: Any, golden: Any, wanted: Any) -> None:
    args, digest = wanted(inventory())
    golden("docker-run.spark-a.txt", "\n".join(shared.with_hash(args, digest)) + "\n")
    assert "--rm" not in args
    assert args[-3:] == [IMAGE, "bash", "/etc/sparkctl/entrypoint.sh"]


def test_fabric_env_follows_the_inventory(inventory: Any) -> None:
    inv = inventory()
    env = c.fabric_env(inv, ["rocep1s0f1", "roceP2p1s0f1"])
    assert env["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1,enP2p1s0f1np1"
    assert env["UCX_NET_DEVICES"] == env["OMPI_MCA_btl_tcp_if_include"] == env["NCCL_SOCKET_IFNAME"]
    assert env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
    one = inventory_with_interfaces(["enp1s0f1np1"])
    assert c.fabric_env(one, ["rocep1s0f1"])["OMPI_MCA_oob_tcp_if_include"] == "enp1s0f1np1"


def inventory_with_interfaces(interfaces: list[str]) -> Any:
    from orchestrator.inventory_checks import inventory_from_data

    return inventory_from_data({"cluster": {"name": "c", "ssh_key": "/k"},
                                "fabric": {"interfaces": interfaces},
                                "nodes": [{"name": "spark-a", "host": "a"},
                                          {"name": "spark-b", "host": "b"}]}, "inv.yml")


def test_missing_roce_device_is_a_clear_error(inventory: Any, context: Any) -> None:
    facts = node_facts()
    facts["ibdev2netdev"] = {"rc": 0, "devices": {}}
    with pytest.raises(SparkctlError, match="ibdev2netdev shows no RoCE device for enp1s0f1np1"):
        c.Container(c.node_trtllm_spec).check(context(inventory(), "spark-a", {"spark-a": facts}))


def test_infiniband_device_passed_only_when_present(inventory: Any, context: Any, wanted: Any) -> None:
    facts = node_facts()
    facts["files"][c.INFINIBAND] = {"exists": True}
    args, _ = c.Container(c.node_trtllm_spec).wanted(context(inventory(), "spark-a", {"spark-a": facts}))
    assert "/dev/infiniband:/dev/infiniband" in args
    assert "/dev/infiniband:/dev/infiniband" not in wanted(inventory())[0]


def test_container_life_cycle_decisions(inventory: Any, context: Any, wanted: Any) -> None:
    inv = inventory()
    args, digest = wanted(inv)
    step = c.Container(c.node_trtllm_spec)

    def check(current: dict[str, Any] | None) -> Any:
        return step.check(context(inv, "spark-a", {"spark-a": node_facts(running=current)}))

    fresh = check(None)
    assert isinstance(fresh, Change) and fresh.payload["remove_old"] is False
    assert isinstance(check(running_container(args, digest)), Unchanged)
    stale = check(running_container(args, "0" * 64))
    assert isinstance(stale, Change) and "configuration changed" in stale.summary
    assert stale.payload["remove_old"] is True and "config-hash" in stale.diff
    stopped = check(running_container(args, digest, running=False))
    assert isinstance(stopped, Change) and "exit code 255" in stopped.summary
    with pytest.raises(SparkctlError, match="not created by sparkctl"):
        check(running_container(args, digest, managed=False))


def test_config_hash_depends_on_what_the_container_reads(inventory: Any, wanted: Any) -> None:
    base = wanted(inventory())[1]
    assert wanted(inventory())[1] == base
    assert wanted(inventory(ssh_port=2234))[1] != base  # sshd_config changes
    assert wanted(inventory(image="nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12"))[1] != base
    assert c.config_hash(["a"], "x", "y") != c.config_hash(["a"], "x2", "y")


def test_image_pulled_only_when_missing_and_digests_must_match(inventory: Any, context: Any) -> None:
    inv = inventory()
    assert isinstance(images.Image().check(context(inv, "spark-a", {"spark-a": node_facts()})),
                      Unchanged)
    missing = context(inv, "spark-a", {"spark-a": node_facts(pulled=False)})
    assert isinstance(images.Image().check(missing), Change)
    facts = {"spark-a": node_facts(), "spark-b": node_facts("spark-b", digest="sha256:" + "2" * 64)}
    with pytest.raises(SparkctlError, match=r"spark-a -> sha256:1+; spark-b -> sha256:2+"):
        images.ImageDigest().check(context(inv, "spark-b", facts))
    same = {"spark-a": node_facts(), "spark-b": node_facts("spark-b")}
    outcome = images.ImageDigest().check(context(inv, "spark-b", same))
    assert isinstance(outcome, Unchanged) and "sha256:1111" in outcome.reason


def test_pull_feeds_the_digest_check(inventory: Any, context: Any, fake_transport: Any) -> None:
    inv = inventory()
    pulled = json.dumps([{"Id": "sha256:x", "RepoDigests": [f"{REPO}@sha256:7"]}])
    said = "0123456789ab: Pull complete\nDigest: sha256:7\nStatus: Downloaded newer image"
    transport = fake_transport("spark-a", [(0, said, ""), (0, pulled, "")])
    ctx = context(inv, "spark-a", {"spark-a": node_facts(pulled=False)},
                  transports={"spark-a": transport})
    lines: list[str] = []
    ctx.options.progress_note = lines.append
    images.Image().apply(ctx, Change("pull"))
    assert f"docker pull {IMAGE}" in transport.calls[0]["command"]
    assert transport.calls[1]["command"].startswith(f"docker image inspect {IMAGE}")
    assert any("0123456789ab pull complete; 1/1 layers done" in line for line in lines)
    assert images.image_digest(ctx.shared.image_facts["spark-a"], IMAGE) == "sha256:7"


def test_replace_command_waits_for_the_pinned_host_key(inventory: Any, wanted: Any) -> None:
    inv = inventory()
    args, digest = wanted(inv)
    command = c.replace_container_cmd(inv, inv.node("spark-a"), shared.with_hash(args, digest),
                                      "nvidia", "/home/nvidia/.cache/huggingface", True)
    assert "docker rm -f trtllm-multinode" in command
    assert "ssh-keyscan -T 2 -t ed25519 -p 2233 192.168.200.12" in command
    assert "docker logs --tail 30 trtllm-multinode" in command
    fresh = c.replace_container_cmd(inv, inv.node("spark-a"), args, "nvidia", "/h", False)
    assert "docker rm" not in fresh


def test_failed_start_names_node_and_hint(inventory: Any, context: Any, fake_transport: Any) -> None:
    inv = inventory()
    ctx = context(inv, "spark-a", {"spark-a": node_facts()},
                  transports={"spark-a": fake_transport("spark-a", [(3, "", "exited; log")])})
    change = c.Container(c.node_trtllm_spec).check(ctx)
    assert isinstance(change, Change)
    with pytest.raises(SparkctlError, match=r"(?s)spark-a: container/container.*port 2233 is taken"):
        c.Container(c.node_trtllm_spec).apply(ctx, change)
