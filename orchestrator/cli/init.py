"""`sparkctl init HOST HOST...`: find how the nodes are cabled and write an inventory.

It connects like every other command (remote/connect.py: host keys verified, ssh_config read),
and reads on each node: `ibdev2netdev` and `hostname`, which machines answer on each fabric
interface (node/peers.py: a link-local ping, nothing changed), and the netplan files and links
(the facts gatherer). A network other files already give the fabric (NVIDIA Sync's, a manual
one) is adopted as it is (netcheck/adoption.py); otherwise netcheck/layout.py recognises the
layout (two back to back, a ring, a switch) and the addresses `up` will give it. Then it writes
a commented inventory that `plan` and `up` accept. `--example` prints the example inventory
shipped inside the package instead.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from orchestrator.cli import CONTEXT, run_command
from orchestrator.cli.verbosity import verbosity_option
from orchestrator.remote.gathered import NodeFacts

if TYPE_CHECKING:
    from orchestrator.netcheck.cabling import NodeLinks
    from orchestrator.netcheck.layout import Layout, Reach

EXAMPLE = "two-sparks.yml"
MANAGEMENT_CMD = ("ip -o addr show to \"$(echo $SSH_CONNECTION | cut -d' ' -f3)\" "
                  "| awk '{print $2; exit}'")


def example_text() -> str:
    """The example inventory: installed, orchestrator/inventories in the wheel (pyproject's
    package-dir); from a checkout, ./inventories (as render.py finds templates)."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "inventories" / EXAMPLE
    return (installed if installed.exists() else package.parent / "inventories" / EXAMPLE).read_text()


@dataclass(frozen=True)
class Probed:
    """What init read on every node, in the order of the hosts given."""

    nodes: list[NodeLinks]
    peers: list[dict[str, Any]]
    """node/peers.py's answer per node: which MACs answered on each fabric interface."""
    facts: list[NodeFacts | None]
    """The gatherer's answer per node: netplan files and links (None: not readable as root)."""

    def reach(self) -> Reach:
        from orchestrator.netcheck.layout import reach_from

        return reach_from(self.peers, [node.host for node in self.nodes])

    def layout(self) -> Layout:
        """An adopted network when other netplan files address the fabric, else the layout."""
        from orchestrator.netcheck.adoption import adopt
        from orchestrator.netcheck.layout import choose_layout

        reach = self.reach()
        # a node whose netplan files could not be read (no sudo) leaves only the cabling to judge
        readable = [facts for facts in self.facts if facts is not None]
        adopted = (adopt([node.host for node in self.nodes], readable, reach)
                   if len(readable) == len(self.facts) else None)
        return adopted or choose_layout(self.nodes, reach)


def _probe(hosts: tuple[str, ...], user: str | None, ssh_key: str | None,
           known_hosts: str | None, trust_new_hosts: bool) -> Probed:
    """Connect to every host and read its hostname, ibdev2netdev, who answers on each fabric
    interface, its netplan files and links."""
    from pydantic import ValidationError

    from orchestrator.commands import python_script_cmd
    from orchestrator.errors import InputError, SparkctlError
    from orchestrator.inventory import Inventory
    from orchestrator.inventory_checks import format_validation_error
    from orchestrator.netcheck.cabling import PORTS, NodeLinks, parse_ibdev2netdev
    from orchestrator.node import script
    from orchestrator.remote.cluster import Cluster
    from orchestrator.remote.connect import connect_all
    from orchestrator.remote.facts import gather_facts, request_of
    from orchestrator.remote.node_facts import LINKS, NETPLAN_FILES
    from orchestrator.remote.transport import SudoPassword, Transport

    cluster: dict[str, object] = {"name": "init"}
    for key, value in (("user", user), ("ssh_key", ssh_key), ("known_hosts", known_hosts)):
        if value:
            cluster[key] = value
    data = {"cluster": cluster,
            "nodes": [{"name": f"host-{i + 1}", "host": host} for i, host in enumerate(hosts)]}
    try:
        inventory = Inventory.model_validate({**data, "source": "<init>"})
    except ValidationError as exc:
        raise InputError(format_validation_error(exc, data, "sparkctl init")) from None
    by_name = {node.name: node.host for node in inventory.nodes}
    transports, errors = connect_all(inventory, inventory.nodes, SudoPassword(prompt=False),
                                     trust_new_hosts)
    try:
        if errors:
            raise SparkctlError("init: cannot connect: " + "; ".join(
                f"{by_name[name]}: {message}" for name, message in errors.items()))

        fabric = [name for twins in PORTS.values() for name in twins]

        def read(name: str, transport: Transport) -> tuple[NodeLinks, dict[str, Any], NodeFacts | None]:
            click.echo(f"  {by_name[name]}: ibdev2netdev, link-local peers, netplan", err=True)
            links = transport.run("ibdev2netdev", timeout=30).check()
            hostname = transport.run("hostname", timeout=30).check().stdout.strip()
            # the interface sshd answered on is the management one (SSH_CONNECTION's 3rd field)
            where = transport.run(MANAGEMENT_CMD, timeout=30)
            probe = transport.run(python_script_cmd({"interfaces": fabric}),
                                  stdin=script("peers.py"), timeout=60,
                                  display="python3 - <link-local peer probe>").check()
            try:
                peers = json.loads(probe.stdout)
            except json.JSONDecodeError:
                raise SparkctlError(f"{by_name[name]}: the peer probe printed no JSON: "
                                    f"{probe.stderr.strip()[-300:]!r}") from None
            try:  # netplan files are 0600 root: the gatherer runs under sudo
                facts = gather_facts(transport, request_of(NETPLAN_FILES, LINKS))
            except SparkctlError as exc:
                click.echo(f"  {by_name[name]}: warning: cannot read /etc/netplan as root "
                           f"({str(exc).strip()[-200:]}); a network NVIDIA Sync or a hand "
                           "configured cannot be adopted without it: judging the cabling only",
                           err=True)
                facts = None
            return (NodeLinks(by_name[name], hostname or by_name[name],
                              parse_ibdev2netdev(links.stdout),
                              management=where.stdout.strip() if where.ok else ""),
                    peers, facts)

        found = Cluster(transports).values(read)
        ordered = [found[node.name] for node in inventory.nodes]
        return Probed([o[0] for o in ordered], [o[1] for o in ordered], [o[2] for o in ordered])
    finally:
        for transport in transports.values():
            transport.close()


def _init(hosts: tuple[str, ...], user: str | None, ssh_key: str | None,
          known_hosts: str | None, trust_new_hosts: bool, output: str, yes: bool,
          example: bool, name: str) -> int:
    from orchestrator.errors import InputError
    from orchestrator.netcheck.cabling import InitSettings, inventory_text

    if example:
        text = example_text()
        if output == "-":
            click.echo(text, nl=False)
        else:
            _write(Path(output), text, yes)
        return 0
    if not hosts:
        raise InputError("init: name the nodes' hosts (management addresses or ssh_config "
                         "aliases): `sparkctl init spark-a spark-b`, or --example")
    if len(set(hosts)) != len(hosts):
        raise InputError(f"init: a host is named twice: {' '.join(hosts)}")
    click.echo(f"sparkctl init: reading the fabric ports of {len(hosts)} node(s)", err=True)
    probed = _probe(hosts, user, ssh_key, known_hosts, trust_new_hosts)
    layout = probed.layout()
    click.echo(f"Fabric: {layout.reason}.", err=True)
    text = inventory_text(InitSettings(name, user, ssh_key, known_hosts), probed.nodes, layout)
    _check(text, output)
    if output == "-":
        click.echo(text, nl=False)
        return 0
    path = Path(output)
    click.echo(text, err=True, nl=False)
    if not _write(path, text, yes):
        return 1
    click.echo(f"Next: sparkctl plan --inventory {path}   then   sparkctl up --inventory {path}",
               err=True)
    return 0


def _absolute(value: str | None) -> str | None:
    """A relative path made absolute: the inventory resolves paths against its own folder,
    which need not be the folder init ran in."""
    if not value or value.startswith("~") or Path(value).is_absolute():
        return value
    return str(Path(value).resolve())


def _check(text: str, path: str) -> None:
    """The inventory must load as `plan` loads it, before anything is written."""
    import yaml

    from orchestrator.inventory_checks import inventory_from_data

    inventory_from_data(yaml.safe_load(text), path)


def _write(path: Path, text: str, yes: bool) -> bool:
    """Write the inventory: never through a symlink (it may point anywhere: the file is
    replaced, the link's target untouched), never into a directory, and an existing file only
    after a yes (the question defaults to no: an inventory may hold hours of edits)."""
    import os

    from orchestrator.errors import InputError

    if path.is_symlink():
        raise InputError(f"init: {path} is a symbolic link (to {os.readlink(path)}); refusing to "
                         "write through it: name the file itself with -o")
    if path.exists() and path.is_dir():
        raise InputError(f"init: {path} is a directory; name a file with -o")
    if not yes:
        if not sys.stdin.isatty():
            raise InputError(f"init: not on a terminal; add --yes to write {path}")
        exists = path.exists()
        if not click.confirm(f"{'Overwrite' if exists else 'Write'} {path}?", default=not exists,
                             err=True):
            click.echo("Nothing written.", err=True)
            return False
    try:
        # a new file, moved into place: an open (O_NOFOLLOW) never follows a link made meanwhile
        temporary = path.with_name(f".{path.name}.sparkctl-init")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(temporary, path)
    except OSError as exc:
        raise InputError(f"init: cannot write {path}: {exc.strerror or exc}") from None
    click.echo(f"Wrote {path}", err=True)
    return True


@click.command(context_settings=CONTEXT)
@click.argument("hosts", nargs=-1, metavar="HOST...")
@click.option("--user", "-u", metavar="U", help="SSH user on every node (default: ssh_config, else nvidia).")
@click.option("--ssh-key", metavar="K",
              help="Private key for the nodes (default: ssh_config, agent, ~/.ssh/id_*).")
@click.option("--known-hosts", metavar="FILE",
              help="Pinned host keys file to read and to pin into (default ~/.ssh/known_hosts).")
@click.option("--trust-new-hosts", is_flag=True,
              help="Pin unknown SSH host keys on first use (a changed key is always refused).")
@click.option("--name", default="sparks", show_default=True, metavar="NAME",
              help="The cluster's name in the inventory.")
@click.option("--output", "-o", metavar="FILE",
              help="Where to write the inventory (default sparks.yml; with --example: stdout; "
                   "- prints it).")
@click.option("--yes", "-y", is_flag=True, help="Write without asking (needed when not on a terminal).")
@click.option("--example", is_flag=True,
              help="Write (or with -o - print) the example two-Spark inventory shipped with sparkctl.")
@verbosity_option
def init(hosts: tuple[str, ...], user: str | None, ssh_key: str | None, known_hosts: str | None,
         trust_new_hosts: bool, name: str, output: str | None, yes: bool, example: bool) -> None:
    """Write an inventory for these Sparks: finds how they are cabled and addressed.

    \b
    Connects to every HOST (host keys verified, ~/.ssh/config read), reads `ibdev2netdev`, who
    answers on each fabric port (a link-local ping; nothing is changed) and the netplan files.
    A network other files already give the fabric (NVIDIA Sync's 99-nvidia-sync-cluster.yaml,
    a manual one) is adopted as it is: `network: adopted`, verified, never rewritten.
    Otherwise it recognises NVIDIA's layouts: two back to back, three in a ring, up to eight
    behind a switch, and proposes one /24 per twin (per ring link: a pair of /24s; node i at
    .12+i). Writes a commented inventory that `plan` and `up` accept. Refuses (exit 2), naming
    what it found, cabling that matches no layout or a network it cannot adopt.
    See docs/inventory.md and docs/up.md.
      sparkctl init spark-a spark-b -o two-sparks.yml
      sparkctl init --example -o -        # the example inventory
    """
    target = output or ("-" if example else "sparks.yml")
    run_command(lambda: _init(hosts, user, _absolute(ssh_key), _absolute(known_hosts),
                              trust_new_hosts, target, yes, example, name))
