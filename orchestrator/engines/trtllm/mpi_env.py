"""Which Open MPI the TensorRT-LLM image ships, and the environment that makes each one work.

Open MPI 4 (ORTE; TensorRT-LLM images up to 1.3.0rc2x) and Open MPI 5 (PRRTE; images from
1.3.0rc27 on) read different MCA names for the launcher. Open MPI 5's mpirun is PRRTE's prterun
in disguise: it silently ignores `OMPI_MCA_orte_default_hostfile` and `OMPI_MCA_plm_rsh_args`,
so with Open MPI 4's environment it reads no hostfile and starts every rank on the head.
The PRRTE names (`prte_info --all` of Open MPI 5.0.11; PRRTE registers `prte_default_hostfile`
in its "prte" project, hence the `PRTE_MCA_` prefix; `oob_tcp_if_include` is a deprecated
synonym of `prte_if_include`; `rmaps_default_mapping_policy` of `mapby`):

| what | Open MPI 4 | Open MPI 5 |
| --- | --- | --- |
| default hostfile | OMPI_MCA_orte_default_hostfile | PRTE_MCA_prte_default_hostfile |
| ssh arguments | OMPI_MCA_plm_rsh_args | PRTE_MCA_plm_ssh_args |
| no tree spawn | OMPI_MCA_plm_rsh_no_tree_spawn | PRTE_MCA_plm_ssh_no_tree_spawn |
| launcher interfaces | OMPI_MCA_oob_tcp_if_include | PRTE_MCA_prte_if_include (one entry: see below) |
| one rank per node | OMPI_MCA_rmaps_ppr_n_pernode=1 | PRTE_MCA_rmaps_default_mapping_policy=ppr:1:node |
| direct routing | OMPI_MCA_routed=direct | (no routed framework; the head spawns every daemon) |

The MPI layer's own parameters (`OMPI_MCA_btl_tcp_if_include`) and `OMPI_ALLOW_RUN_AS_ROOT*`
keep their names in 5. The hostfile also says `slots=1` per line, which both versions honour.

The version is detected once per image ID (`mpirun --version` in a throw-away container of the
image) and recorded on the node in `/var/lib/sparkctl/images/`, which the facts gatherer reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from orchestrator.commands import docker_cmd
from orchestrator.paths import HOSTFILE, SSH_CONFIG
from orchestrator.phases import image_records
from orchestrator.remote.gathered import NodeFacts

RECORD_DIR = image_records.RECORD_DIR
FACT_KEY = "mpi_record"
_VERSION_RE = re.compile(r"\(Open MPI\)\s+(\d+)\.(\d+)(?:\.(\d+))?")
_TAG_RE = re.compile(r":(\d+)\.(\d+)\.(\d+)(?:rc(\d+))?")
FIRST_OMPI5_TAG = (1, 3, 0, 27)  # TensorRT-LLM 1.3.0rc27 is the first image with Open MPI 5


@dataclass(frozen=True)
class MpiVersion:
    version: str
    major: int

    def __str__(self) -> str:
        return f"Open MPI {self.version}"


def parse_mpirun_version(output: str) -> MpiVersion | None:
    """`mpirun (Open MPI) 5.0.11` anywhere in the output (an image's banner may come first)."""
    match = _VERSION_RE.search(output)
    if not match:
        return None
    parts = [p for p in match.groups() if p is not None]
    return MpiVersion(".".join(parts), int(parts[0]))


def guess_major_from_tag(image: str) -> int:
    """Only for previews before the image is on the node: TensorRT-LLM's tag tells, else 4."""
    match = _TAG_RE.search(image.rsplit("/", 1)[-1])
    if not match:
        return 4
    major, minor, patch, rc = (int(x) if x is not None else 10**6 for x in match.groups())
    return 5 if (major, minor, patch, rc) >= FIRST_OMPI5_TAG else 4


def mpi_environment(mpi_major: int, interfaces: list[str], topology: str = "b2b") -> dict[str, str]:
    """The launcher's environment for the image's Open MPI (4 or 5) on the fabric interfaces.

    Open MPI 5.0.11's PRRTE (3.0.14) segfaults in about one mpirun out of five when
    `prte_if_include` lists two or more entries (seen in the lab with the real binaries, with
    names and with CIDRs alike). Its daemons only need the interface that carries the hostfile
    addresses, the first one, in a back-to-back or switch fabric; in a ring the head reaches
    its two neighbours on different interfaces, so there PRRTE is left to choose (its control
    traffic only: MPI's own traffic stays on `btl_tcp_if_include`).
    """
    joined = ",".join(interfaces)
    common = {
        "OMPI_MCA_btl_tcp_if_include": joined,
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }
    if mpi_major >= 5:
        launcher = {} if topology == "ring" else {"PRTE_MCA_prte_if_include": interfaces[0]}
        return {
            **common,
            **launcher,
            "PRTE_MCA_prte_default_hostfile": HOSTFILE,
            "PRTE_MCA_rmaps_default_mapping_policy": "ppr:1:node",
            # the head starts every node's daemon itself (in a ring only its own links reach)
            "PRTE_MCA_plm_ssh_no_tree_spawn": "1",
            "PRTE_MCA_plm_ssh_args": f"-F {SSH_CONFIG}",
        }
    return {
        **common,
        "OMPI_MCA_oob_tcp_if_include": joined,
        "OMPI_MCA_orte_default_hostfile": HOSTFILE,
        "OMPI_MCA_rmaps_ppr_n_pernode": "1",
        # the head starts every node's daemon itself and talks to each directly: in a ring
        # only the head's own links are reachable from it, so no daemon may relay for another
        "OMPI_MCA_plm_rsh_no_tree_spawn": "1",
        "OMPI_MCA_routed": "direct",
        "OMPI_MCA_plm_rsh_args": f"-F {SSH_CONFIG}",
    }


def launcher_interface_var(mpi_major: int) -> str:
    return "PRTE_MCA_prte_if_include" if mpi_major >= 5 else "OMPI_MCA_oob_tcp_if_include"


def hostfile_var(mpi_major: int) -> str:
    return "PRTE_MCA_prte_default_hostfile" if mpi_major >= 5 else "OMPI_MCA_orte_default_hostfile"


def ssh_args_var(mpi_major: int) -> str:
    return "PRTE_MCA_plm_ssh_args" if mpi_major >= 5 else "OMPI_MCA_plm_rsh_args"


# ---------------------------------------------------------------- the record on the node
def record_path(image: str) -> str:
    return image_records.record_path(image)


def record_fact(image: str) -> dict[str, str]:
    """The facts `commands` entry that reads the record (empty output when there is none)."""
    return image_records.record_fact(FACT_KEY, record_path(image))


def recorded(facts: NodeFacts, image_id: str | None) -> dict[str, Any] | None:
    """The record from the facts, when it was made for this image ID."""
    record = image_records.read_record(facts, FACT_KEY)
    if record is None or not isinstance(record.get("major"), int):
        return None
    if image_id and record.get("image_id") != image_id:
        return None
    return record


def detect_and_record_cmd(image: str, image_id: str) -> str:
    """One remote command: `mpirun --version` in a throw-away container, then the record."""
    probe = docker_cmd("run", "--rm", "--network", "none", image, "mpirun", "--version")
    return image_records.detect_and_record_cmd(probe, "mpi", image, image_id, record_path(image))
