"""netcheck --deep's per-link bandwidth test: iperf3 over TCP (the lab, nodes without RDMA) or
ib_write_bw over RDMA (netcheck/roce.py), one link at a time, judged against the link's floor:
fabric.min_link_gbps, or 92 % of the negotiated rate (NVIDIA's 184 of 200 Gbit/s)."""

from __future__ import annotations

import json
import re
from typing import Any

from orchestrator.inventory import Inventory
from orchestrator.netcheck.checks import Link, fabric_links
from orchestrator.netcheck.probes import IPERF_SECONDS, _base
from orchestrator.netcheck.results import CheckResult


def iperf_server_cmd(link: Link, port: int) -> str:
    from orchestrator.commands import join

    # -1: serve one test and exit; `timeout` bounds it if the client never comes
    server = join(["timeout", "30", "iperf3", "-s", "-1", "-B", link.peer_ip, "-p", port])
    # return once it listens (up to 10 s), so the client does not race it on a busy node
    listening = join(["ss", "-Hltn", f"sport = :{port}"])
    return (f"setsid {server} >/dev/null 2>&1 </dev/null & i=0; while [ $i -lt 100 ]; do "
            f"{listening} 2>/dev/null | grep -q . && exit 0; i=$((i+1)); sleep 0.1; done; exit 0")


def iperf_client_cmd(link: Link, port: int) -> str:
    from orchestrator.commands import join

    client = join(["iperf3", "-c", link.peer_ip, "-B", link.local_ip, "-p", port,
                   "-t", IPERF_SECONDS, "-P", "4", "-J"])
    # the server listens before this runs; a refused connection is still retried, briefly
    return (f"i=0; while [ $i -lt 25 ]; do out=$({client}) && {{ printf '%s\\n' \"$out\"; exit 0; }}; "
            "i=$((i+1)); sleep 0.2; done; printf '%s\\n' \"$out\"; exit 1")


def _first_json(text: str) -> Any:
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON")
    # iperf3 writes bare nan/-nan/inf into its "JSON" now and then (e.g. CPU utilisation)
    cleaned = re.sub(r"(?<=[:\s\[,])-?(?:nan|inf)\b", "null", text[start:])
    return json.JSONDecoder().raw_decode(cleaned)[0]


def _received_bits_per_second(output: str) -> float:
    """iperf3 -J's received rate; if its JSON does not parse, the same field found by pattern."""
    try:
        return float(_first_json(output)["end"]["sum_received"]["bits_per_second"])
    except ValueError:
        found = re.findall(r'"sum_received"\s*:\s*\{[^{}]*?"bits_per_second"\s*:\s*([0-9.eE+]+)',
                           output)
        if not found:
            raise
        return float(found[-1])


def judge_throughput(inventory: Inventory, link: Link, rc: int, output: str,
                     stderr: str = "", speed_mbps: int | None = None,
                     rdma: bool = False) -> CheckResult:
    """One link's measured bandwidth against its floor (roce.link_floor): iperf3's JSON (TCP),
    or ib_write_bw's table (RDMA) when `rdma`."""
    from orchestrator.netcheck.roce import link_floor, parse_ib_write_bw

    limit, why = link_floor(inventory, speed_mbps)
    result = _base("throughput", link, unit="Gb/s", threshold=limit)
    tool = "ib_write_bw (RDMA)" if rdma else "iperf3 (TCP)"
    if rdma:
        measured = parse_ib_write_bw(output)
        if measured is None:
            result.status = "fail"
            result.message = (f"ib_write_bw from {link.node} {link.interface} to {link.peer} "
                              f"({link.peer_ip}) did not run (exit {rc}): "
                              f"{(stderr.strip() or output.strip())[-200:]}.")
            result.fix = "fix the roce-mtu and roce-gid rows first; `ibv_devinfo` on both nodes"
            return result
        return _judged(result, link, measured, limit, why, tool)
    try:
        gbps = _received_bits_per_second(output) / 1e9
    except (ValueError, KeyError, TypeError):
        try:
            error = str(_first_json(output).get("error", ""))
        except (ValueError, AttributeError):
            error = ""
        error = error or (stderr.strip() or output.strip())[-200:]
        result.status = "fail"
        result.message = (f"iperf3 from {link.node} {link.interface} to {link.peer} ({link.peer_ip}) "
                          f"did not run (exit {rc}): {error}.")
        result.fix = "is iperf3 installed on both nodes? fix the ping and address checks first"
        return result
    return _judged(result, link, gbps, limit, why, tool)


def _judged(result: CheckResult, link: Link, gbps: float, limit: float, why: str,
            tool: str) -> CheckResult:
    result.value = round(gbps, 2)
    if gbps < limit:
        result.status = "fail"
        result.message = (f"{link.node} {link.interface} -> {link.peer}: {gbps:.2f} Gb/s by {tool}, "
                          f"below its floor {limit:g} Gb/s ({why}): a degraded link (ethtool may "
                          "still say 200G), a shaped interface, or a too-small MTU.")
        result.fix = "reseat or replace the cable; check the mtu, roce-mtu and latency results"
    else:
        result.message = (f"{link.node} {link.interface} -> {link.peer}: {gbps:.2f} Gb/s by {tool} "
                          f"(floor {limit:g}: {why}).")
    return result


def throughput_links(inventory: Inventory) -> list[Link]:
    """One direction per link for iperf3: from the node listed first in the inventory."""
    order = {n.name: i for i, n in enumerate(inventory.nodes)}
    return [link for link in fabric_links(inventory) if order[link.node] < order[link.peer]]
