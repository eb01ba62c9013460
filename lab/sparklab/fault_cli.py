"""`sparkctl lab fault ...`: the click commands over sparklab.faults (inject, restore)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from sparklab.faults import DISK_FULL_SIZE, SWITCH, describe, inject, restore
from sparklab.identity import LabError


@click.group()
def fault() -> None:
    """Inject a fault into a lab node (recorded; `fault restore` undoes it)."""


def _fault_command(kind: str, help_text: str, *options: Callable[[Any], Any]) -> None:
    def command(node: str, **params: Any) -> None:
        from sparklab.cli import _fail, _ident

        try:
            rec = inject(_ident(), kind, node, **params)
        except LabError as err:
            _fail(err)
            return
        click.echo(f"fault {describe(rec)} injected")

    command.__doc__ = help_text
    command = click.option("--node", required=True, help="node name, e.g. spark-a")(command)
    for option in options:
        command = option(command)
    fault.command(name=kind)(command)


_IFACE = click.option("--interface", required=True, help="fabric interface (or eth0 for delay)")
_fault_command("cut-cable", "Pull a QSFP cable: link down on both ends.", _IFACE)
_fault_command("stop-sshd", "Stop the node's management sshd.")
_fault_command("rotate-hostkey", "New sshd host key (not written to the lab's known_hosts).")
_fault_command("occupy-port", "A listener in the node holds a TCP port.",
               click.option("--port", type=int, required=True))
_fault_command("disk-full", f"Mount a full {DISK_FULL_SIZE} tmpfs over the node's /var.")
_fault_command("delay", "Delay (and drop) frames leaving an interface of the node.", _IFACE,
               click.option("--ms", type=float, required=True),
               click.option("--loss", type=float, default=None, help="percent of frames lost"))
_fault_command("engine-hang", "The simulated engine hangs (flag file in the node).")
_fault_command("rank-die", "A simulated engine rank dies (flag file in the node).")
_fault_command("block-registry", "The node cannot reach any container registry: `docker pull` "
               "fails as with no DNS/route to it (flag file in the node); `docker save`/`load` "
               "still work. Undo: `fault restore --node NODE`.")
_fault_command("gpu-throttle", "The GPU falls into the GB10's low-power state: nvidia-smi answers "
               "97 % busy at 702 of 3003 MHz, no throttle reason (simulated; the real one needs a "
               "full power cycle). Undo: `fault restore --node NODE`.")
_fault_command("gpu-hot", "The GPU runs hot: nvidia-smi answers 93 °C under load with the SW "
               "thermal slowdown active (simulated). Undo: `fault restore --node NODE`.")
_fault_command("change-address", "Replace an interface's addresses by hand.", _IFACE,
               click.option("--address", required=True, help="e.g. 192.168.200.99/24"))
_fault_command("set-mtu", "Change an interface's MTU by hand.", _IFACE,
               click.option("--mtu", type=int, required=True))
_fault_command("roce-mtu", "The RoCE device behind an interface runs RDMA at a smaller active MTU "
               "(ibv_devinfo's active_mtu; default 1024, as when a link came up at MTU 1500).",
               click.option("--interface", default="enp1s0f1np1", show_default=True,
                            help="the fabric interface whose RoCE device it is"),
               click.option("--mtu", type=click.Choice(["256", "512", "1024", "2048"]),
                            default="1024", show_default=True))

_fault_command("squeeze-memory", "Hold SIZE of the node's memory (as its /proc/meminfo counts, "
               "e.g. 40G; real = SIZE / memory scale) in a process of the node.",
               click.option("--size", required=True, help="e.g. 40G (node units)"))


@fault.command(name="switch-mtu")
@click.argument("mtu", type=int)
def switch_mtu_command(mtu: int) -> None:
    """Set the fabric switch's ports to MTU (e.g. 1500: no jumbo frames)."""
    from sparklab.cli import _fail, _ident

    try:
        rec = inject(_ident(), "switch-mtu", SWITCH, mtu=mtu)
    except LabError as err:
        _fail(err)
        return
    click.echo(f"fault {describe(rec)} injected")


@fault.command(name="restore")
@click.option("--node", default=None, help="only this node's faults")
def restore_command(node: str | None) -> None:
    """Undo recorded faults (all, or one node's), newest first."""
    from sparklab.cli import _fail, _ident

    try:
        undone = restore(_ident(), node)
    except LabError as err:
        _fail(err)
        return
    click.echo(f"restored {len(undone)} fault(s)" +
               (": " + ", ".join(describe(r) for r in undone) if undone else ""))
