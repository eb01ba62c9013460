"""`sparkctl advise --measure`: launch each layout that fits in turn, bench the same cells each
time, and restore what was running before. In-process, through the same seams `launch` and
`bench` use (the engine's launch phases under the cluster lock, Bench through an SSH forward),
whatever the engine: a layout's servers come from its LayoutSupport.recipe_for.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click

from orchestrator.remote.fact_records import CommandResult

if TYPE_CHECKING:
    from orchestrator.records import Server

Note = Callable[[str], None]


def _launch(inventory: Any, recipe: Any, name: str | None, timeout: float, token: Any,
            note: Note, persist: bool = False, host: str | None = None, key: Any = None) -> None:
    """The plan `sparkctl launch RECIPE --replace --yes` runs (cli/launch_plan.py: every
    check), under the cluster lock."""
    from orchestrator.cli.launch_plan import checked_recipe, launch_plan
    from orchestrator.core.lock import ClusterLock
    from orchestrator.core.session import open_session, run_plan
    from orchestrator.core.step import RunOptions
    from orchestrator.errors import SparkctlError
    from orchestrator.recipe import DEFAULT_HOST, LaunchOptions

    recipe = checked_recipe(recipe, inventory)
    options = LaunchOptions(replace=True, timeout=timeout, name=name, persist=persist,
                            api_key=key, host=host or DEFAULT_HOST)
    plan = launch_plan(recipe, inventory, options)
    with open_session(inventory, "launch", quiet=True) as session:
        head = inventory.head_name
        if head not in session.transports or session.unreachable:
            raise SparkctlError(f"cannot launch {recipe.name}: unreachable: "
                                f"{', '.join(session.unreachable) or head}")
        lock = ClusterLock(head, session.transports[head], "advise --measure")
        try:
            run_plan(session, plan, RunOptions(command="launch", hf_token=token, progress_note=note), lock)
        finally:
            lock.release()
        report = session.report
        if not report.ok:
            failed = [f"{node}: {s.step}: {s.message}" for node, h in report.hosts.items()
                      for s in h.steps if s.status == "failed"]
            failed += [f"{node}: {h.error}" for node, h in report.hosts.items() if h.error]
            raise SparkctlError(f"launch of {name or recipe.name} failed: "
                                + "; ".join(failed)[-600:])


def _bench(inventory: Any, server: str, config: Any, note: Note) -> dict[str, Any]:
    from orchestrator.cli.bench import Bench
    from orchestrator.core.session import open_session
    from orchestrator.remote.tunnel import Forwarder

    with open_session(inventory, "bench", quiet=True) as session:
        bench = Bench(session, inventory, server)
        with Forwarder(bench.transport, bench.server.record.port) as forward:
            return bench.measure(config, forward.local_port)


def _tg(doc: dict[str, Any], concurrency: int) -> float | None:
    from orchestrator.bench.run import figure

    cells = [c for c in doc.get("cells", []) if c["concurrency"] == concurrency]
    return figure(cells[0], "tg_throughput") if cells else None


def _servers(inventory: Any, nodes: list[str]) -> tuple[list[Server], dict[str, Any]]:
    """The running servers, each marked `persistent` when it has a boot unit (launch
    --persist), so the restore keeps it persistent; and the API key of each one on NODES that
    has one, read from its node now (the restore starts it with the same key)."""
    from orchestrator.core.session import open_session
    from orchestrator.engines import servers
    from orchestrator.engines.apikey import read_node_key
    from orchestrator.phases.boot_units import parse_units, persistence, units_cmd

    keys: dict[str, Any] = {}
    with open_session(inventory, "advise", quiet=True) as session:
        found = servers.gather(session.transports, inventory)
        units = {name: parse_units(CommandResult(0, t.run(units_cmd(), timeout=30).stdout, ""))
                 for name, t in session.transports.items()} if found else {}
        for server in found:
            transport = session.transports.get(server.node)
            if server.record.api_key_file and set(server.nodes) & set(nodes) \
                    and transport is not None:
                keys[server.name] = read_node_key(transport, server.record)
    return [replace(s, record=replace(s.record, persistent=bool(
        persistence(units, s.name)["persistent"]))) for s in found], keys


def _stop(inventory: Any, wanted: Callable[[Server], bool], note: Note) -> None:
    from orchestrator.core.session import open_session
    from orchestrator.engines import servers

    with open_session(inventory, "advise", quiet=True) as session:
        for server in servers.gather(session.transports, inventory):
            if wanted(server):
                note(f"[advise] stopping {server.name} on {', '.join(server.nodes)}")
                servers.stop_server(session.transports, inventory, server)


def _measure_one(advice: Any, entry: Any, inventory: Any, nodes: list[str], opts: dict[str, Any],
                 token: Any, note: Note) -> Any:
    from orchestrator.advise.advice import Measured
    from orchestrator.bench.run import BenchConfig
    from orchestrator.engines.layouts import Layout, support_of

    support = support_of(advice.engine)
    layout = entry.layout
    # the concurrency dealt out over the servers as evenly as it goes (4 over 3: 2, 1, 1)
    c, n = advice.concurrency, layout.servers
    shares = [c // n + (index < c % n) for index in range(n)]
    names = []
    for index in range(layout.servers):
        if support is None:
            one, name = advice.recipe, None
        elif layout.servers > 1:  # a replica: a single-node server of its own name and node
            one = support.recipe_for(advice.recipe, Layout("single"), [nodes[index]])
            name = f"{advice.recipe.name}-r{index + 1}"
        else:
            one, name = support.recipe_for(advice.recipe, layout, nodes[:layout.nodes]), None
        note(f"[advise] {layout.label}: launching {name or one.name} on "
             f"{', '.join(nodes[index:index + 1] if layout.servers > 1 else nodes[:layout.nodes])}")
        _launch(inventory, one, name, opts["timeout"], token, note)
        names.append(name or one.name)
    # replicas are on nodes of their own: each is benched with its share of the requests and
    # the aggregates add up (one after the other: no node is shared)
    docs = [(_bench(inventory, name, BenchConfig(
        tg=[opts["tg"]], pp=[opts["pp"]], depth=[0], concurrency=sorted({1, max(share, 1)}),
        runs=opts["runs"], warmup=False), note), share) for name, share in zip(names, shares, strict=True)]
    if any(d.get("interrupted") for d, _ in docs):
        raise KeyboardInterrupt  # (bench keeps its partial cells; advise stops measuring)
    ones = [v for d, _ in docs if (v := _tg(d, 1)) is not None]
    parts = [_tg(d, share) if share else 0.0 for d, share in docs]
    aggregate = sum(v for v in parts if v is not None) if None not in parts else None
    return Measured(sum(ones) / len(ones) if ones else None, aggregate)


def confirm(opts: dict[str, Any], labels: list[str], before: list[Server]) -> None:
    from orchestrator.errors import InputError

    what = (f"launch {', '.join(labels)} in turn"
            + (f", stopping {', '.join(s.name for s in before)} meanwhile"
               if before else ""))
    if opts["yes"]:
        return
    if not sys.stdin.isatty():
        raise InputError(f"advise --measure would {what}; stdin is not a terminal: pass --yes")
    if not click.confirm(f"advise --measure will {what}. Go on?", default=False, err=True):
        raise InputError("cancelled; nothing was changed", 1)


def measure(advice: Any, opts: dict[str, Any], note: Note) -> int:
    """Measure every layout that fits; returns the exit code (1 if none could be measured)."""
    from orchestrator.cli.launch import read_hf_token
    from orchestrator.core.executor import Interrupted
    from orchestrator.core.runner import load_inventory_option
    from orchestrator.errors import InputError, SparkctlError

    inventory, _ = load_inventory_option(opts["inventory_path"])
    nodes = [n.name for n in inventory.ordered_nodes()][: advice.nodes]
    if len(nodes) < advice.nodes:
        raise InputError(f"--nodes {advice.nodes}: the inventory {inventory.source} has "
                         f"{len(nodes)} node(s)")
    feasible = [a for a in advice.layouts if a.fits]
    # servers on the nodes advise uses are stopped meanwhile and relaunched; others keep running
    running, keys = _servers(inventory, nodes)
    before = [s for s in running if set(s.nodes) & set(nodes)]
    keep = {s.name for s in running if s not in before}
    confirm(opts, [a.layout.label for a in feasible], before)
    from orchestrator.advise.advice import Measured

    token = read_hf_token(None)
    interrupted = False
    try:
        if before:
            _stop(inventory, lambda s: s.name not in keep, note)
        for entry in feasible:
            try:
                entry.measured = _measure_one(advice, entry, inventory, nodes, opts, token, note)
            except (KeyboardInterrupt, Interrupted):  # keep what was measured; still clean up
                # and restore (a Ctrl-C inside a launch comes as Interrupted, inside a bench
                # as KeyboardInterrupt raised by _measure_one)
                entry.measured, interrupted = Measured(None, None, "interrupted"), True
                note(f"[advise] interrupted during {entry.layout.label}: stopping it, restoring")
                break
            except SparkctlError as exc:
                entry.measured = Measured(None, None, str(exc))
                note(f"[advise] {entry.layout.label}: {exc}")
            finally:
                _stop(inventory, lambda s: s.name not in keep, note)
    finally:
        restored, stopped = _restore(inventory, before, opts["timeout"], token, note, keys)
    advice.choose(measured=True)
    ratios = [f"{a.layout.label} {r:.2f}" for a in feasible
              if (r := a.ratio(advice.goal)) is not None]
    if ratios:  # how far this cluster is from the model: a measured efficiency, per layout
        advice.notes.append("measured / predicted: " + ", ".join(ratios) + f" (at {advice.goal})")
    advice.notes.append(restored)
    if interrupted or stopped:
        advice.notes.append("interrupted: the layouts after it were not measured")
        return 130  # (the documented exit of an interrupted command)
    return 0 if advice.pick is not None and "could not" not in restored else 1


def _restore(inventory: Any, before: list[Server], timeout: float, token: Any,
             note: Note, keys: dict[str, Any] | None = None) -> tuple[str, bool]:
    """Relaunch the servers that ran before, as they ran: from the recipe file they were
    launched from (else the built-in), under their name, nodes and port, bound where they
    were, with their API key and --persist. Returns what it says of that, and whether a
Ctrl-C stopped it."""
    from orchestrator.core.executor import Interrupted
    from orchestrator.engines import load_recipe
    from orchestrator.engines.layouts import revalidated
    from orchestrator.errors import SparkctlError

    if not before:
        return "restored: nothing ran before; every server advise started is stopped", False
    failed: list[str] = []
    stopped = False
    for server in before:
        try:
            record = server.record
            recipe = load_recipe(record.recipe_file or record.recipe)
            # every server records where it ran
            recipe = revalidated(recipe, port=record.port or recipe.port,
                                 placement=list(record.nodes) or None)
            name = server.name if server.name != recipe.name else None
            note(f"[advise] restoring {server.name} ({recipe.name})")
            _launch(inventory, recipe, name, timeout, token, note,
                    persist=record.persistent, host=record.host,
                    key=(keys or {}).get(server.name))
        except (KeyboardInterrupt, Interrupted):
            failed += [f"{s.name} (interrupted)" for s in before[before.index(server):]]
            stopped = True
            break
        except SparkctlError as exc:
            failed.append(f"{server.name} ({exc})")
    if failed:
        return ("could not restore " + "; ".join(failed) + ": relaunch with `sparkctl launch`",
                stopped)
    return "restored: " + ", ".join(s.name for s in before) + " run again", False
