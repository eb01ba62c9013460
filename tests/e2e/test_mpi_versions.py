"""Open MPI 4 and 5 images: `up` detects the image's MPI, and a launch puts one rank on each node.

The default lab image uses the node's Debian Open MPI 4.1; `1.3.0rc27` carries the REAL Open
MPI 5.0.11 (PyPI wheel) first on PATH, like TensorRT-LLM's images from 1.3.0rc27 on. With Open
MPI 4's environment that mpirun reads no hostfile and starts both ranks on the head.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import Lab
from test_launch import RUN, sparkctl

from orchestrator.engines.trtllm.mpi_env import record_path

pytestmark = pytest.mark.lab

IMAGES = {4: "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12",
          5: "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc27"}


def _inventory(lab: Lab, image: str, tmp: Path) -> str:
    data = yaml.safe_load(lab.inventory.read_text())
    data["engines"]["trtllm"]["container"]["image"] = image
    path = tmp / f"inventory-{image.rsplit(':', 1)[1]}.yml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _stop(lab: Lab) -> None:
    stop = f"docker exec trtllm-multinode sh -c 'kill $(cat {RUN}/mpirun.pid) 2>/dev/null; true'"
    lab.exec(lab.nodes[0], stop, check=False)


@pytest.mark.parametrize("major", [4, 5])
def test_launch_puts_ranks_on_both_nodes(lab: Lab, tmp_path: Path, major: int) -> None:
    head, other = lab.nodes[0], lab.nodes[1]
    inventory = _inventory(lab, IMAGES[major], tmp_path)
    _stop(lab)
    # --verify: mpirun runs even when an earlier module already left the lab set up this way
    up = sparkctl("up", "--inventory", inventory, "--yes", "--json", "--verify", token=False)
    assert up.returncode == 0, up.stdout + up.stderr
    steps = {s["step"]: s for s in json.loads(up.stdout)["hosts"][head]["steps"]}
    assert f"Open MPI {major}." in steps["mpi-version"]["message"]
    assert steps["mpirun"]["message"].endswith(f"reached {head}, {other}")
    # recorded on the node, keyed by the image, with the image ID it was detected for
    record = json.loads(lab.exec(other, f"cat {record_path(IMAGES[major])}").stdout)
    assert record["major"] == major and record["image"] == IMAGES[major]
    env = lab.exec(head, "docker inspect -f '{{json .Config.Env}}' trtllm-multinode").stdout
    hostfile_var = "PRTE_MCA_prte_default_hostfile" if major == 5 else "OMPI_MCA_orte_default_hostfile"
    assert f"{hostfile_var}=/etc/sparkctl/hostfile" in env
    version = lab.exec(head, "docker exec trtllm-multinode mpirun --version").stdout
    assert f"(Open MPI) {major}." in version

    result = sparkctl("launch", "qwen3-235b", "--inventory", inventory, "--yes", "--json",
                      "--timeout", "120", "--replace")
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        rank0 = lab.exec(head, f"cat {RUN}/rank-0.log").stdout
        rank1 = lab.exec(other, f"cat {RUN}/rank-1.log").stdout
        assert "rank 0 of 2" in rank0
        assert f"Connected rank 1 ({other})" in rank0 + lab.exec(head, f"cat {RUN}/server.log").stdout
        assert rank1.strip(), f"rank 1 left no log on {other}"
    finally:
        _stop(lab)


def test_ompi4_environment_puts_both_ranks_on_the_head_under_ompi5(lab: Lab, tmp_path: Path) -> None:
    """Why the names matter, with the real Open MPI 5: its mpirun ignores the ORTE names."""
    inventory = _inventory(lab, IMAGES[5], tmp_path)
    up = sparkctl("up", "--inventory", inventory, "--yes", token=False)
    assert up.returncode == 0, up.stdout + up.stderr
    ompi4 = ("-e OMPI_MCA_orte_default_hostfile=/etc/sparkctl/hostfile "
             "-e 'OMPI_MCA_plm_rsh_args=-F /etc/sparkctl/ssh_config' -e OMPI_MCA_rmaps_ppr_n_pernode=1")
    only_ompi4 = ("for v in \\$(env | grep -o '^PRTE_MCA_[A-Za-z_]*'); do unset \\$v; done; "
                  "exec timeout 60 mpirun -np 2 hostname")
    cmd = f"docker exec {ompi4} trtllm-multinode sh -c \"{only_ompi4}\""
    out = lab.exec(lab.nodes[0], cmd, check=False)
    assert isinstance(out, subprocess.CompletedProcess)
    assert out.stdout.split() == [lab.nodes[0], lab.nodes[0]], out.stdout + out.stderr
