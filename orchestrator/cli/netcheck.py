"""`sparkctl netcheck`: read-only checks of every node and every fabric link.

One remote command per node (facts + link probes, run at once on the node), in parallel on all
nodes; `--deep` then measures each link with iperf3, one link at a time. It changes nothing,
so it takes no cluster lock and may run next to anything.
"""

from __future__ import annotations

import time
from typing import Any

import click

from orchestrator.cli import CONTEXT, inventory_option, json_option, run_command
from orchestrator.netcheck.checks import CheckResult
from orchestrator.remote.cluster import parallel
from orchestrator.remote.gathered import NodeFacts

PROBE_ROUND_TIMEOUT = 150.0


def run_netcheck(session: Any, deep: bool) -> list[CheckResult]:
    """Every check's result, for every node the session reached (and a fail for the others)."""
    from orchestrator.errors import SparkctlError
    from orchestrator.netcheck.checks import facts_request, run_node_checks
    from orchestrator.netcheck.container import CLUSTER_CHECKS
    from orchestrator.netcheck.probes import (
        apply_dependencies,
        build_probes,
        judge_probes,
        probe_request,
    )
    from orchestrator.remote.facts import gather_facts

    inventory = session.inventory
    results: list[CheckResult] = []
    for name, host in session.report.hosts.items():
        if host.error:
            results.append(CheckResult(
                "connect", name, "fail", f"cannot reach {name} over SSH: {host.error}",
                fix="check cluster.user, cluster.ssh_key and the node's management address"))
    nodes = session.reachable_nodes()
    probes = {node.name: build_probes(inventory, node, deep) for node in nodes}

    def one(node: Any) -> NodeFacts:
        request = {**facts_request(inventory, node), "probes": probe_request(probes[node.name])}
        return gather_facts(session.transports[node.name], request, timeout=PROBE_ROUND_TIMEOUT)

    session.progress.note(f"netcheck: probing {len(nodes)} node(s) and their links...")
    facts_by_node: dict[str, NodeFacts] = {}
    by_name = {node.name: node for node in nodes}
    for name, outcome in parallel(lambda name: one(by_name[name]), by_name).items():
        if isinstance(outcome.error, SparkctlError):
            results.append(CheckResult("facts", name, "fail", str(outcome.error),
                                       fix="is python3 on the node? see the run log"))
        else:
            facts_by_node[name] = outcome.get()
    for node in nodes:
        facts = facts_by_node.get(node.name)
        if facts is None:
            continue
        results += run_node_checks(inventory, node, facts)
        results += judge_probes(inventory, node, probes[node.name], facts.probes,
                                facts_by_node)
    for check in CLUSTER_CHECKS:
        results += check(inventory, facts_by_node)
    if deep:
        session.progress.note("netcheck --deep: measuring each link (ib_write_bw over RDMA, "
                              "else iperf3), one at a time...")
        results += measure_throughput(session, facts_by_node)
        session.progress.note("netcheck --deep: NCCL all_gather_perf across the containers...")
        results += measure_nccl(session, facts_by_node)
    return apply_dependencies(results)


def measure_nccl(session: Any, facts_by_node: dict[str, NodeFacts]) -> list[CheckResult]:
    """nccl-tests' all_gather_perf from the head's container, one rank per node."""
    from orchestrator.errors import SparkctlError
    from orchestrator.netcheck.container import container_running
    from orchestrator.netcheck.nccl import DEADLINE, all_gather_cmd, judge_all_gather

    inventory = session.inventory
    head = inventory.head_name
    transport = session.transports.get(head)
    if transport is None or len(inventory.nodes) < 2:
        return []
    if not all(container_running(inventory, facts_by_node.get(n.name) or NodeFacts(n.name))
               for n in inventory.nodes):
        return []  # the container rows already failed
    try:
        result = transport.run(all_gather_cmd(inventory), sudo=True, timeout=DEADLINE + 30)
        return [judge_all_gather(inventory, result.exit_status, result.stdout, result.stderr,
                                 facts_by_node)]
    except SparkctlError as exc:
        return [judge_all_gather(inventory, 1, "", str(exc), facts_by_node)]


def measure_throughput(session: Any, facts_by_node: dict[str, NodeFacts]) -> list[CheckResult]:
    """Each link once, one at a time: ib_write_bw (RDMA) where both ends have a RoCE device with
    the fabric address and ib_write_bw, else iperf3 (TCP); judged against the link's floor."""
    from orchestrator.errors import SparkctlError
    from orchestrator.netcheck.bandwidth import (
        iperf_client_cmd,
        iperf_server_cmd,
        judge_throughput,
        throughput_links,
    )
    from orchestrator.netcheck.checks import negotiated_speed
    from orchestrator.netcheck.probes import IPERF_PORT_BASE
    from orchestrator.netcheck.roce import (
        RDMA_PORT_BASE,
        rdma_client_cmd,
        rdma_device,
        rdma_server_cmd,
    )

    inventory = session.inventory
    out = []
    for index, link in enumerate(throughput_links(inventory)):
        client, server = session.transports.get(link.node), session.transports.get(link.peer)
        if client is None or server is None:
            continue
        mine = facts_by_node.get(link.node) or NodeFacts(link.node)
        speed = negotiated_speed(mine, link.interface)
        here = rdma_device(inventory, mine, link.interface)
        there = rdma_device(inventory, facts_by_node.get(link.peer) or NodeFacts(link.peer),
                             link.peer_interface)
        try:
            if here and there:
                port = RDMA_PORT_BASE + index
                server.run(rdma_server_cmd(*there, port), timeout=20).check()
                result = client.run(rdma_client_cmd(*here, port, link.peer_ip), timeout=60)
                out.append(judge_throughput(inventory, link, result.exit_status, result.stdout,
                                            result.stderr, speed, rdma=True))
                continue
            port = IPERF_PORT_BASE + index
            server.run(iperf_server_cmd(link, port), timeout=20).check()
            result = client.run(iperf_client_cmd(link, port), timeout=60)
            out.append(judge_throughput(inventory, link, result.exit_status, result.stdout,
                                        result.stderr, speed))
        except SparkctlError as exc:
            out.append(judge_throughput(inventory, link, 1, str(exc), "", speed,
                                        rdma=bool(here and there)))
    return out


MEASURED = ("throughput", "latency", "nccl-busbw")
PROOFS = ("mpirun",)
"""Rows that carry a measurement or a key proof (mpirun reached every container): shown even
when passing rows are hidden."""
STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def _shown(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def shown_rows(results: list[CheckResult], verbose: bool) -> list[CheckResult]:
    """On large clusters passing rows are left out (-v shows them), except measurements and
    key proofs."""
    hide = not verbose and len(results) > 40
    return [r for r in results
            if not (hide and r.status == "pass" and r.check not in MEASURED + PROOFS)]


def _label(r: CheckResult) -> str:
    """`check node interface -> peer`, the place left out when the message starts with it."""
    if r.node and r.message.startswith(f"{r.node} "):
        return r.check
    where = (r.node, r.interface or "", f"-> {r.peer}" if r.peer else "")
    return " ".join(x for x in (r.check, *where) if x)


def _figures(r: CheckResult) -> str:
    """` (0.05 ms, threshold 1 ms)`: the value unless the message says it, and the threshold."""
    unit = f" {r.unit}" if r.unit else ""
    parts = []
    if r.value is not None and _shown(r.value) not in r.message:
        parts.append(f"{_shown(r.value)}{unit}")
    if r.threshold is not None:
        parts.append(f"threshold {_shown(r.threshold)}{unit}")
    return f" ({', '.join(parts)})" if parts else ""


def render(results: list[CheckResult], seconds: float, verbose: bool) -> None:
    """On a terminal: a table, then each problem with its fix. Off a terminal (core/output.py):
    one plain line per shown check (status, check, where, message, threshold), its fix under
    it; no table, nothing twice."""
    from rich.markup import escape

    from orchestrator.core.output import console, on_terminal
    from orchestrator.netcheck.checks import summary

    out = console()
    rows = shown_rows(results, verbose)
    if on_terminal():
        from rich.table import Table

        table = Table(title="sparkctl netcheck", expand=False)
        for column in ("check", "node", "peer", "interface", "status", "value", "threshold",
                       "message"):
            table.add_column(column, overflow="fold")
        for r in rows:
            value = f"{_shown(r.value)} {r.unit or ''}".strip() if r.value is not None else ""
            table.add_row(r.check, r.node, r.peer or "", r.interface or "",
                          f"[{STATUS_STYLE[r.status]}]{r.status}[/]", escape(value),
                          escape(_shown(r.threshold)), escape(r.message))
        if table.row_count:
            out.print(table)
        for r in (r for r in results if r.status != "pass"):
            out.print(f"[{STATUS_STYLE[r.status]}]{r.status}[/] {escape(_label(r))}: "
                      f"{escape(r.message)}")
            if r.fix:
                out.print(f"    fix: {r.fix}", markup=False)
    else:
        for r in rows:
            out.print(f"{r.status} {_label(r)}: {r.message}{_figures(r)}", markup=False)
            if r.fix and r.status != "pass":
                out.print(f"    fix: {r.fix}", markup=False)
    counts = summary(results)
    hidden = " (-v shows passing rows)" if len(rows) < len(results) else ""
    skipped = f", {counts['skip']} skipped" if counts["skip"] else ""
    line = (f"netcheck: {counts['pass']} pass, {counts['warn']} warn, {counts['fail']} fail"
            f"{skipped} in {seconds:.1f}s{hidden}")
    out.print(("[bold red]FAILED[/] " if counts["fail"] else "[green]OK[/] ") + line)


def _netcheck(inventory_path: str | None, as_json: bool, deep: bool, verbose: bool,
              trust_new_hosts: bool) -> int:
    from orchestrator.core.report import print_json
    from orchestrator.core.runner import load_inventory_option
    from orchestrator.core.session import open_session

    inventory, _ = load_inventory_option(inventory_path)
    started = time.monotonic()
    with open_session(inventory, "netcheck", trust_new_hosts=trust_new_hosts) as session:
        results = run_netcheck(session, deep)
    seconds = time.monotonic() - started
    ok = all(r.status != "fail" for r in results)
    doc = {"command": "netcheck", "ok": ok, "seconds": round(seconds, 3), "deep": deep,
           "checks": [r.to_json() for r in results]}
    from orchestrator.advise.fabric import save_last

    save_last(doc, inventory)  # `sparkctl advise` predicts with the measured fabric
    if as_json:
        print_json(doc)
    else:
        render(results, seconds, verbose)
    return 0 if ok else 1


@click.command(context_settings=CONTEXT)
@inventory_option
@json_option
@click.option("--deep", is_flag=True,
              help="Also measure each link (iperf3, a 50-ping train) and NCCL (all_gather_perf).")
@click.option("--verbose", "-v", is_flag=True, help="Show passing rows too on large clusters.")
@click.option("--trust-new-hosts", is_flag=True, help="Pin unknown SSH host keys on first use.")
def netcheck(inventory_path: str | None, as_json: bool, deep: bool, verbose: bool,
             trust_new_hosts: bool) -> None:
    """Check the fabric on every node and link; read-only, exit 1 when a check fails.

    \b
    Per node:  fabric interfaces exist, are up, speed, addresses, MTU, netplan files,
               twins on separate subnets, routes to each peer leave the right interface,
               container running with the inventory's NCCL/UCX/MPI environment, hostfile,
               the same image digest everywhere.
    Per link:  ping from the right interface (both directions), don't-fragment ping at the
               full MTU, SSH node->container and container->container with pinned keys,
               `mpirun -np N hostname` across the containers (60 s deadline).
    --deep:    iperf3 throughput vs fabric.min_link_gbps, latency/loss vs fabric.max_latency_ms,
               NCCL's all_gather_perf bus bandwidth vs fabric.min_nccl_busbw_gbps.
    Every failure names node, interface and the fix. See docs/netcheck.md.
    """
    run_command(lambda: _netcheck(inventory_path, as_json, deep, verbose, trust_new_hosts))
