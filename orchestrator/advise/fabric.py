"""The hardware figures a prediction uses: the Spark's published ones, or what was measured:
a saved `sparkctl netcheck --deep --json` (latency per link, iperf3 throughput, NCCL bus
bandwidth) and a memory bandwidth the user measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.advise.model import FABRIC_GBS, FABRIC_LATENCY_US, SPARK_BANDWIDTH_GBS, Hardware
from orchestrator.errors import InputError

LAST = "netcheck-last.json"
"""The last `sparkctl netcheck`'s result, in the state directory: advise's default fabric."""


def save_last(doc: dict[str, Any], inventory: Any) -> None:
    """Keep netcheck's result (with which cluster and when) for advise; never fails netcheck."""
    import contextlib
    import time

    from orchestrator.state import state_dir

    with contextlib.suppress(OSError):
        state_dir().mkdir(parents=True, exist_ok=True)
        saved = {**doc, "cluster": inventory.cluster.name, "inventory": inventory.source,
                 "saved": time.strftime("%Y-%m-%d %H:%M")}
        (state_dir() / LAST).write_text(json.dumps(saved))


def last_saved() -> str | None:
    """The last netcheck's file when it measured the fabric (a latency or a bandwidth)."""
    from orchestrator.state import state_dir

    path = state_dir() / LAST
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    measured = any(_values(doc, check, unit) for check, unit in (
        ("latency", "ms"), ("ping", "ms"), ("nccl-busbw", "GB/s"), ("throughput", "Gb/s")))
    return str(path) if measured else None


def _values(doc: dict[str, Any], check: str, unit: str) -> list[float]:
    return [float(c["value"]) for c in doc.get("checks") or []
            if isinstance(c, dict) and c.get("check") == check and c.get("unit") == unit
            and c.get("status") in ("pass", "warn") and isinstance(c.get("value"), (int, float))]


def hardware(netcheck: str | None = None, bandwidth_gbs: float | None = None,
             bandwidth_from: str | None = None) -> Hardware:
    """`bandwidth_from`: how a measured `bandwidth_gbs` was measured (default: given)."""
    sources = [bandwidth_from or f"memory bandwidth {bandwidth_gbs:g} GB/s (given)" if bandwidth_gbs
               else f"memory bandwidth {SPARK_BANDWIDTH_GBS:g} GB/s (Spark spec sheet)"]
    latency_us, fabric_gbs = FABRIC_LATENCY_US, FABRIC_GBS
    latency_from = fabric_from = "published"
    if netcheck == "none":
        netcheck = None
    elif netcheck is None:
        netcheck = last_saved()
    if netcheck:
        path = Path(netcheck).expanduser()
        try:
            doc = json.loads(path.read_text())
        except OSError as exc:
            raise InputError(f"--netcheck {path}: cannot read it: {exc.strerror}") from None
        except ValueError as exc:
            raise InputError(f"--netcheck {path}: not JSON ({exc}); save one with "
                             "`sparkctl netcheck --deep --json > FILE`") from None
        if not isinstance(doc, dict) or doc.get("command") != "netcheck":
            raise InputError(f"--netcheck {path}: not the output of `sparkctl netcheck --json`")
        # a ping's round trip: a 2-rank ring all-reduce is two one-way hops, about one RTT
        pings = _values(doc, "latency", "ms") or _values(doc, "ping", "ms")
        name = path.name if path.name != LAST else \
            f"of {doc.get('cluster', '?')} saved {doc.get('saved', '?')}"
        if pings:
            latency_us, latency_from = 1000 * max(pings), f"netcheck {name}"
        busbw = _values(doc, "nccl-busbw", "GB/s")
        iperf = _values(doc, "throughput", "Gb/s")
        if busbw:
            fabric_gbs, fabric_from = min(busbw), f"netcheck {name} (NCCL)"
        elif iperf:
            fabric_gbs, fabric_from = min(iperf) / 8, f"netcheck {name} (iperf3)"
    sources.append(f"fabric {latency_us:g} us per collective ({latency_from}), "
                   f"{fabric_gbs:g} GB/s ({fabric_from})")
    return Hardware(bandwidth_gbs=bandwidth_gbs or SPARK_BANDWIDTH_GBS,
                    fabric_latency_us=round(latency_us, 1), fabric_gbs=round(fabric_gbs, 2),
                    sources=tuple(sources))
