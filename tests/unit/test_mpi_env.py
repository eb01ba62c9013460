"""The image's Open MPI decides the launcher's MCA names (Open MPI 4: ORTE, 5: PRRTE)."""

from __future__ import annotations

import json

from conftest import node_facts as as_facts

from orchestrator.engines.trtllm.mpi_env import (
    FACT_KEY,
    guess_major_from_tag,
    mpi_environment,
    parse_mpirun_version,
    recorded,
)
from orchestrator.inventory import Inventory
from orchestrator.paths import HOSTFILE
from orchestrator.phases.nccl_env import RING_ENV, min_nccl_busbw, nccl_environment, ring_capable

IFS = ["enp1s0f1np1", "enP2p1s0f1np1"]
# What Open MPI 5's mpirun (PRRTE) reads for the hostfile and ssh (prte_info --all, 5.0.11).
OMPI5_HOSTFILE, OMPI5_SSH = "PRTE_MCA_prte_default_hostfile", "PRTE_MCA_plm_ssh_args"


def test_parse_mpirun_version_with_banner() -> None:
    banner = "== TensorRT-LLM ==\nNVIDIA Release 1.3.0rc27\n\nmpirun (Open MPI) 5.0.11\n\nReport bugs to ..."
    found = parse_mpirun_version(banner)
    assert found is not None and found.major == 5 and found.version == "5.0.11"
    assert parse_mpirun_version("mpirun (Open MPI) 4.1.4\n").major == 4  # type: ignore[union-attr]
    assert parse_mpirun_version("bash: mpirun: command not found") is None


def test_ompi4_environment_would_be_wrong_for_ompi5() -> None:
    """Open MPI 4's names leave Open MPI 5 without hostfile and ssh settings: every rank on the
    head (the lab's e2e shows it with the real binaries)."""
    ompi4 = mpi_environment(4, IFS)
    assert ompi4["OMPI_MCA_orte_default_hostfile"] == HOSTFILE
    assert OMPI5_HOSTFILE not in ompi4 and OMPI5_SSH not in ompi4
    ompi5 = mpi_environment(5, IFS)
    assert ompi5[OMPI5_HOSTFILE] == HOSTFILE
    assert ompi5[OMPI5_SSH] == ompi4["OMPI_MCA_plm_rsh_args"]
    assert not any(k.startswith(("OMPI_MCA_orte", "OMPI_MCA_plm", "OMPI_MCA_rmaps")) for k in ompi5)
    assert ompi5["OMPI_MCA_btl_tcp_if_include"] == ",".join(IFS)  # the MPI layer keeps its name
    # PRRTE 3.0 crashes now and then with a list here: one entry, or none in a ring
    assert ompi5["PRTE_MCA_prte_if_include"] == IFS[0]
    assert "PRTE_MCA_prte_if_include" not in mpi_environment(5, IFS, "ring")


def test_guess_from_tag_only_for_previews() -> None:
    assert guess_major_from_tag("nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12") == 4
    assert guess_major_from_tag("nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc27") == 5
    assert guess_major_from_tag("nvcr.io/nvidia/tensorrt-llm/release:1.3.0") == 5
    assert guess_major_from_tag("nvcr.io/nvidia/tensorrt-llm/release:1.2.0rc6") == 4
    assert guess_major_from_tag("registry.local/my-trtllm:custom") == 4


def test_record_only_counts_for_its_image_id() -> None:
    record = {"image": "x", "image_id": "sha256:aa", "version": "5.0.11", "major": 5}
    facts = {"commands": {FACT_KEY: {"out": json.dumps(record) + "\n"}}}
    assert recorded(as_facts(facts), "sha256:aa") == record
    assert recorded(as_facts(facts), "sha256:bb") is None  # a newer image: detect again
    assert recorded(as_facts({"commands": {FACT_KEY: {"out": ""}}}), "sha256:aa") is None


def _inventory(topology: str, nodes: int = 3) -> Inventory:
    data = {"cluster": {"name": "t"}, "fabric": {"topology": topology},
            "nodes": [{"name": f"n{i}", "host": f"10.0.0.{i + 1}"} for i in range(nodes)]}
    if topology == "ring":
        data["nodes"] = [{"name": f"n{i}", "host": f"10.0.0.{i + 1}", "addresses": {
            "enp1s0f1np1": f"192.168.{200 + 2 * i}.1/24", "enP2p1s0f1np1": f"192.168.{201 + 2 * i}.1/24"}}
            for i in range(nodes)]
    return Inventory.model_validate(data)


def test_ring_adds_nvidia_ring_settings_and_lower_pass_mark() -> None:
    switch = _inventory("switch")
    assert not set(RING_ENV) & set(nccl_environment(switch, ["rocep1s0f1", "roceP2p1s0f1"]))
    assert min_nccl_busbw(switch) == 21.875
    ring = _inventory("ring")
    env = nccl_environment(ring, ["rocep1s0f1", "roceP2p1s0f1"])
    assert env["NCCL_IB_MERGE_NICS"] == "0" and env["NCCL_NET_PLUGIN"] == "none"
    assert env["NCCL_IB_SUBNET_AWARE_ROUTING"] == "1"
    assert min_nccl_busbw(ring) == 10.0
    assert ring_capable((2, 27, 7)) is False and ring_capable((2, 30, 1)) is True
    assert ring_capable(None) is None


def test_ring_preflight_warns_with_the_version_found() -> None:
    from orchestrator.phases.nccl_env import NCCL_FACT, ring_nccl_warning

    def facts(out: str) -> dict:
        return {"commands": {NCCL_FACT: {"out": out}}}

    ring = _inventory("ring")
    old = ring_nccl_warning(ring, as_facts(facts("/usr/lib/aarch64-linux-gnu/libnccl.so.2.27.7\n")))
    assert old and "NCCL 2.27.7" in old and "not ring-capable" in old and "Fix:" in old
    assert ring_nccl_warning(ring, as_facts(facts("/usr/lib/aarch64-linux-gnu/libnccl.so.2.30.1\n"))) is None
    unknown = ring_nccl_warning(ring, as_facts(facts("")))
    assert unknown and "could not tell the NCCL version" in unknown
    assert ring_nccl_warning(_inventory("switch"), as_facts(facts("libnccl.so.2.27.7"))) is None
