"""`launch RECIPE --rolling`: replace the replicas of RECIPE one at a time, dropping nothing.

Each replica in turn: out of the gateway (`DELETE /workers/ID` in the router, and its relay's
door closes), its requests in flight drain, it is relaunched with
the recipe as it is now (a changed config or image: `launch --replace` on its own nodes, under
its own name and port, bound where it was, with its own API key and --persist as recorded: a
rolling command naming other ones is refused; launch's readiness wait and smoke test), then
back into the gateway, then the next. With one replica it would mean downtime: refused unless
--allow-downtime.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from orchestrator.records import Server

DRAIN_TIMEOUT = 120.0
"""Seconds to wait for a replica's requests in flight before relaunching it anyway."""


def _note(line: str) -> None:
    click.echo(line, err=True)


def replicas_of(found: list[Server], recipe: str) -> list[Server]:
    """The servers started from RECIPE (by recipe name), each once, in name order."""
    seen: dict[str, Server] = {}
    for server in found:
        if server.record.recipe == recipe and not server.migrated:
            seen.setdefault(server.name, server)
    return [seen[name] for name in sorted(seen)]


def check_replicas(replicas: list[Server], recipe: str, allow_downtime: bool) -> None:
    from orchestrator.errors import InputError

    if not replicas:
        raise InputError(f"no server of recipe {recipe} runs: --rolling replaces running "
                         f"replicas; start them with `sparkctl launch {recipe} --nodes NODE "
                         "--name NAME`")
    if len(replicas) < 2 and not allow_downtime:
        only = replicas[0]
        raise InputError(f"only one replica of {recipe} runs ({only.name} on "
                         f"{', '.join(only.nodes)}): a rolling relaunch would "
                         "stop serving meanwhile; start a second replica (`sparkctl launch "
                         f"{recipe} --nodes NODE --name NAME`) or pass --allow-downtime")


def kept_options(server: Server, opts: dict[str, Any]) -> dict[str, Any]:
    """The options replica SERVER is relaunched with: its own as recorded (where it binds,
    whether it has an API key, --persist), never the rolling command's defaults. InputError
    (exit 2, before any replica is touched) when the command names one that differs: a
    rolling relaunch replaces the code and config, not how a replica is reached."""
    from orchestrator.errors import InputError

    host = server.record.host or "127.0.0.1"
    keyed, persistent = bool(server.record.api_key_file), server.record.persistent
    given = opts.get("host") or "127.0.0.1"
    differ = []
    if given not in ("127.0.0.1", host):
        differ.append(f"--host {given} (it binds {host})")
    if opts.get("api_key_file") and not keyed:
        differ.append("--api-key-file (it has no API key)")
    if opts.get("persist") and not persistent:
        differ.append("--persist (it is not persistent)")
    if differ:
        raise InputError(
            f"--rolling keeps each replica's own host, API key and --persist, and replica "
            f"{server.name} differs: {'; '.join(differ)}; leave these options out, or "
            f"relaunch it alone (`sparkctl launch RECIPE --name {server.name} --replace "
            "...`)")
    return {"host": host, "keyed": keyed, "persist": persistent}


def others_serve(session: Any, inventory: Any, recipe: str, name: str) -> bool:
    """Whether a replica of RECIPE other than NAME answers /health now (only a dead NAME may
    go without one: it serves nothing anyway)."""
    from orchestrator.engines import servers

    found = replicas_of(servers.gather(session.transports, inventory, probe=True,
                                       alive_only=False), recipe)
    this = next((s for s in found if s.name == name), None)
    return this is None or this.health != 200 or any(
        s.health == 200 for s in found if s.name != name)


def rolling(recipe_name: str, inventory_path: str | None, allow_downtime: bool,
            relaunch: Callable[[Server, Any], int], note: Callable[[str], None] = _note,
            check: Callable[[Server], Any] = lambda server: None) -> int:
    """Relaunch every replica of RECIPE in turn; `relaunch(server, transport)` is launch's body
    for it (the transport reaches its node: its recorded key is read there); `check(server)`
    refuses a replica before any is touched."""
    from orchestrator.core.runner import load_inventory_option
    from orchestrator.core.session import open_session
    from orchestrator.engines import load_recipe, servers
    from orchestrator.gateway import control as gateway

    recipe = load_recipe(recipe_name)
    inventory, _ = load_inventory_option(inventory_path)
    with open_session(inventory, "launch --rolling", quiet=True) as session:
        found = servers.gather(session.transports, inventory, probe=True, alive_only=False)
        # the ones not serving first: relaunching them costs no capacity, and each healthy
        # one then leaves only while another serves
        replicas = sorted(replicas_of(found, recipe.name), key=lambda s: s.health == 200)
        check_replicas(replicas, recipe.name, allow_downtime)
        for server in replicas:
            check(server)
        probes = gateway.probe_all(session.transports, liveliness=False)
        note(f"rolling: {len(replicas)} replica(s) of {recipe.name}: "
             + ", ".join(f"{s.name} on {s.node}" for s in replicas))
        started = time.monotonic()
        progress = Progress()
        previous = signal.signal(signal.SIGINT, progress.on_interrupt)
        try:
            for index, server in enumerate(replicas, 1):
                _roll_one(session, inventory, recipe.name, server, probes, allow_downtime,
                          relaunch, note, f"[{index}/{len(replicas)}]", progress)
        except BaseException as exc:
            # launch turns Ctrl-C into its own errors (a failed readiness step, exit 130):
            # the signal itself says whether the user stopped the run
            note(progress.stopped(reopen=progress.interrupted or isinstance(exc, KeyboardInterrupt)))
            raise
        finally:
            signal.signal(signal.SIGINT, previous)
        note(f"rolling: {len(replicas)} replica(s) of {recipe.name} replaced in "
             f"{time.monotonic() - started:.0f} s")
    return 0


class Progress:
    """What a rolling run changed so far, for the message when it stops part way: the replicas
    relaunched, and the one whose door is closed right now. Interrupted (Ctrl-C), that door
    opens again: the replica serves as before, or its refused connections are retried on the
    others. After a failed relaunch it stays closed (the server may answer wrongly) and the
    message says so; `gateway up` and `status` see it closed."""

    def __init__(self) -> None:
        self.replaced: list[str] = []
        self.out: tuple[str, Any] | None = None  # (server, its node's transport)
        self.relaunching = ""
        self.interrupted = False
        self.transports: dict[str, Any] = {}

    def on_interrupt(self, signum: int, frame: Any) -> None:
        """SIGINT: remembered, then Python's own KeyboardInterrupt."""
        self.interrupted = True
        signal.default_int_handler(signum, frame)

    def stopped(self, reopen: bool) -> str:
        from orchestrator.gateway import control as gateway

        reopened = ""
        if self.out is not None and not reopen:
            reopened = (f"; {self.out[0]} is OUT of the gateway's rotation until `sparkctl "
                        "gateway up` puts it back")
        elif self.out is not None:
            name, transport = self.out
            try:
                gateway.set_in_rotation(transport, name, True)
                gateway.router_request(self.transports, {"workers": None, "wait": 10})
                reopened = f"; {name} is back in the gateway's rotation"
            except Exception as exc:  # the node may be what failed: say what to run
                reopened = (f"; {name} is still OUT of the gateway's rotation ({exc}): "
                            "`sparkctl gateway up` puts it back")
        replaced = ", ".join(self.replaced) or "none"
        during = (f"; stopped while relaunching {self.relaunching} (it may be down or half "
                  "replaced: `sparkctl status`)") if self.relaunching else ""
        return f"rolling: stopped part way: replaced {replaced}{during}{reopened}"


def _roll_one(session: Any, inventory: Any, recipe: str, server: Server,
              probes: dict[str, Any], allow_downtime: bool,
              relaunch: Callable[[Server, Any], int], note: Callable[[str], None],
              step: str, progress: Progress) -> None:
    """One replica: out of the gateway and drained, relaunched, back in."""
    from orchestrator.errors import EXIT_INTERRUPTED, SparkctlError
    from orchestrator.gateway import control as gateway
    from orchestrator.gateway.follow import follow

    name, node = server.name, server.node
    transport = session.transports.get(node)
    if transport is None:
        raise SparkctlError(f"cannot reach {node}, where replica {name} runs")
    on_node = probes.get(node)
    routed = on_node is not None and name in on_node.relays
    if not allow_downtime and not others_serve(session, inventory, recipe, name):
        raise SparkctlError(
            f"rolling: no other replica of {recipe} answers now, so taking {name} "
            "out would stop serving: relaunch the others first, or pass --allow-downtime")
    if routed:
        note(f"rolling {step} {name}: out of the gateway, draining")
        progress.out = (name, transport)
        progress.transports = session.transports
        gateway.drain(transport, name, DRAIN_TIMEOUT, note, session.transports)
    note(f"rolling {step} {name}: relaunching on {node}")
    progress.relaunching = name
    code = relaunch(server, transport)
    if code != 0 and progress.interrupted:
        raise SparkctlError(f"rolling: interrupted while relaunching {name} on {node}",
                            EXIT_INTERRUPTED)
    if code != 0:
        raise SparkctlError(
            f"rolling: relaunching {name} on {node} failed (exit {code}; see above); "
            f"{'it stays out of the gateway; ' if routed else ''}the replicas not yet "
            "replaced keep serving")
    progress.relaunching = ""
    progress.replaced.append(name)
    if routed:
        gateway.set_in_rotation(transport, name, True)
        # back into the router (POST /workers, its key read again: a rolling relaunch may
        # rotate it); this waits until the router lists it healthy
        follow(session.transports, inventory, note)
        progress.out = None
        note(f"rolling {step} {name}: back in the gateway")


def rolling_launch(opts: dict[str, Any], _launch: Callable[..., int]) -> None:
    """`launch --rolling` from launch's options: each replica relaunched by launch's own body
    (`_launch`, passed in: this module is launch's helper and must not import it back), on its
    nodes, under its name and port, replacing it (--yes: the rolling run was asked for)."""
    from orchestrator.cli import run_command
    from orchestrator.errors import InputError

    def body() -> int:
        if not opts["rolling"]:
            raise InputError("--allow-downtime goes with --rolling")
        if opts["placed"] or opts["name"] or opts["port"] or opts["dry_run"]:
            raise InputError("--rolling relaunches the running replicas where they are, under "
                             "their names and ports: leave out --nodes, --name, --port and "
                             "--dry-run")

        def relaunch(server: Server, transport: Any) -> int:
            import tempfile

            from orchestrator.engines.apikey import key_copy

            kept = kept_options(server, opts)
            with tempfile.TemporaryDirectory(prefix="sparkctl-rolling-") as folder:
                key_file = opts.get("api_key_file")  # (a new key: the user's own file)
                if kept["keyed"] and not key_file:  # its recorded key, read from its node
                    key_file = key_copy(transport, server.record, Path(folder))
                return _launch(
                    opts["recipe_name"], opts["inventory_path"], False, True, False,
                    opts["timeout"], True, kept["host"], opts["drop_caches"],
                    opts["hf_token_file"], opts["trust_new_hosts"], opts["break_lock"],
                    opts["ignore_memory"], opts["guard_min_available_gb"],
                    tuple(server.nodes), server.name, server.record.port,
                    not opts["drop_caches"], kept["persist"],
                    opts["distribute_image"], key_file, early=False)

        return rolling(opts["recipe_name"], opts["inventory_path"], opts["allow_downtime"],
                       relaunch, check=lambda server: kept_options(server, opts))

    run_command(body)
