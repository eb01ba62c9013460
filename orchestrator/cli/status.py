"""`sparkctl status`, `sparkctl logs` and `sparkctl down` (see docs/operate.md)."""

from __future__ import annotations

from typing import Any

import click

from orchestrator.cli import CONTEXT, diff_option, inventory_option, json_option, run_command
from orchestrator.cli.completion import complete_server
from orchestrator.cli.verbosity import verbosity_option


def _status(inventory_path: str | None, as_json: bool, one_line: bool = False,
            deep: bool = False) -> int:
    from orchestrator.core.report import print_json
    from orchestrator.core.runner import load_inventory_option
    from orchestrator.status.assess import gather_status
    from orchestrator.status.render import render_status

    inventory, _ = load_inventory_option(inventory_path)
    result = gather_status(inventory)
    if deep:
        from orchestrator.status.models import verify_served_models

        verify_served_models(inventory, result)
    if as_json and one_line:  # status --watch --json: JSON lines
        import json

        click.echo(json.dumps(result))
    elif as_json:
        print_json(result)
    else:
        render_status(result)
        _render_servers(result["servers"])
        _render_gateway(result.get("gateway") or {})
        if deep:  # (every hash matching is said too: silence would read as "not checked")
            from orchestrator.status.models import verified_lines

            click.echo("\n" + "\n".join(verified_lines(result.get("models_verified") or [])))
    return 0 if result["ok"] else 1


def _render_gateway(gw: dict[str, object]) -> None:
    """One line per model behind the gateway (`sparkctl gateway status` has the details)."""
    if not gw.get("running"):
        return
    click.echo(f"\ngateway: {gw['host']}:{gw['port']} on {gw['node']}, key "
               f"{'on' if gw['key'] else 'off'}, {'live' if gw['live'] else 'NOT ANSWERING'}")
    models = gw.get("models")
    for model, count in (models.items() if isinstance(models, dict) else []):
        click.echo(f"  {model}: {count['replicas']} replica(s), {count['in_rotation']} in rotation")


def _render_servers(found: list[dict[str, object]]) -> None:
    from orchestrator.core.output import console
    from orchestrator.status.memory import metrics_text

    if not found:
        return
    out = console()
    out.print("\nservers:", markup=False)
    for s in found:
        listed = s.get("nodes")
        nodes = ",".join(map(str, listed)) if isinstance(listed, list) else s.get("node")
        where = f"{s.get('host') or '127.0.0.1'}:{s['port']}"  # where it binds, as recorded
        out.print(f"  {s['name']!s:20} {s['engine']!s:7} {nodes!s:16} {where:21} "
                  f"{s['state']!s:13} {s['model']}" + ("  (persistent)" if s.get("persistent") else ""),
                  markup=False)
        figures = metrics_text(s.get("metrics"))  # type: ignore[arg-type]
        if figures:
            out.print(f"  {'':20} {figures}", markup=False)
        dead = s.get("dead_nodes")
        if isinstance(dead, list) and dead:
            out.print(f"    its process on {', '.join(map(str, dead))} is gone: relaunch it",
                      markup=False)
        processes = s.get("processes")
        if isinstance(processes, list) and processes:
            out.print("    " + "; ".join(f"{p.get('node')}: {p.get('process') or '?'} "
                                         f"{p.get('rss_mb')} MB RSS" for p in processes
                                         if isinstance(p, dict)), markup=False)


@click.command(context_settings=CONTEXT)
@inventory_option
@json_option
@click.option("--watch", "-w", type=click.FloatRange(min=1), is_flag=False, flag_value=5.0,
              default=None, metavar="[SECONDS]",
              help="Look again every SECONDS (default 5), redrawn in place on a terminal "
                   "(with --json: one object per line). Ctrl-C ends it.")
@click.option("--deep", is_flag=True,
              help="Also hash every model file of the running servers again on their nodes "
                   "(ignoring the hash cache) against the head's; reads every byte.")
def status(inventory_path: str | None, as_json: bool, watch: float | None, deep: bool) -> None:
    """What runs on each node, and whether it is healthy (read from the nodes, not a cache).

    \b
    Per node: reachable, fabric links and addresses, the container (image digest, uptime,
    whether its configuration is current), memory (MemAvailable, GPU memory and utilisation
    where known, the memory guard's threshold), and the servers (recipe, model, health
    probed on their node's 127.0.0.1, the engine's own /metrics: requests running and
    waiting, KV cache, speculative acceptance).
    Exit 0: every node answered and nothing is unhealthy (a cluster not set up is fine).
    Exit 1: a node is unreachable, or something is unhealthy (listed under the table).
    """
    if watch is not None:
        from orchestrator.cli.status_watch import watch_status

        run_command(lambda: watch_status(lambda: _status(inventory_path, as_json, one_line=True,
                                                         deep=deep), watch, as_json))
    run_command(lambda: _status(inventory_path, as_json, deep=deep))


def _tail_value(text: str) -> int | None:
    from orchestrator.errors import InputError

    if text == "all":
        return None
    if not text.isdigit():
        raise InputError(f"--tail {text!r}: give a number of lines or 'all'")
    return int(text)


def _logs(inventory_path: str | None, nodes: tuple[str, ...], follow: bool, since: str | None,
          tail: str, server: str | None = None, as_json: bool = False) -> int:
    from orchestrator.core.runner import load_inventory_option
    from orchestrator.status.logs import run_logs

    inventory, _ = load_inventory_option(inventory_path)
    # server: one server's containers only
    return run_logs(inventory, list(nodes), follow, since, _tail_value(tail), server or None,
                    as_json=as_json)


@click.command(context_settings=CONTEXT)
@inventory_option
@click.option("--node", "-n", "nodes", multiple=True, metavar="NAME",
              help="Only this node (repeatable; default: every node).")
@click.option("--follow", "-f", is_flag=True, help="Keep streaming new lines from every node.")
@click.option("--since", metavar="T", help="Only lines since T: 30s, 10m, 2h, 1d, an ISO or Unix time.")
@click.option("--tail", default="100", show_default=True, metavar="N",
              help="Lines from the end of each log to start with ('all' for everything).")
@click.option("--server", metavar="NAME", shell_complete=complete_server,
              help="Only this server's own containers.")
@click.option("--json", "as_json", is_flag=True,
              help='JSON lines on stdout: {"node", "source", "line"} per log line.')
def logs(inventory_path: str | None, nodes: tuple[str, ...], follow: bool, since: str | None,
         tail: str, server: str | None, as_json: bool) -> None:
    """Container, server and rank logs of every node, interleaved, prefixed with node and source.

    \b
    Sources: `docker logs` of the container on each node; on the head server.log (mpirun's
    output); on each node rank-N.log (that rank's own output), from /var/lib/sparkctl/run.
    --follow streams from every node at once; Ctrl-C stops it (exit 130) and leaves nothing
    running on the nodes.
    """
    run_command(lambda: _logs(inventory_path, nodes, follow, since, tail, server, as_json))


def _down(inventory_path: str | None, network: bool, dry_run: bool, yes: bool, as_json: bool,
          trust_new_hosts: bool, break_lock: bool, server: str | None = None,
          oom_guard: bool = False, keep_logs: bool = False) -> int:
    from orchestrator.core.runner import RunRequest, execute, load_inventory_option
    from orchestrator.core.session import Session
    from orchestrator.core.step import Plan
    from orchestrator.engines.serverctl import down_parts
    from orchestrator.phases.teardown import build_down_plan

    inventory, _ = load_inventory_option(inventory_path)
    if oom_guard and (server or network):
        from orchestrator.errors import InputError

        raise InputError("--oom-guard removes only the earlyoom set-up; it does not go with "
                         "--server or --network")
    if server:
        return _down_server(inventory, server, dry_run, yes, as_json, trust_new_hosts, break_lock,
                            network, keep_logs)

    def build(session: Session) -> Plan:
        notes = session.report.notes
        session.report.extra["not_reached"] = list(session.unreachable)
        if session.unreachable:
            notes.append(
                f"Not reached: {', '.join(session.unreachable)}. What sparkctl created there is "
                "still in place; run `sparkctl down` again once it is reachable."
            )
        if oom_guard:
            return build_down_plan(inventory, network, down_parts(), oom_guard_only=True)
        notes.append("Kept: the Hugging Face model cache on every node (see docs/operate.md to remove it).")
        if not network:
            notes.append("Kept: the fabric network config (`sparkctl down --network` removes it).")
        return build_down_plan(inventory, network, down_parts(), keep_logs=keep_logs)

    request = RunRequest(
        command="down", inventory=inventory, build=build, dry_run=dry_run, yes=yes, as_json=as_json,
        trust_new_hosts=trust_new_hosts, break_lock=break_lock, require_all_nodes=False,
        lock_optional=True,
    )
    return execute(request)


def follow_gateway(session: object, inventory: object) -> None:
    from orchestrator.gateway.follow import after_change

    after_change(session, inventory, lambda line: click.echo(line, err=True))  # type: ignore[arg-type]


def _down_server(inventory: object, server: str, dry_run: bool, yes: bool, as_json: bool,
                 trust_new_hosts: bool, break_lock: bool, network: bool,
                 keep_logs: bool = False) -> int:
    """Only the server NAME: its containers and record on its nodes; everything else stays."""
    from orchestrator.core.runner import RunRequest, execute
    from orchestrator.core.step import Plan
    from orchestrator.engines.servers import down_phase
    from orchestrator.errors import InputError

    if network:
        raise InputError("--network and --server do not go together: --server stops one server")

    def build(session: Any) -> Plan:
        if not session.unreachable:  # (else it may run on the node that did not answer)
            from orchestrator.engines.servers import gather

            found = gather(session.transports, inventory, alive_only=False)  # type: ignore[arg-type]
            known = sorted({s.name for s in found})
            if server not in known:
                raise InputError(f"--server {server}: no such server; known: "
                                 f"{', '.join(known) or 'none (no server runs)'}")
        return Plan("down", [down_phase(inventory, server, keep_logs)])  # type: ignore[arg-type]

    request = RunRequest(
        command="down", inventory=inventory, build=build, dry_run=dry_run,  # type: ignore[arg-type]
        yes=yes, as_json=as_json, trust_new_hosts=trust_new_hosts, break_lock=break_lock,
        require_all_nodes=False, lock_optional=True,
        after=lambda session, _report: None if dry_run else follow_gateway(session, inventory))
    return execute(request)


@click.command(context_settings=CONTEXT)
@inventory_option
@click.option("--network", is_flag=True,
              help="Also remove the fabric netplan file and the fabric addresses sparkctl set.")
@click.option("--dry-run", is_flag=True, help="Show what would be removed; remove nothing.")
@diff_option
@click.option("--yes", "-y", is_flag=True, help="Remove without asking (needed when not on a terminal).")
@json_option
@click.option("--trust-new-hosts", is_flag=True, help="Pin unknown SSH host keys on first use.")
@click.option("--break-lock", is_flag=True, help="Take the cluster lock from a run that is gone.")
@click.option("--server", metavar="NAME", shell_complete=complete_server,
              help="Stop only this server (its containers and record); nothing else is removed.")
@click.option("--oom-guard", is_flag=True,
              help="Remove only what `up --oom-guard` set up (plain down removes it too).")
@click.option("--keep-logs", is_flag=True,
              help="Keep launch --persist's boot logs (/var/log/sparkctl/boot-*.log).")
@verbosity_option
def down(inventory_path: str | None, network: bool, dry_run: bool, yes: bool, as_json: bool,
         trust_new_hosts: bool, break_lock: bool, server: str | None, oom_guard: bool,
         keep_logs: bool) -> None:
    """Stop the server and the containers, remove sparkctl's files; --network: the fabric config too.

    \b
    In order, on every reachable node:
      boot-units   launch --persist's boot units disabled and removed (their containers'
                   restart policy goes with the containers)
      stop-server  mpirun in the head container is stopped (its ranks end with it)
      containers   containers labelled sparkctl.managed=true for this cluster are removed
      network      (--network) /etc/netplan/40-sparkctl-fabric.yaml removed, netplan
                   re-applied, the inventory's fabric addresses deleted
      oom-guard    earlyoom's config put back; earlyoom removed if sparkctl installed it
      files        /etc/sparkctl (cluster keys, trust files) and /var/lib/sparkctl removed
      boot-logs    /var/log/sparkctl/boot-*.log removed (--keep-logs keeps them)
      verify       nothing of the above is left; says what was kept
    Never touched: other containers, other netplan files, your ~/.ssh, the Hugging Face cache.
    Safe to run again. An unreachable node is reported (exit 1); run down again later.
    """
    run_command(lambda: _down(inventory_path, network, dry_run, yes, as_json, trust_new_hosts,
                              break_lock, server, oom_guard, keep_logs))
