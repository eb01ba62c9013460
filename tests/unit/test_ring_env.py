"""A three-node ring's NCCL settings (NCCL_IB_MERGE_NICS=0, NCCL_NET_PLUGIN=none,
NCCL_IB_SUBNET_AWARE_ROUTING=1) reach every engine's containers, not only TensorRT-LLM's, and
mpirun forwards every fabric variable to the remote ranks (their sessions come through the
container's sshd, without the container's environment)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import make_inventory

from orchestrator.engines import load_recipe
from orchestrator.engines.sglang.serve import ServeSpec
from orchestrator.engines.trtllm.serve import LaunchSpec
from orchestrator.engines.vllm import ray
from orchestrator.phases.nccl_env import RING_ENV, fabric_variable_names
from orchestrator.recipe import LaunchOptions

ROCE = ["rocep1s0f1", "roceP2p1s0f1"]


def ring(nodes: int = 3) -> object:
    from test_ncclperf import inventory

    return inventory(nodes, topology="ring")


def test_fabric_variable_names_follow_the_topology() -> None:
    assert fabric_variable_names(make_inventory()) == ["NCCL_SOCKET_IFNAME", "NCCL_IB_HCA",
                                                       "UCX_NET_DEVICES"]
    names = fabric_variable_names(ring())  # type: ignore[arg-type]
    assert names[3:] == sorted(RING_ENV)


def test_vllm_containers_carry_the_ring_settings() -> None:
    inv = ring()
    recipe = load_recipe("minimax-m2.7")
    from orchestrator.engines.vllm.serve import ServeSpec as VllmSpec

    spec = VllmSpec(recipe, inv, LaunchOptions())  # type: ignore[arg-type]
    for node in inv.nodes:  # type: ignore[attr-defined]
        env = ray.ray_spec(spec, node, ROCE, "/hf", infiniband=True).env
        assert {k: env[k] for k in RING_ENV} == RING_ENV
    plain = make_inventory()
    direct = ray.ray_spec(VllmSpec(recipe, plain, LaunchOptions()), plain.head, ROCE, "/hf",
                          True).env
    assert not set(RING_ENV) & set(direct)


def test_sglang_containers_carry_the_ring_settings() -> None:
    inv = ring()
    recipe = load_recipe("qwen3.6-27b-tp2")
    spec = ServeSpec(recipe, inv, LaunchOptions())  # type: ignore[arg-type]
    for name in spec.nodes:
        env = spec.env(inv.node(name), ROCE)  # type: ignore[attr-defined]
        assert {k: env[k] for k in RING_ENV} == RING_ENV
        assert "TP_SOCKET_IFNAME" not in env


@pytest.mark.parametrize("topology", ["ring", "direct"])
def test_mpirun_forwards_every_fabric_variable(topology: str) -> None:
    inv = ring() if topology == "ring" else make_inventory()
    recipe = load_recipe("gpt-oss-120b")
    argv = LaunchSpec(recipe, inv, LaunchOptions()).argv  # type: ignore[arg-type]
    forwarded = [argv[i + 1] for i, word in enumerate(argv) if word == "-x"]
    assert set(fabric_variable_names(inv)) <= set(forwarded)  # type: ignore[arg-type]
    assert (set(RING_ENV) <= set(forwarded)) is (topology == "ring")


def lab_ring() -> object:
    """The lab's three-node ring: each link its own subnet (200: a-b, 204: a-c, 202: b-c)."""
    return make_inventory({
        "cluster": {"name": "ring", "ssh_key": "/k"},
        "fabric": {"interfaces": ["enp1s0f1np1", "enp1s0f0np0"], "topology": "ring"},
        "nodes": [
            {"name": "spark-a", "host": "a", "addresses": {
                "enp1s0f1np1": "192.168.200.12/24", "enp1s0f0np0": "192.168.204.12/24"}},
            {"name": "spark-b", "host": "b", "addresses": {
                "enp1s0f0np0": "192.168.200.13/24", "enp1s0f1np1": "192.168.202.13/24"}},
            {"name": "spark-c", "host": "c", "addresses": {
                "enp1s0f0np0": "192.168.202.14/24", "enp1s0f1np1": "192.168.204.14/24"}},
        ]})


def test_vllm_headless_ranks_reach_the_head_on_the_link_they_share() -> None:
    """In a ring each neighbour has its own link to the head: its --master-addr is the head's
    address on that link (torch's store listens on every address of the head)."""
    from orchestrator.engines.vllm.multinode import head_address_for

    inv: Any = lab_ring()
    assert head_address_for(inv, inv.node("spark-b")) == "192.168.200.12"
    assert head_address_for(inv, inv.node("spark-c")) == "192.168.204.12"
    assert head_address_for(inv, inv.head) == "192.168.200.12"
    direct = make_inventory()
    assert head_address_for(direct, direct.nodes[1]) == head_address_for(direct, direct.head)


def test_trtllm_ranks_bootstrap_on_the_link_they_share_with_rank_0() -> None:
    """NCCL's bootstrap listens on one interface per rank and rank 0 connects back to it: in a
    ring each rank's NCCL_SOCKET_IFNAME is its own interface on the link to rank 0 (rank 0's: to
    rank 1), set per rank since -x forwards the head's value everywhere."""
    import subprocess

    from orchestrator.phases.nccl_env import bootstrap_interfaces

    inv: Any = lab_ring()
    assert bootstrap_interfaces(inv, ["spark-a", "spark-b"]) == ["enp1s0f1np1", "enp1s0f0np0"]
    assert bootstrap_interfaces(inv, ["spark-a", "spark-c"]) == ["enp1s0f0np0", "enp1s0f1np1"]
    assert bootstrap_interfaces(inv, ["spark-b", "spark-c"]) == ["enp1s0f1np1", "enp1s0f0np0"]
    assert bootstrap_interfaces(make_inventory(), ["spark-a", "spark-b"]) is None
    recipe = load_recipe("qwen3-235b")
    argv = LaunchSpec(recipe, inv, LaunchOptions()).argv
    wrapper = argv[argv.index("bash") + 2]
    choose = wrapper.split(" esac; ")[0] + ' esac; echo "$NCCL_SOCKET_IFNAME"'
    for rank, want in ((0, "=enp1s0f1np1"), (1, "=enp1s0f0np0")):
        out = subprocess.run(["bash", "-c", choose], capture_output=True, text=True, check=True,
                             env={"OMPI_COMM_WORLD_RANK": str(rank),
                                  "NCCL_SOCKET_IFNAME": "enp1s0f1np1,enp1s0f0np0"}).stdout
        assert out.strip() == want, rank
    direct = LaunchSpec(recipe, make_inventory(), LaunchOptions()).argv
    assert "case" not in direct[direct.index("bash") + 2]
