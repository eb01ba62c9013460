"""`netcheck --deep`: NCCL's own all_gather test across the containers, and what a low figure means.

From the head's container, `mpirun` starts nccl-tests' `all_gather_perf` with one rank per node
and the container's NCCL environment (forwarded with -x: remote ranks start through the
container's sshd and would not have it otherwise). The bus bandwidth of the largest message is
judged against `fabric.min_nccl_busbw_gbps` (NVIDIA's pass marks: 21.875 GB/s direct or switch,
10 GB/s ring). nccl-tests' all_gather reports algbw = bytes / time and
busbw = algbw * (n-1)/n (src/all_gather.cu, AllGatherGetBw, nccl-tests 2.19.6).

TensorRT-LLM images do not ship nccl-tests; when the binary is not found the row is a skip that
says how to build it (NVIDIA's DGX Spark NCCL playbook, Step 3).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from orchestrator.commands import join
from orchestrator.inventory import Inventory
from orchestrator.netcheck.results import CheckResult, _link
from orchestrator.phases.nccl_env import fabric_variable_names, min_nccl_busbw
from orchestrator.remote.container import ContainerCommands
from orchestrator.remote.gathered import NodeFacts

BINARY = "all_gather_perf"
SEARCH_PATHS = ("/workspace/nccl-tests/build", "/opt/nccl-tests/build", "/root/nccl-tests/build")
TEST_ARGS = ["-b", "8M", "-e", "256M", "-f", "2", "-g", "1"]
DEADLINE = 150
NOT_FOUND = "sparkctl: all_gather_perf not found"
JUMBO = 9000
BUILD_FIX = (
    "build nccl-tests inside the image (NVIDIA DGX Spark NCCL playbook, step 3): "
    "`git clone https://github.com/NVIDIA/nccl-tests.git /workspace/nccl-tests && "
    "cd /workspace/nccl-tests && make MPI=1` (MPI_HOME and NCCL_HOME as in the playbook), "
    "in a derived image used as container.image on every node; sparkctl looks for "
    f"{BINARY} on PATH and in {', '.join(SEARCH_PATHS)}"
)


def forwarded_env(inventory: Inventory) -> list[str]:
    """The NCCL variables every rank must see (the head container's values)."""
    return fabric_variable_names(inventory)


def all_gather_argv(inventory: Inventory) -> list[str]:
    argv = ["mpirun", "-np", str(len(inventory.nodes))]
    for name in forwarded_env(inventory):
        argv += ["-x", name]
    return [*argv, "$bin", *TEST_ARGS]


def all_gather_cmd(inventory: Inventory) -> str:
    """One command on the head: find all_gather_perf in the container, run it across the nodes."""
    search = " ".join(f"{p}/{BINARY}" for p in SEARCH_PATHS)
    mpirun = join(["timeout", "-k", "5", str(DEADLINE), *all_gather_argv(inventory)])
    mpirun = mpirun.replace("'$bin'", '"$bin"')
    script = (f"bin=$(command -v {BINARY} || ls {search} 2>/dev/null | head -n 1); "
              f"if [ -z \"$bin\" ]; then echo '{NOT_FOUND}' >&2; exit 127; fi; exec {mpirun}")
    return ContainerCommands(inventory.container.name).exec_cmd(["bash", "-c", script])


# ---------------------------------------------------------------- parsing
@dataclass
class SizeRow:
    size: int
    busbw_out: float
    busbw_in: float
    algbw_out: float

    @property
    def busbw(self) -> float:
        return max(self.busbw_out, self.busbw_in)


@dataclass
class NcclRun:
    rows: list[SizeRow] = field(default_factory=list)
    avg_busbw: float | None = None
    version: str | None = None
    hosts: list[str] = field(default_factory=list)

    @property
    def peak(self) -> SizeRow | None:
        return max(self.rows, key=lambda r: r.size) if self.rows else None


_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_VERSION = re.compile(r"^#\s*nccl-tests version (\S+)")
_RANK = re.compile(r"^#\s*Rank\s+\d+\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)")


def _float(token: str) -> float:
    return float(token) if token not in ("N/A", "nan", "-nan") else 0.0


def parse_all_gather(output: str) -> NcclRun:
    """nccl-tests' stdout: the per-size table and the `# Avg bus bandwidth` line."""
    run = NcclRun()
    for line in output.splitlines():
        if match := _AVG.match(line.strip()):
            run.avg_busbw = float(match.group(1))
        elif match := _VERSION.match(line.strip()):
            run.version = match.group(1)
        elif match := _RANK.match(line.strip()):
            run.hosts.append(match.group(1))
        else:
            tokens = line.split()
            if len(tokens) >= 10 and tokens[0].isdigit() and tokens[1].isdigit():
                # size count type [redop root] | time algbw busbw #wrong | time algbw busbw #wrong
                try:
                    values = tokens[-8:]
                    run.rows.append(SizeRow(int(tokens[0]), _float(values[2]), _float(values[6]),
                                            _float(values[1])))
                except ValueError:
                    continue
    return run


# ---------------------------------------------------------------- judging
def _mib(size: int) -> str:
    return f"{size // (1 << 20)}M" if size >= 1 << 20 else f"{size}B"


def likely_causes(inventory: Inventory, facts_by_node: dict[str, NodeFacts]) -> list[tuple[str, str]]:
    """(cause, fix) for what the facts show can slow NCCL down, most likely first."""
    from orchestrator.netcheck.container import _container, _named_interfaces, container_env

    causes: list[tuple[str, str]] = []
    fabric = list(inventory.fabric.interfaces)
    for name, facts in sorted(facts_by_node.items()):
        env = container_env(_container(inventory, facts))
        devices = facts.roce.ports
        wanted = [devices[i].device for i in fabric if i in devices]
        hca = env.get("NCCL_IB_HCA", "")
        named = {p.split(":")[0] for p in hca.lstrip("=^").split(",") if p}
        missing = [d for d in wanted if d not in named]
        if hca and missing:
            causes.append((
                f"NCCL_IB_HCA={hca} in {inventory.container.name} on {name} names only part of "
                f"the fabric's RoCE devices ({', '.join(wanted)} per ibdev2netdev): NCCL drives "
                "one half of the port (NVIDIA's playbook: busbw stuck at ~3 GB/s)",
                f"NCCL_IB_HCA={','.join(wanted)}: `sparkctl up` recreates the container with it"))
        mtus = {i: link.mtu if (link := _link(facts, i)) else None for i in fabric}
        low = [f"{i} MTU {m}" for i, m in mtus.items() if isinstance(m, int) and m < JUMBO]
        if low:
            causes.append((
                f"{', '.join(low)} on {name}: below {JUMBO}, RoCE runs with small packets",
                f"fabric.mtu: {JUMBO} and `sparkctl up` (through a switch, its ports need jumbo "
                "frames too)"))
        socket_if = env.get("NCCL_SOCKET_IFNAME")
        if socket_if is not None:
            outside = [i for i in _named_interfaces(socket_if) if i not in fabric]
            if outside:
                causes.append((
                    f"NCCL_SOCKET_IFNAME={socket_if} on {name} names {', '.join(outside)}, not a "
                    "fabric interface: NCCL's traffic can take the management network",
                    f"NCCL_SOCKET_IFNAME={','.join(fabric)}: `sparkctl up` recreates the container"))
    return causes


def judge_all_gather(inventory: Inventory, rc: int, stdout: str, stderr: str,
                     facts_by_node: dict[str, NodeFacts]) -> CheckResult:
    limit = min_nccl_busbw(inventory)
    head = inventory.head_name
    result = CheckResult("nccl-busbw", head, "pass", "", value=None, unit="GB/s", threshold=limit)
    if rc == 127 and (NOT_FOUND in stderr or "executable file not found" in stderr):
        result.status = "skip"
        result.message = (f"{BINARY} (nccl-tests) is not in the image {inventory.container.image}: "
                          "the engine's release images do not ship it, so NCCL's own bandwidth "
                          "was not measured.")
        result.fix = BUILD_FIX
        return result
    run = parse_all_gather(stdout)
    peak = run.peak
    if peak is None:
        tail = (stderr.strip() or stdout.strip())[-300:] or f"exit {rc}"
        result.status = "fail"
        result.message = (f"{BINARY} across {len(inventory.nodes)} containers printed no results "
                          f"(exit {rc}{', timed out' if rc == 124 else ''}): {tail}")
        result.fix = ("fix the mpirun and ssh-container rows first; run the command with "
                      "NCCL_DEBUG=INFO in the head container to see NCCL's error")
        return result
    result.value = round(peak.busbw, 2)
    table = ", ".join(f"{_mib(r.size)} {r.busbw:.2f}" for r in run.rows)
    avg = f"{run.avg_busbw:.2f} GB/s" if run.avg_busbw is not None else "not printed"
    ranks = f" on {', '.join(run.hosts)}" if run.hosts else ""
    summary = (f"all_gather_perf, {len(inventory.nodes)} ranks{ranks}: bus bandwidth "
               f"{peak.busbw:.2f} GB/s ({peak.busbw * 8:.0f} Gb/s) at {_mib(peak.size)}; "
               f"avg bus bandwidth {avg}; per size (GB/s): {table}.")
    if peak.busbw >= limit:
        result.message = summary
        return result
    result.status = "fail"
    causes = likely_causes(inventory, facts_by_node)
    if causes:
        result.message = (f"{summary} Below fabric.min_nccl_busbw_gbps {limit}. Likely: "
                          + "; ".join(c for c, _ in causes) + ".")
        result.fix = "; ".join(dict.fromkeys(f for _, f in causes))
    else:
        result.message = (f"{summary} Below fabric.min_nccl_busbw_gbps {limit}; the container "
                          "settings and MTUs look right.")
        result.fix = ("check the throughput and latency rows (a degraded cable), and that the "
                      "image's NCCL is a release build (NVIDIA measured 3 GB/s from a development "
                      "build vs 23.7 GB/s from the release tag)")
    return result
