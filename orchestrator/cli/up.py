"""`sparkctl up` and `sparkctl plan`."""

from __future__ import annotations

import click

from orchestrator.cli import CONTEXT, diff_option, inventory_option, json_option, run_command
from orchestrator.cli.verbosity import verbosity_option


def _up(inventory_path: str | None, dry_run: bool, yes: bool, as_json: bool,
        trust_new_hosts: bool, break_lock: bool, verify: bool, command: str = "up",
        oom_guard: bool = False, distribute_image: bool = False) -> int:
    from orchestrator.core.speculate import start_early

    # a named inventory's kept requests go out first, along the kept routes (core/speculate.py)
    speculation = start_early(command + ("-dry-run" if dry_run else ""), inventory_path,
                              trust_new_hosts)
    try:  # (the inventory's models import pydantic: after the early start)
        from orchestrator.core.inventory_option import load_inventory_option

        inventory, path = load_inventory_option(inventory_path)
    except BaseException:
        if speculation is not None:
            speculation.close()
        raise
    if speculation is not None:
        speculation.confirm(inventory)
    # the plan's machinery is imported while the nodes answer (core/speculate.py)
    from orchestrator.core.plan import build_up_plan
    from orchestrator.core.runner import RunRequest, execute
    from orchestrator.core.step import RunOptions
    from orchestrator.state import remember_inventory

    request = RunRequest(
        command=command, inventory=inventory, build=lambda session: build_up_plan(inventory, oom_guard),
        dry_run=dry_run, yes=yes, as_json=as_json, trust_new_hosts=trust_new_hosts,
        break_lock=break_lock, speculation=speculation,
        options=RunOptions(verify=verify, distribute_image=distribute_image,
                           progress_note=lambda line: click.echo(line, err=True)),
    )
    code = execute(request)
    if code == 0 and not dry_run:
        remember_inventory(path)
    return code


@click.command(context_settings=CONTEXT)
@inventory_option
@click.option("--dry-run", is_flag=True,
              help="Show what would change (a line per changed file; --diff: in full); change nothing.")
@diff_option
@click.option("--yes", "-y", is_flag=True, help="Apply without asking (needed when not on a terminal).")
@json_option
@click.option("--trust-new-hosts", is_flag=True,
              help="Pin unknown SSH host keys on first use (a changed key is always refused).")
@click.option("--break-lock", is_flag=True, help="Take the cluster lock from a run that is gone.")
@click.option("--verify/--no-verify", default=False,
              help="Run the mpirun check even when nothing changed (it always runs after changes).")
@click.option("--oom-guard", is_flag=True,
              help="Also install and configure earlyoom on every node, acting only after "
                   "sparkctl's memory guard (sshd, dockerd and the guard protected).")
@click.option("--distribute-image", is_flag=True,
              help="Pull the container image on the head only and send it to the other nodes "
                   "over the fabric (docker save | docker load, verified by image ID and "
                   "digest). Without it, this happens only for nodes that cannot reach the "
                   "registry (probed in preflight, before pulling) or whose pull fails.")
@verbosity_option
def up(inventory_path: str | None, dry_run: bool, yes: bool, as_json: bool,
       trust_new_hosts: bool, break_lock: bool, verify: bool, oom_guard: bool,
       distribute_image: bool) -> None:
    """Bring the cluster up: fabric network, SSH trust, containers, MPI hostfile.

    \b
    Phases, in lock-step on every node:
      preflight  read-only checks on every node; any problem: nothing changes anywhere;
                 a node that cannot reach the image's registry is named up front
      network    fabric netplan file (0600), validated, applied with automatic rollback
    then the phases of the engines the inventory serves (`engines:`, default all;
    TensorRT-LLM's, skipped for an inventory that does not list it):
      ssh        a dedicated cluster key pair for MPI and pinned container host keys,
                 the MPI hostfile
      container  the image (pulled; a node that cannot reach the registry gets it from
                 the head over the fabric, verified), the TensorRT-LLM container with the
                 fabric's NCCL/UCX/MPI settings
      mpi        `mpirun hostname` across all containers proves the hostfile
    and last, with --oom-guard:
      oom-guard  earlyoom installed, /etc/default/earlyoom, service enabled
    Safe to run again: it changes only what is wrong. See docs/up.md.
    """
    run_command(lambda: _up(inventory_path, dry_run, yes, as_json, trust_new_hosts, break_lock,
                            verify, oom_guard=oom_guard, distribute_image=distribute_image))


@click.command(context_settings=CONTEXT)
@inventory_option
@json_option
@diff_option
@click.option("--trust-new-hosts", is_flag=True, help="Pin unknown SSH host keys on first use.")
@click.option("--oom-guard", is_flag=True, help="Include what `up --oom-guard` would change.")
@verbosity_option
def plan(inventory_path: str | None, as_json: bool, trust_new_hosts: bool, oom_guard: bool) -> None:
    """Show what `up` would change, without changing anything (= up --dry-run).

    Each changed file gets one line: what changes and on which nodes (identical changes on
    several nodes are listed once). --diff prints the diffs in full, each distinct one once.
    """
    run_command(lambda: _up(inventory_path, True, False, as_json, trust_new_hosts, False, False,
                            command="plan", oom_guard=oom_guard))
