"""netcheck's RoCE checks and the RDMA link test (pure over the node's answers).

NCCL moves a Spark cluster's tensors over RDMA (RoCE), not over the interfaces' TCP. Two things
there are invisible to `ip` and `ping`:

- the device's active MTU: RDMA frames use the largest InfiniBand MTU (256..4096) that fits the
  link's MTU; with the fabric at 9000 every device should say `active_mtu: 4096`. A device that
  came up while its link had MTU 1500 stays at 1024 until it is reset: a 4-Spark fleet running
  at 1024 saw ~40 % lower prefill;
- the GID index: each RoCE device lists GIDs (link-local and one per IPv4 address, RoCE v1 and
  v2). NCCL must use the RoCEv2 GID that carries the fabric address; when the engines are told
  `NCCL_IB_GID_INDEX`, it must be that index on every device.

node/roce.py reads both (ibv_devinfo; the GID table from sysfs or show_gids). Where RDMA devices
exist and `ib_write_bw` is installed on both ends, --deep measures each link with it (RDMA, as
NCCL moves data) instead of iperf3 (TCP); the lab has no RDMA data path and measures with TCP.
"""

from __future__ import annotations

import json
import re
from typing import Any

from orchestrator.commands import join, quote
from orchestrator.inventory import Inventory, Node
from orchestrator.netcheck.container import _container, container_env
from orchestrator.netcheck.results import CheckResult, _link
from orchestrator.node import script
from orchestrator.remote.facts import Command, Request
from orchestrator.remote.gathered import NodeFacts

IB_MTUS = (4096, 2048, 1024, 512, 256)
ROCE_HEADERS = 100
"""Bytes of Ethernet, IP, UDP and RoCE headers an RDMA frame needs beside its payload."""
IB_WRITE_BW = Command("ib_write_bw", "command -v ib_write_bw")
NVIDIA_FLOOR = 184 / 200
"""NVIDIA Sync's per-link speed test passes at 184 Gbit/s of a 200 Gbit/s link."""
RDMA_PORT_BASE = 18515


def roce_fact(inventory: Inventory) -> Command:
    args = json.dumps({"interfaces": list(inventory.fabric.interfaces)}, sort_keys=True)
    return Command("roce", f"python3 -c {quote(script('roce.py'))} {quote(args)}")


def roce_request(inventory: Inventory, node: Node) -> Request:
    from orchestrator.remote.facts import request_of

    return request_of(roce_fact(inventory), IB_WRITE_BW)


def roce_answer(inventory: Inventory, facts: NodeFacts) -> dict[str, Any] | None:
    """node/roce.py's JSON, or None when it was not gathered or printed none."""
    found = roce_fact(inventory).read(facts)
    if found is None:
        return None
    try:
        answer = json.loads(found.out)
    except json.JSONDecodeError:
        return {"error": (found.err or found.out).strip()[-300:] or f"exit {found.rc}"}
    return answer if isinstance(answer, dict) else None


def expected_active_mtu(link_mtu: int) -> int:
    """The RDMA MTU a link of this MTU carries (9000 -> 4096, 1500 -> 1024)."""
    return next((m for m in IB_MTUS if m + ROCE_HEADERS <= link_mtu), 256)


def _gid_index(entry: dict[str, Any], address: str) -> int | None:
    for gid in entry.get("gids") or []:
        if gid.get("version") == "v2" and gid.get("ipv4") == address:
            return int(gid["index"])
    return None


def check_roce(inventory: Inventory, node: Node, facts: NodeFacts) -> list[CheckResult]:
    """Per fabric interface: its RoCE device's active MTU and the RoCEv2 GID index of its
    fabric address (against the engines' NCCL_IB_GID_INDEX when they are told one)."""
    answer = roce_answer(inventory, facts)
    if answer is None:
        return []
    if "error" in answer:
        return [CheckResult("roce-mtu", node.name, "warn", f"{answer['error']}.",
                            fix="on a Spark, `ibdev2netdev` and `ibv_devinfo` list the ConnectX-7's "
                                "RoCE devices; without them NCCL falls back to TCP sockets")]
    container = _container(inventory, facts)
    told = container_env(container).get("NCCL_IB_GID_INDEX") if container else None
    out = []
    for interface in inventory.fabric.interfaces:
        entry = (answer.get("interfaces") or {}).get(interface) or {}
        link = _link(facts, interface)
        if not (link and link.up and link.carrier):
            continue  # the interface row already fails it
        device = entry.get("device") or "?"
        if "error" in entry:
            out.append(CheckResult("roce-mtu", node.name, "warn", f"{entry['error']}.",
                                   interface=interface, fix="`ibv_devinfo` on the node"))
            continue
        out.append(_mtu_row(inventory, node, interface, device, entry))
        out.append(_gid_row(node, interface, device, entry, told))
    return out


def _mtu_row(inventory: Inventory, node: Node, interface: str, device: str,
             entry: dict[str, Any]) -> CheckResult:
    want = expected_active_mtu(inventory.fabric.mtu)
    active = entry.get("active_mtu")
    result = CheckResult("roce-mtu", node.name, "pass", "", interface=interface, value=active,
                         threshold=want)
    if not isinstance(active, int) or active < want:
        result.status = "fail"
        result.message = (f"RDMA device {device} ({interface}) runs at active MTU {active}, "
                          f"{want} expected with fabric MTU {inventory.fabric.mtu}: NCCL's RDMA "
                          "traffic then moves in small frames (a fleet at 1024 saw ~40 % lower "
                          "prefill).")
        result.fix = (f"check the MTU on both ends and any switch port (`ip link show {interface}`),"
                      f" then reset the link (`sudo ip link set {interface} down; sudo ip link set "
                      f"{interface} up`) and `ibv_devinfo -d {device}` again")
    else:
        result.message = f"RDMA device {device} ({interface}): active MTU {active}."
    return result


def _gid_row(node: Node, interface: str, device: str, entry: dict[str, Any],
             told: str | None) -> CheckResult:
    address = ((node.addresses or {}).get(interface) or "").split("/")[0]
    index = _gid_index(entry, address)
    result = CheckResult("roce-gid", node.name, "pass", "", interface=interface, value=index,
                         threshold=told)
    if index is None:
        result.status = "fail"
        result.message = (f"no RoCEv2 GID of {device} ({interface}) carries its fabric address "
                          f"{address} (GIDs from {entry.get('source', '?')}): NCCL cannot address "
                          "this node over RDMA.")
        result.fix = f"the address must be on {interface} itself (`ip addr`), then `show_gids {device}`"
    elif told is not None and told != str(index):
        result.status = "fail"
        result.message = (f"the engines are told NCCL_IB_GID_INDEX={told}, but {address}'s RoCEv2 "
                          f"GID on {device} ({interface}) is index {index}.")
        result.fix = f"set NCCL_IB_GID_INDEX={index}, or leave it unset so NCCL picks it"
    else:
        said = (f"NCCL_IB_GID_INDEX={told} matches" if told is not None else
                "NCCL_IB_GID_INDEX is not set: NCCL picks this RoCEv2 GID itself")
        result.message = f"{device} ({interface}): {address} is RoCEv2 GID index {index}; {said}."
    return result


def rdma_device(inventory: Inventory, facts: NodeFacts, interface: str) -> tuple[str, int] | None:
    """(device, GID index) to run ib_write_bw on over INTERFACE, or None (no RDMA path here:
    no device, no RoCEv2 GID for the address, or no ib_write_bw on the node)."""
    found = IB_WRITE_BW.read(facts)
    answer = roce_answer(inventory, facts) or {}
    entry = (answer.get("interfaces") or {}).get(interface) or {}
    if found is None or found.rc != 0 or not entry.get("device") or "ACTIVE" not in str(entry.get("state")):
        return None
    address = ((link.addresses if (link := _link(facts, interface)) else ()) or ("",))[0].split("/")[0]
    index = _gid_index(entry, address)
    return (str(entry["device"]), index) if index is not None else None


def ib_write_bw_argv(device: str, gid_index: int, port: int) -> list[str]:
    return ["ib_write_bw", "-d", device, "-x", str(gid_index), "-F", "--report_gbits",
            "-D", "2", "-q", "4", "-p", str(port)]


def rdma_server_cmd(device: str, gid_index: int, port: int) -> str:
    server = join(["timeout", "40", *ib_write_bw_argv(device, gid_index, port)])
    return f"setsid {server} >/dev/null 2>&1 </dev/null & sleep 1"


def rdma_client_cmd(device: str, gid_index: int, port: int, peer_ip: str) -> str:
    return join([*ib_write_bw_argv(device, gid_index, port), peer_ip])


def parse_ib_write_bw(text: str) -> float | None:
    """BW average [Gb/sec] of ib_write_bw's result line (#bytes #iterations peak average rate)."""
    rows = re.findall(r"^\s*\d+\s+\d+\s+([\d.]+)\s+([\d.]+)\s+[\d.]+\s*$", text, re.M)
    return float(rows[-1][1]) if rows else None


def link_floor(inventory: Inventory, speed_mbps: int | None) -> tuple[float, str]:
    """(Gb/s a link must carry, why): fabric.min_link_gbps when set, else NVIDIA's 184 of 200,
    i.e. 92 % of the negotiated rate (200 Gbit/s when ethtool said none)."""
    if inventory.fabric.min_link_gbps is not None:
        return inventory.fabric.min_link_gbps, "fabric.min_link_gbps"
    rate = (speed_mbps or 200_000) / 1000
    return round(rate * NVIDIA_FLOOR, 1), f"92 % of the {rate:g} Gb/s negotiated (NVIDIA: 184 of 200)"
