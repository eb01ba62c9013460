"""`sparkctl doctor ssh`: how sparkctl reaches each node and what to fix (netcheck/ssh_doctor.py)."""

from __future__ import annotations

import click

from orchestrator.cli import CONTEXT, inventory_option, json_option, run_command


@click.group(context_settings=CONTEXT)
def doctor() -> None:
    """Diagnose the controller's setup; changes nothing."""


def _ssh(inventory_path: str | None, nodes: tuple[str, ...], as_json: bool) -> int:
    from orchestrator.core.report import print_json
    from orchestrator.core.runner import load_inventory_option
    from orchestrator.netcheck.ssh_doctor import diagnose, render

    inventory, _ = load_inventory_option(inventory_path)
    chosen = [inventory.node(n) for n in nodes] if nodes else inventory.nodes
    report = diagnose(inventory, chosen)
    if as_json:
        print_json(report)
    else:
        render(report)
    return 0 if report["ok"] else 1


@doctor.command(context_settings=CONTEXT)
@inventory_option
@json_option
@click.option("--node", "-n", "nodes", multiple=True, metavar="NAME",
              help="Only this node (repeatable; default: every node).")
def ssh(inventory_path: str | None, nodes: tuple[str, ...], as_json: bool) -> None:
    """How each node's SSH connection resolved, and whether each step works.

    \b
    Resolution: host, port, user, keys (inventory, ssh_config, default; ssh-agent), jump hosts,
    known_hosts files. Steps: TCP, host keys (every hop), authentication, sudo; a failed step
    says the exact fix. Nothing is pinned and nothing changes on the nodes.
    Exit 0: every node works (sudo asking a password is a warning). Exit 1: a step failed.
    """
    run_command(lambda: _ssh(inventory_path, nodes, as_json))
