"""`sparkctl doctor ssh`: how sparkctl reaches each node and what to fix (netcheck/ssh_doctor.py);
`sparkctl disconnect`: the kept SSH connections closed (remote/keeper.py)."""

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


@click.command(context_settings=CONTEXT)
@json_option
def disconnect(as_json: bool) -> None:
    """Close the SSH connections kept open between runs.

    \b
    A run hands its nodes' connections to a keeper process of sparkctl's own (as OpenSSH's
    ControlPersist does), so the next runs skip SSH's key exchange and login; it closes them
    itself SPARKCTL_SSH_PERSIST seconds after its last use (default 60; 0 turns keeping off).
    Close them now after rotating a node's host key or revoking a key: the next run connects
    afresh and verifies everything again. Exit 0 either way.
    """
    def body() -> int:
        from orchestrator.core.report import print_json
        from orchestrator.remote import keeper

        held = keeper.status()
        stopped = keeper.stop() if held is not None else False
        nodes = list(held.get("nodes", [])) if held else []
        if as_json:
            print_json({"command": "disconnect", "ok": True, "closed": nodes,
                        "keeper_pid": held.get("pid") if held else None})
        elif stopped and nodes:
            click.echo(f"closed the kept connections to {', '.join(nodes)} "
                       f"(keeper pid {held.get('pid') if held else '?'})")
        elif stopped:
            click.echo(f"stopped the connection keeper (pid {held.get('pid') if held else '?'}); "
                       "it held no live connection")
        else:
            click.echo("no connections were kept")
        return 0

    run_command(body)
