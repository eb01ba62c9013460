"""What `up` keeps on every node for TensorRT-LLM, and how netcheck judges it: the MPI
hostfile (written with the SSH trust files), the container's expected MPI/NCCL environment
and the hostfile check."""

from __future__ import annotations

from typing import Any

from orchestrator.engines.base import UpContainer
from orchestrator.engines.trtllm.mpi_env import (
    guess_major_from_tag,
    hostfile_var,
    launcher_interface_var,
    mpi_environment,
    recorded,
    ssh_args_var,
)
from orchestrator.inventory import Inventory, Node
from orchestrator.netcheck.results import CheckResult
from orchestrator.paths import HOSTFILE
from orchestrator.phases.files import FileSpec
from orchestrator.remote.fact_records import FileInfo
from orchestrator.remote.gathered import NodeFacts
from orchestrator.remote.node_facts import DockerImage
from orchestrator.render import render


def hostfile_content(inventory: Inventory) -> str:
    addresses = [inventory.mpi_address(node) for node in inventory.ordered_nodes()]
    return render("trtllm/templates/hostfile.j2", addresses=addresses)


def hostfile(inventory: Inventory) -> list[FileSpec]:
    """Written beside the SSH trust files (phases/ssh_keys.py), in the same ssh-trust phase."""
    return [FileSpec(HOSTFILE, 0o644, hostfile_content(inventory))]


def expected_env(inventory: Inventory, facts: NodeFacts | None = None) -> dict[str, str]:
    """The variables `up` sets from the inventory that decide which interfaces carry traffic and
    where mpirun finds its hostfile: named for the image's Open MPI (4: ORTE, 5: PRRTE)."""
    major = image_mpi_major(inventory, facts) if facts is not None else 4
    interfaces = ",".join(inventory.fabric.interfaces)
    mpi = mpi_environment(major, list(inventory.fabric.interfaces), inventory.topology)
    keys = ("OMPI_MCA_btl_tcp_if_include", launcher_interface_var(major),
            hostfile_var(major), ssh_args_var(major))
    return {
        "NCCL_SOCKET_IFNAME": interfaces,
        "UCX_NET_DEVICES": interfaces,
        **{key: mpi[key] for key in keys if key in mpi},
    }


def image_mpi_major(inventory: Inventory, facts: NodeFacts) -> int:
    """The Open MPI major the node recorded for its image (`up` detects it), else from the tag."""
    found = DockerImage(inventory.container.image).read(facts, strict=False)
    image_id = found.id if found else None
    record = recorded(facts, image_id)
    return int(record["major"]) if record else guess_major_from_tag(inventory.container.image)


def check_hostfile(inventory: Inventory, node: Node, facts: NodeFacts) -> list[CheckResult]:
    """mpirun hangs when the hostfile names addresses that are not the fabric's."""
    fact = facts.file(HOSTFILE) or FileInfo(exists=False)
    want = [inventory.mpi_address(n) for n in inventory.ordered_nodes()]
    result = CheckResult("hostfile", node.name, "pass", f"{HOSTFILE} lists the fabric addresses.",
                         threshold=",".join(want))
    if not fact.exists:
        result.status, result.message = "fail", f"{HOSTFILE} is missing on {node.name}."
        result.fix = "run `sparkctl up`"
        return [result]
    have = [line.split()[0] for line in (fact.content or "").splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
    result.value = ",".join(have)
    if sorted(have) != sorted(want):
        result.status = "fail"
        result.message = (f"{HOSTFILE} on {node.name} lists {', '.join(have) or 'nothing'}, expected "
                          f"the fabric addresses {', '.join(want)}: mpirun would hang or use the "
                          "management network.")
        result.fix = "run `sparkctl up` (it rewrites the hostfile from the inventory)"
    return [result]


def netcheck_facts(inventory: Inventory, node: Node) -> dict[str, Any]:
    """What netcheck's judgements read beyond the container: the image's MPI record, the
    hostfile."""
    from orchestrator.engines.trtllm.mpi_env import record_fact

    return {"files": {HOSTFILE: True}, "commands": record_fact(inventory.container.image)}


def up_container(inventory: Inventory) -> UpContainer:
    from orchestrator.engines.trtllm import container

    return UpContainer(settings=inventory.container, facts=netcheck_facts,
                       spec_facts=container.facts, spec_for=container.node_trtllm_spec,
                       expected_env=expected_env, node_checks=(check_hostfile,))
