"""What the page shows, as typed records built from one look (`status`'s result), its history,
its events and the last netcheck's figures: the page's JavaScript only lays these out, it
judges nothing itself."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.advise.fabric import LAST
from orchestrator.dashboard.watch import Event, Look, Point
from orchestrator.status.gpu import HOT_TEMPERATURE_C, STUCK_CLOCK_FRACTION


@dataclass(frozen=True)
class LinkView:
    interface: str
    state: str
    mtu: int | None
    addresses: list[str]
    ok: bool
    speed_mbps: int | None = None


@dataclass(frozen=True)
class NodeView:
    name: str
    role: str
    state: str
    reachable: bool
    problems: list[str]
    gpu_problems: list[str]          # the box guard's kinds: stuck-clock, hot, ...
    total_gb: float | None = None
    available_gb: float | None = None
    guard_min_available_gb: float | None = None
    gpu_utilization_pct: float | None = None
    sm_clock_mhz: float | None = None
    max_sm_clock_mhz: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    throttle_reasons: int | None = None
    model_cache_free_gb: float | None = None  # where the inventory's HF cache is
    container: str = ""
    links: list[LinkView] = field(default_factory=list)


@dataclass(frozen=True)
class ServerView:
    name: str
    engine: str
    model: str
    state: str
    nodes: list[str]
    recipe: str
    ranks: int | None               # the layout: its ranks over `nodes`
    endpoint: str
    persistent: bool
    figures: dict[str, float]       # the engine's /metrics by meaning (status/memory.py)
    metrics_note: str = ""          # why there are no figures


@dataclass(frozen=True)
class GatewayView:
    running: bool
    node: str = ""
    endpoint: str = ""
    live: bool = False
    key: bool = False
    models: dict[str, dict[str, int]] = field(default_factory=dict)


# ---------------------------------------------------------------- the last netcheck
# The last `sparkctl netcheck`'s measured figures for the page's fabric section: netcheck keeps
# its result on this machine (the state directory's netcheck-last.json, which `advise` reads
# too); the dashboard shows the checks that measured something (link speed, latency, throughput,
# NCCL bus bandwidth, MTU path), for this inventory's cluster only, with when they were taken.

MEASURED_UNITS = ("Mb/s", "Gb/s", "GB/s", "ms", "us", "bytes")


@dataclass(frozen=True)
class Figure:
    check: str
    node: str
    peer: str
    interface: str
    value: float
    unit: str
    status: str


@dataclass(frozen=True)
class NetcheckView:
    saved: str = ""                  # when that netcheck ran ("" : none for this cluster)
    figures: list[Figure] = field(default_factory=list)


def last_netcheck(state: Path, cluster: str) -> NetcheckView:
    """What the last netcheck of `cluster` measured (empty when there is none, or it was another
    cluster's, or the file cannot be read)."""
    try:
        doc = json.loads((state / LAST).read_text())
    except (OSError, ValueError):
        return NetcheckView()
    if not isinstance(doc, dict) or doc.get("cluster") != cluster:
        return NetcheckView()
    figures = [Figure(str(c.get("check")), str(c.get("node") or ""), str(c.get("peer") or ""),
                      str(c.get("interface") or ""), float(c["value"]), str(c.get("unit")),
                      str(c.get("status")))
               for c in doc.get("checks") or []
               if isinstance(c, dict) and isinstance(c.get("value"), (int, float))
               and not isinstance(c.get("value"), bool) and c.get("unit") in MEASURED_UNITS]
    return NetcheckView(str(doc.get("saved") or ""), figures)


@dataclass(frozen=True)
class PageView:
    cluster: str
    state: str
    ok: bool
    taken_at: float | None
    look_seconds: float | None
    interval: float
    error: str | None
    thresholds: dict[str, float]
    nodes: list[NodeView]
    servers: list[ServerView]
    gateway: GatewayView
    netcheck: NetcheckView
    events: list[Event]
    history: list[Point]

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _node(node: dict[str, Any]) -> NodeView:
    memory = node.get("memory") or {}
    gpu = memory.get("gpu") or {}
    container = node.get("container") or {}
    links = [LinkView(iface, str(link.get("state")), link.get("mtu"), list(link.get("addresses") or []),
                      bool(link.get("ok")), link.get("speed_mbps"))
             for iface, link in ((node.get("network") or {}).get("interfaces") or {}).items()]
    return NodeView(
        name=str(node["name"]), role=str(node.get("role")), state=str(node.get("state")),
        reachable=bool(node.get("reachable")), problems=list(node.get("problems") or []),
        gpu_problems=list(node.get("gpu_problems") or []),
        total_gb=memory.get("total_gb"), available_gb=memory.get("available_gb"),
        guard_min_available_gb=memory.get("guard_min_available_gb"),
        gpu_utilization_pct=memory.get("gpu_utilization_pct"),
        sm_clock_mhz=gpu.get("sm_clock_mhz"), max_sm_clock_mhz=gpu.get("max_sm_clock_mhz"),
        temperature_c=gpu.get("temperature_c"), power_w=gpu.get("power_w"),
        throttle_reasons=gpu.get("throttle_reasons"),
        model_cache_free_gb=memory.get("model_cache_free_gb"),
        container=str(container.get("status") or "") if container.get("name") else "",
        links=links)


def _server(server: dict[str, Any]) -> ServerView:
    listed = server.get("nodes")
    nodes = [str(n) for n in listed] if isinstance(listed, list) else [str(server.get("node"))]
    metrics = server.get("metrics") or {}
    figures = {k: float(v) for k, v in metrics.items()
               if k not in ("ok", "why") and isinstance(v, (int, float))}
    return ServerView(
        name=str(server.get("name")), engine=str(server.get("engine")),
        model=str(server.get("model")), state=str(server.get("state")), nodes=nodes,
        recipe=str(server.get("recipe") or ""),
        ranks=server.get("ranks") if isinstance(server.get("ranks"), int) else None,
        endpoint=f"{server.get('host') or '127.0.0.1'}:{server.get('port')} on {nodes[0]}",
        persistent=bool(server.get("persistent")), figures=figures,
        metrics_note="" if metrics.get("ok") or not metrics else str(metrics.get("why")))


def _gateway(gateway: dict[str, Any]) -> GatewayView:
    if not gateway.get("running"):
        return GatewayView(False)
    return GatewayView(True, str(gateway.get("node")), f"{gateway.get('host')}:{gateway.get('port')}",
                       bool(gateway.get("live")), bool(gateway.get("key")),
                       dict(gateway.get("models") or {}))


THRESHOLDS = {"hot_temperature_c": HOT_TEMPERATURE_C, "stuck_clock_fraction": STUCK_CLOCK_FRACTION}


def page_view(look: Look | None, history: list[Point], events: list[Event],
              interval: float, netcheck: NetcheckView | None = None) -> PageView:
    """The page's data from the latest look (None: the first look has not finished)."""
    status = (look.status if look else None) or {}
    return PageView(
        cluster=str(status.get("cluster") or ""), state=str(status.get("state") or "looking"),
        ok=bool(status.get("ok")), taken_at=look.taken_at if look else None,
        look_seconds=look.seconds if look else None, interval=interval,
        error=look.error if look else None, thresholds=THRESHOLDS,
        nodes=[_node(n) for n in (status.get("nodes") or {}).values()],
        servers=[_server(s) for s in status.get("servers") or []],
        gateway=_gateway(status.get("gateway") or {}), netcheck=netcheck or NetcheckView(),
        events=list(reversed(events))[:50], history=history)
