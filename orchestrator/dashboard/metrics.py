"""`/metrics`: the page's figures as Prometheus text, written by prometheus_client from the
latest look (a collector: nothing is asked of the nodes when Prometheus scrapes).

Names follow Prometheus' conventions (base units: bytes, hertz, celsius, watts, ratios 0-1);
every node series has a `node` label, every server series `server` (and `engine`, `model` on
sparkctl_server_info). docs/dashboard.md lists them; docs/grafana-dashboard.json uses them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from orchestrator.dashboard.watch import Look

GB = 1024**3

# (metric, help, memory key, scale): node gauges read from status's node "memory"
NODE_MEMORY = (
    ("sparkctl_node_memory_total_bytes", "MemTotal of the node (unified: CPU and GPU)", "total_gb", GB),
    ("sparkctl_node_memory_available_bytes", "MemAvailable of the node", "available_gb", GB),
    ("sparkctl_node_memory_guard_min_available_bytes",
     "The memory guard stops the server below this MemAvailable", "guard_min_available_gb", GB),
    ("sparkctl_node_gpu_utilization_ratio", "GPU utilisation (nvidia-smi), 0-1",
     "gpu_utilization_pct", 0.01),
    ("sparkctl_node_model_cache_free_bytes", "Free space on the filesystem of the model cache",
     "model_cache_free_gb", 1e9),
)
NODE_GPU = (
    ("sparkctl_node_gpu_sm_clock_hertz", "GPU SM clock now", "sm_clock_mhz", 1e6),
    ("sparkctl_node_gpu_sm_clock_max_hertz", "GPU SM clock maximum", "max_sm_clock_mhz", 1e6),
    ("sparkctl_node_gpu_temperature_celsius", "GPU temperature", "temperature_c", 1.0),
    ("sparkctl_node_gpu_power_watts", "GPU power draw", "power_w", 1.0),
    ("sparkctl_node_gpu_throttle_reasons", "NVML clock event reasons bitmask (0x20 SW thermal, "
     "0x40 HW thermal, 0x4 SW power cap, 0x80 HW power brake)", "throttle_reasons", 1.0),
)
# (metric, help, figure): server gauges from the engine's /metrics, by meaning
SERVER_FIGURES = (
    ("sparkctl_server_requests_running", "Requests the engine is running", "requests_running"),
    ("sparkctl_server_requests_waiting", "Requests waiting in the engine's queue", "requests_waiting"),
    ("sparkctl_server_kv_cache_usage_ratio", "KV cache in use, 0-1", "kv_cache_usage"),
    ("sparkctl_server_spec_acceptance_rate", "Speculative decoding: drafted tokens accepted, 0-1",
     "spec_acceptance_rate"),
    ("sparkctl_server_spec_acceptance_length", "Speculative decoding: tokens per step",
     "spec_acceptance_length"),
    ("sparkctl_server_decode_tokens_per_second", "Tokens generated per second since the "
     "previous look", "decode_tokens_per_s"),
    ("sparkctl_server_prefill_tokens_per_second", "Prompt tokens processed per second since the "
     "previous look", "prefill_tokens_per_s"),
)
# (metric, help, figure prefix): p50/p95 over the server's life from the engine's histograms
SERVER_LATENCIES = (
    ("sparkctl_server_time_to_first_token_seconds", "Time to first token (engine's histogram)",
     "ttft"),
    ("sparkctl_server_inter_token_latency_seconds", "Time between tokens (engine's histogram)",
     "itl"),
)


class LookCollector(Collector):
    """Yields the latest look's series; none of the cluster's when no look has finished."""

    def __init__(self, latest: Callable[[], Look | None]) -> None:
        self._latest = latest

    def collect(self) -> Iterator[Metric]:
        look = self._latest()
        ok = GaugeMetricFamily("sparkctl_look_ok", "1 when the last look at the cluster worked")
        ok.add_metric([], 0.0 if look is None or look.status is None else 1.0)
        yield ok
        if look is None:
            return
        taken = GaugeMetricFamily("sparkctl_look_timestamp_seconds", "When the last look finished")
        taken.add_metric([], look.taken_at)
        yield taken
        took = GaugeMetricFamily("sparkctl_look_duration_seconds", "How long the last look took")
        took.add_metric([], look.seconds)
        yield took
        if look.status is not None:
            yield from nodes_series(look.status)
            yield from server_series(look.status)
            yield from gateway_series(look.status.get("gateway") or {})


def nodes_series(status: dict[str, Any]) -> Iterator[Metric]:
    nodes = status.get("nodes") or {}
    up = GaugeMetricFamily("sparkctl_node_up", "1 when the node answered", labels=["node"])
    problems = GaugeMetricFamily("sparkctl_node_problems", "Problems status lists for the node",
                                 labels=["node"])
    guard = GaugeMetricFamily("sparkctl_node_gpu_guard_problem",
                              "1 for each box-guard verdict on the node (stuck-clock, hot, "
                              "thermal-throttle, power-throttle)", labels=["node", "kind"])
    for name, node in nodes.items():
        up.add_metric([name], 1.0 if node.get("reachable") else 0.0)
        problems.add_metric([name], float(len(node.get("problems") or [])))
        for kind in node.get("gpu_problems") or []:
            guard.add_metric([name, kind], 1.0)
    speed = GaugeMetricFamily("sparkctl_node_link_speed_bits_per_second", "Fabric link speed "
                              "ethtool reports", labels=["node", "interface"])
    link_up = GaugeMetricFamily("sparkctl_node_link_ok", "1 when the fabric link is up with its "
                                "address and MTU", labels=["node", "interface"])
    for name, node in nodes.items():
        for iface, link in ((node.get("network") or {}).get("interfaces") or {}).items():
            link_up.add_metric([name, iface], 1.0 if link.get("ok") else 0.0)
            if isinstance(link.get("speed_mbps"), int):
                speed.add_metric([name, iface], link["speed_mbps"] * 1e6)
    yield from (up, problems, guard, speed, link_up)
    for metric, text, key, scale in NODE_MEMORY:
        family = GaugeMetricFamily(metric, text, labels=["node"])
        for name, node in nodes.items():
            value = (node.get("memory") or {}).get(key)
            if isinstance(value, (int, float)):
                family.add_metric([name], float(value) * scale)
        yield family
    for metric, text, key, scale in NODE_GPU:
        family = GaugeMetricFamily(metric, text, labels=["node"])
        for name, node in nodes.items():
            value = ((node.get("memory") or {}).get("gpu") or {}).get(key)
            if isinstance(value, (int, float)):
                family.add_metric([name], float(value) * scale)
        yield family


def server_series(status: dict[str, Any]) -> Iterator[Metric]:
    servers = status.get("servers") or []
    info = GaugeMetricFamily("sparkctl_server_info", "1 per server (its engine, model, nodes)",
                             labels=["server", "engine", "model", "nodes"])
    healthy = GaugeMetricFamily("sparkctl_server_healthy", "1 when the server answers its health "
                                "probes", labels=["server"])
    for s in servers:
        listed = s.get("nodes")
        nodes = ",".join(map(str, listed)) if isinstance(listed, list) else str(s.get("node"))
        info.add_metric([str(s.get("name")), str(s.get("engine")), str(s.get("model")), nodes], 1.0)
        healthy.add_metric([str(s.get("name"))], 1.0 if s.get("state") == "healthy" else 0.0)
    yield from (info, healthy)
    for metric, text, key in SERVER_FIGURES:
        family = GaugeMetricFamily(metric, text, labels=["server"])
        for s in servers:
            value = (s.get("metrics") or {}).get(key)
            if isinstance(value, (int, float)):
                family.add_metric([str(s.get("name"))], float(value))
        yield family
    for metric, text, prefix in SERVER_LATENCIES:
        family = GaugeMetricFamily(metric, text, labels=["server", "quantile"])
        for s in servers:
            for label, q in (("p50", "0.5"), ("p95", "0.95")):
                value = (s.get("metrics") or {}).get(f"{prefix}_{label}_s")
                if isinstance(value, (int, float)):
                    family.add_metric([str(s.get("name")), q], float(value))
        yield family


def gateway_series(gateway: dict[str, Any]) -> Iterator[Metric]:
    replicas = GaugeMetricFamily("sparkctl_gateway_replicas", "Replicas behind the gateway per "
                                 "model", labels=["model"])
    rotation = GaugeMetricFamily("sparkctl_gateway_replicas_in_rotation", "Replicas the gateway "
                                 "sends requests to, per model", labels=["model"])
    for model, count in (gateway.get("models") or {}).items():
        replicas.add_metric([str(model)], float(count.get("replicas", 0)))
        rotation.add_metric([str(model)], float(count.get("in_rotation", 0)))
    yield from (replicas, rotation)


def registry_for(latest: Callable[[], Look | None]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LookCollector(latest))
    return registry
