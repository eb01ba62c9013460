"""What a Spark owner asks first: how much memory is left on each node, what the GPU does, how
close the memory guard is, and what each server's engine says about its own load.

Memory: /proc/meminfo's MemAvailable (a Spark's 128 GB are unified: the GPU's allocations are
the system's), nvidia-smi's memory and utilisation where it knows them (a GB10 reports memory
as [N/A]: left out, never 0), and the guard's threshold from the launch's plan (memory.json).
Engine metrics: GET /metrics on the server's node (its 127.0.0.1), read with prometheus_client's
parser; the names are matched by what they mean, whatever the engine's prefix.
"""

from __future__ import annotations

import json
import re
from typing import Any

from orchestrator.commands import join, quote
from orchestrator.engines.meters import meter_class, parse_prometheus
from orchestrator.inventory import Inventory
from orchestrator.node import script
from orchestrator.phases.memory import GUARD_DEFAULT_GB, PLAN_FILE
from orchestrator.remote.gathered import NodeFacts
from orchestrator.status.gpu import GPU_FIELDS, gpu_fields, gpu_text, guard_nodes, node_gpu
from orchestrator.status.latency import latency_figures
from orchestrator.status.links import attach_speeds, speed_commands

GIB_PER_KB = 1024**2
_MEMORY_FIELDS = "memory.used,memory.total,utilization.gpu"
# one nvidia-smi call for the memory figures and the box guard's (status/gpu.py); a driver that
# refuses one of the guard's fields fails the whole query, so the memory figures alone follow
MEMORY_CMD = ("grep -E '^(MemTotal|MemAvailable):' /proc/meminfo; echo --gpu; "
              f"nvidia-smi --query-gpu={_MEMORY_FIELDS},{','.join(GPU_FIELDS)} "
              "--format=csv,noheader,nounits 2>/dev/null || "
              f"nvidia-smi --query-gpu={_MEMORY_FIELDS} --format=csv,noheader,nounits 2>/dev/null; true")


def facts_request(inventory: Inventory) -> dict[str, Any]:
    """Status's extra facts: memory, the guard's plan file (its content), the free space
    for models where the inventory's HF cache is, and each fabric link's speed."""
    commands = {"memory": MEMORY_CMD,
                "model_cache": model_cache_cmd(inventory.cluster.hf_cache, inventory.cluster.user),
                **speed_commands(inventory)}  # the fabric links' speeds (status/links.py)
    return {"commands": commands, "files": {PLAN_FILE: True}}


def model_cache_cmd(hf_cache: str, user: str) -> str:
    """Free bytes on the filesystem of the HF cache (`~` is `user`'s home; a cache not made
    yet: its nearest existing parent, where it will be)."""
    if hf_cache == "~" or hf_cache.startswith("~/"):
        rest = quote(hf_cache[1:]) if hf_cache[1:] else ""
        where = f'p="$(getent passwd {quote(user)} | cut -d: -f6)"{rest}'
    else:
        where = f"p={quote(hf_cache)}"
    return (f'{where}; while [ ! -e "$p" ] && [ "$p" != / ]; do p=$(dirname "$p"); done; '
            """df -PB1 "$p" | awk 'NR==2 {print $4}'""")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def node_memory(facts: NodeFacts) -> dict[str, Any]:
    """{total_gb, available_gb, gpu_memory_used_gb, gpu_memory_total_gb, gpu_utilization_pct,
    guard_min_available_gb, gpu: {sm_clock_mhz, ...}, model_cache_free_gb}; a figure the
    node does not report is absent (not 0)."""
    meminfo, _, gpu = facts.output("memory").partition("--gpu")
    mem = dict(re.findall(r"^(\w+):\s+(\d+) kB", meminfo, re.M))
    out: dict[str, Any] = {}
    if "MemTotal" in mem:
        out["total_gb"] = round(int(mem["MemTotal"]) / GIB_PER_KB, 1)
    if "MemAvailable" in mem:
        out["available_gb"] = round(int(mem["MemAvailable"]) / GIB_PER_KB, 1)
    fields = gpu_fields(gpu)
    values = [_number(v.strip()) for v in fields[:3]]
    for key, value, scale in zip(("gpu_memory_used_gb", "gpu_memory_total_gb", "gpu_utilization_pct"),
                                 values, (1 / 1024, 1 / 1024, 1.0), strict=False):
        if value is not None:
            out[key] = round(value * scale, 1)
    plan = found.content if (found := facts.file(PLAN_FILE)) else None
    try:
        guard = json.loads(plan).get("guard_min_available_gb") if plan else None
    except (ValueError, AttributeError):
        guard = None
    out["guard_min_available_gb"] = guard
    out["guard_source"] = "launch" if guard is not None else "default (no server launched)"
    if guard is None:
        out["guard_min_available_gb"] = GUARD_DEFAULT_GB
    out["gpu"] = node_gpu(facts).as_dict()
    cache = facts.output("model_cache").strip()
    if cache.isdigit():
        out["model_cache_free_gb"] = round(int(cache) / 1e9, 1)
    return out



def attach_node_figures(nodes: dict[str, dict[str, Any]], facts: dict[str, NodeFacts]) -> None:
    """Every reached node's "memory" (with its GPU figures), its links' speeds, and the box
    guard's verdicts."""
    for name, node_facts in facts.items():
        nodes[name]["memory"] = node_memory(node_facts)
    attach_speeds(nodes, facts)
    guard_nodes(nodes, facts)


# ---------------------------------------------------------------- engines' /metrics

# what a figure means -> the metric names engines use for it (after their "prefix:")
MEANINGS: dict[str, tuple[str, ...]] = {
    "requests_running": ("num_requests_running", "num_running_reqs", "requests_processing"),
    "requests_waiting": ("num_requests_waiting", "num_queue_reqs", "requests_deferred"),
    "kv_cache_usage": ("kv_cache_usage_perc", "gpu_cache_usage_perc", "token_usage",
                       "kv_cache_usage_ratio"),
    "spec_acceptance_length": ("spec_accept_length",),
    "spec_acceptance_rate": ("spec_accept_rate",),
    # counters over the server's life: the dashboard turns them into tokens per second
    "generation_tokens": ("generation_tokens_total",),
    "prompt_tokens": ("prompt_tokens_total",),
}
ACCEPTED = ("spec_decode_num_accepted_tokens_total", "spec_decode_num_accepted_tokens")
DRAFTED = ("spec_decode_num_draft_tokens_total", "spec_decode_num_draft_tokens")
DRAFTS = ("spec_decode_num_drafts_total", "spec_decode_num_drafts")


def _by_suffix(values: dict[str, float], names: tuple[str, ...]) -> float | None:
    for name in names:
        for key, value in values.items():
            if key == name or key.endswith(":" + name):
                return value
    return None


def summarize_metrics(text: str) -> dict[str, Any]:
    """The figures status shows from a Prometheus exposition; unknown ones left out.
    kv_cache_usage is a fraction (0-1); acceptance over the server's life from its counters."""
    values = parse_prometheus(text)
    out: dict[str, Any] = {}
    for meaning, names in MEANINGS.items():
        found = _by_suffix(values, names)
        if found is not None:
            out[meaning] = found
    accepted, drafted, drafts = (_by_suffix(values, n) for n in (ACCEPTED, DRAFTED, DRAFTS))
    if accepted is not None and drafted:
        out.setdefault("spec_acceptance_rate", accepted / drafted)
    if accepted is not None and drafts:
        out.setdefault("spec_acceptance_length", 1 + accepted / drafts)
    out.update(latency_figures(text))  # TTFT and ITL p50/p95 from the engine's histograms
    return out


def metrics_cmd(port: int, host: str = "127.0.0.1", key_file: str | None = None) -> str:
    """GET /metrics where the server binds; with its API key's node file (an engine may guard
    /metrics: llama-server does), read by the fetch itself, so run it with sudo."""
    from orchestrator.engines.apikey import probe_host

    words = ["--metrics", int(port), probe_host(host), *([key_file] if key_file else [])]
    return f"python3 -c {quote(script('probe.py'))} {join(words)}"


def reads_prometheus(engine: str | None) -> bool:
    """Whether the engine's /metrics is Prometheus text: an engine whose /metrics drains
    iteration stats on read (bench polls those) is not read by status."""
    return bool(getattr(meter_class(str(engine)), "prometheus", False))


def server_metrics(answer_rc: int, answer_out: str) -> dict[str, Any]:
    """The fetch's answer -> {"ok", figures...} or {"ok": False, "why"}."""
    if answer_rc != 0:
        return {"ok": False, "why": "GET /metrics failed (metrics off, or the server not ready)"}
    content_type, _, body = answer_out.partition("\n")
    if "json" in content_type:
        return {"ok": False, "why": "not Prometheus text"}
    return {"ok": True, **summarize_metrics(body)}


def attach_metrics(servers: list[dict[str, Any]], run_on: Any) -> None:
    """Each healthy server with Prometheus metrics gets "metrics"; run_on(node, command, sudo)
    runs a command on that node and returns (rc, stdout)."""
    for server in servers:
        if server.get("state") != "healthy" or not server.get("port") or not server.get("node"):
            continue
        if not reads_prometheus(server.get("engine")):
            server["metrics"] = {"ok": False, "why": "this engine's /metrics is not Prometheus text"}
            continue
        try:
            key_file = server.get("api_key_file")
            rc, out = run_on(str(server["node"]), metrics_cmd(
                int(server["port"]), str(server.get("host") or "127.0.0.1"), key_file), bool(key_file))
        except Exception as exc:  # one server's metrics never fail status
            server["metrics"] = {"ok": False, "why": str(exc)[:200]}
            continue
        server["metrics"] = server_metrics(rc, out)


def memory_text(memory: dict[str, Any]) -> str:
    """`118.2 of 119.7 GB available (guard stops the server below 2 GB) · GPU 35 %`."""
    if "available_gb" not in memory:
        return "memory unknown"
    text = f"{memory['available_gb']:g} of {memory.get('total_gb', '?'):g} GB available"
    text += f" (guard: {memory['guard_min_available_gb']:g} GB)"
    if "gpu_memory_used_gb" in memory:
        text += f", GPU memory {memory['gpu_memory_used_gb']:g}"
        text += f"/{memory['gpu_memory_total_gb']:g} GB" if "gpu_memory_total_gb" in memory else " GB"
    if "gpu_utilization_pct" in memory:
        text += f", GPU {memory['gpu_utilization_pct']:g} %"
    clocks = gpu_text(memory.get("gpu") or {})
    return text + (f", {clocks}" if clocks else "")


def metrics_text(metrics: dict[str, Any] | None) -> str:
    if not metrics:
        return ""
    if not metrics.get("ok"):
        return f"metrics: {metrics.get('why')}"
    parts = []
    if "requests_running" in metrics:
        parts.append(f"{metrics['requests_running']:g} request(s) running")
    if "requests_waiting" in metrics:
        parts.append(f"{metrics['requests_waiting']:g} waiting")
    if "kv_cache_usage" in metrics:
        parts.append(f"KV cache {metrics['kv_cache_usage'] * 100:.0f} %")
    length, rate = metrics.get("spec_acceptance_length"), metrics.get("spec_acceptance_rate")
    # gauges an engine keeps at 0 / 1 without a draft model say nothing: left out
    if "ttft_p50_s" in metrics:
        parts.append(f"TTFT p50 {metrics['ttft_p50_s'] * 1000:.0f} ms")
    if "itl_p50_s" in metrics:
        parts.append(f"ITL p50 {metrics['itl_p50_s'] * 1000:.1f} ms")
    if rate or (length is not None and length > 1):
        if length is not None:
            parts.append(f"acceptance length {length:.2f}")
        if rate is not None:
            parts.append(f"acceptance rate {rate:.2f}")
    return "; ".join(parts) or "metrics: none of the known figures"
