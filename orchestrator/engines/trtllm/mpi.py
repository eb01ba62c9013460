"""up phase 5: prove MPI works across the containers.

From the head's container, `mpirun -np N hostname` must print every node's hostname: that
exercises the hostfile (fabric addresses), the container sshd on every node, the cluster key
and the pinned host keys in one go. It runs after any change in this run, or with --verify;
a run that changed nothing does not re-run it.
"""

from __future__ import annotations

from typing import Any

from orchestrator.core.step import Change, NodeContext, NotVerified, Phase, Step
from orchestrator.errors import SparkctlError
from orchestrator.inventory import Inventory, Node
from orchestrator.remote.container import ContainerCommands

"""ctx.shared list of the changes made in this run (the steps of phases 3-4 append to it)."""
MPIRUN_DEADLINE = 60


def mpirun_hostname_cmd(container: str, nodes: int, deadline: int = MPIRUN_DEADLINE) -> str:
    """`timeout` inside the container, so a hung mpirun dies there rather than lingering."""
    return ContainerCommands(container).exec_cmd(
        ["timeout", "-k", "5", str(deadline), "mpirun", "-np", str(nodes), "hostname"])


def facts(inventory: Inventory, node: Node) -> dict[str, Any]:
    # Every node answers (hostname is always in the facts): the check needs every hostname.
    return {}


def missing_hostnames(output: str, expected: list[str]) -> list[str]:
    printed = {line.strip() for line in output.splitlines() if line.strip()}
    return [name for name in expected if name not in printed]


class MpirunHostname(Step):
    name = "mpirun"
    kind = "verify"
    scope = "head"

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        changes = ctx.shared.changed_steps
        if not changes and not ctx.options.verify:
            return NotVerified("not re-run: nothing changed (use --verify to run mpirun anyway)")
        inventory = ctx.inventory
        expected = [
            ctx.cluster_facts[node.name].hostname
            for node in inventory.ordered_nodes() if node.name in ctx.cluster_facts
        ]
        count = len(inventory.nodes)
        command = mpirun_hostname_cmd(inventory.container.name, count)
        result = ctx.run(command, sudo=True, timeout=MPIRUN_DEADLINE + 30)
        where = f"{ctx.node.name}: mpi/mpirun: `{command}`"
        if result.exit_status == 124:
            raise SparkctlError(
                f"{where} hung for {MPIRUN_DEADLINE}s and was stopped. Hint: the hostfile "
                "IPs must be fabric IPs and every container's sshd must be reachable on them; "
                f"check with `sparkctl netcheck`.\n{_tail(result.stdout + result.stderr)}"
            )
        if not result.ok:
            raise SparkctlError(
                f"{where} exited {result.exit_status}.{_hint(result.stderr)}\n"
                f"{_tail(result.stdout + result.stderr)}"
            )
        missing = missing_hostnames(result.stdout, expected)
        if missing:
            raise SparkctlError(
                f"{where} printed {sorted(set(result.stdout.split()))} but not "
                f"{', '.join(missing)}: ranks did not land on every node (check the hostfile "
                "/etc/sparkctl/hostfile, and that the container's MPI environment matches the "
                "image's Open MPI: `sparkctl netcheck` shows both)"
            )
        return f"mpirun -np {count} hostname reached {', '.join(expected)}"


def _tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _hint(stderr: str) -> str:
    if "Permission denied (publickey" in stderr:
        return " Hint: the cluster key is not authorized in some container; run `sparkctl up` again."
    if "Host key verification failed" in stderr or "REMOTE HOST IDENTIFICATION" in stderr:
        return (" Hint: a container's host key is not the pinned one in /etc/sparkctl/known_hosts;"
                " run `sparkctl up` again.")
    if "Connection refused" in stderr:
        return " Hint: a container's sshd is not listening; see `docker logs` of the container."
    if "is not running" in stderr or "No such container" in stderr:
        return " Hint: the container is not running on the head; run `sparkctl up` again."
    return ""


def phase(inventory: Inventory) -> Phase:
    return Phase("mpi", [MpirunHostname()], facts)
