"""The dashboard's one look at the cluster every INTERVAL seconds, whatever the number of pages.

A single background thread runs what `status --watch` runs (`gather_status`: one facts round
trip per node, the engines' /metrics on each server's node), so the nodes see the same load
as one `status --watch` however many browsers, scrapers or tabs read the page. Pages and
/metrics read the latest look from memory. The last HISTORY looks feed the charts; changes
between looks become events (below).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import SparkctlError

HISTORY = 360  # looks kept for the charts: 30 min at the default 5 s
EVENTS = 200


@dataclass(frozen=True)
class Look:
    """One look: `status` as gathered (None when gathering failed: `error` says why)."""

    taken_at: float  # Unix time the look finished
    seconds: float   # how long it took
    status: dict[str, Any] | None
    error: str | None = None


@dataclass(frozen=True)
class Point:
    """The charted figures of one look, per node (None: not known at that look)."""

    taken_at: float
    sm_clock_mhz: dict[str, float | None] = field(default_factory=dict)
    temperature_c: dict[str, float | None] = field(default_factory=dict)
    power_w: dict[str, float | None] = field(default_factory=dict)
    available_gb: dict[str, float | None] = field(default_factory=dict)


def point_of(look: Look) -> Point:
    nodes = (look.status or {}).get("nodes") or {}
    point = Point(look.taken_at)
    for name, node in nodes.items():
        memory = node.get("memory") or {}
        gpu = memory.get("gpu") or {}
        point.sm_clock_mhz[name] = gpu.get("sm_clock_mhz")
        point.temperature_c[name] = gpu.get("temperature_c")
        point.power_w[name] = gpu.get("power_w")
        point.available_gb[name] = memory.get("available_gb")
    return point


# ---------------------------------------------------------------- events between looks
# What changed between two looks, as the page's event list: a node's problems appearing and
# clearing (the box guard's, the memory guard's stop record, links, containers), servers
# starting, becoming healthy, failing or going away, a container restarting, and the looks
# themselves failing or coming back.
@dataclass(frozen=True)
class Event:
    at: float        # Unix time of the look that saw it
    subject: str     # node or server name, or "sparkctl"
    text: str
    level: str       # "problem", "ok" or "info"


def _problems(status: dict[str, Any] | None) -> dict[str, set[str]]:
    nodes = (status or {}).get("nodes") or {}
    return {name: set(node.get("problems") or []) for name, node in nodes.items()}


def _servers(status: dict[str, Any] | None) -> dict[str, str]:
    return {str(s.get("name")): str(s.get("state")) for s in (status or {}).get("servers") or []}


def _uptimes(status: dict[str, Any] | None) -> dict[str, int]:
    nodes = (status or {}).get("nodes") or {}
    out = {}
    for name, node in nodes.items():
        seconds = (node.get("container") or {}).get("uptime_seconds")
        if isinstance(seconds, int):
            out[name] = seconds
    return out


def changes(last_good: Look | None, previous: Look | None, look: Look) -> list[Event]:
    """The events of `look`: against the last look that worked (a failed look in between
    changes nothing on the nodes); the first look: its problems and servers as they are."""
    at = look.taken_at
    if look.status is None:
        if previous is not None and previous.status is None and previous.error == look.error:
            return []
        return [Event(at, "sparkctl", f"could not look: {look.error}", "problem")]
    before = last_good.status if last_good is not None else None
    events: list[Event] = []
    if previous is not None and previous.status is None:
        events.append(Event(at, "sparkctl", "looking works again", "ok"))
    old, new = _problems(before), _problems(look.status)
    for node, problems in new.items():
        events.extend(Event(at, node, p, "problem") for p in sorted(problems - old.get(node, set())))
        if last_good is not None:
            events.extend(Event(at, node, f"cleared: {p}", "ok")
                          for p in sorted(old.get(node, set()) - problems))
    old_servers, new_servers = _servers(before), _servers(look.status)
    for name, state in new_servers.items():
        if old_servers.get(name) != state:
            was = old_servers.get(name)
            text = f"server {state}" + (f" (was {was})" if was else "")
            events.append(Event(at, name, text, "ok" if state == "healthy" else
                                "info" if state in ("starting", "loading") else "problem"))
    events.extend(Event(at, name, "server gone", "info") for name in old_servers
                  if name not in new_servers)
    old_up = _uptimes(before)
    for node, seconds in _uptimes(look.status).items():
        if node in old_up and seconds < old_up[node]:
            events.append(Event(at, node, "container restarted", "info"))
    return events


# the engines' token counters (status/memory.py's meanings) -> the rates the page shows
RATES = {"generation_tokens": "decode_tokens_per_s", "prompt_tokens": "prefill_tokens_per_s"}


def add_rates(before: Look, look: Look) -> None:
    """Each server's decode and prefill tokens per second since the previous look, from its
    engine's counters (a restarted server's counters start again: no rate that once)."""
    seconds = look.taken_at - before.taken_at
    old = {str(s.get("name")): s.get("metrics") or {} for s in (before.status or {}).get("servers") or []}
    for server in (look.status or {}).get("servers") or []:
        metrics, previous = server.get("metrics") or {}, old.get(str(server.get("name"))) or {}
        for counter, rate in RATES.items():
            now, then = metrics.get(counter), previous.get(counter)
            if seconds > 0 and isinstance(now, (int, float)) and isinstance(then, (int, float)) \
                    and now >= then:
                metrics[rate] = (now - then) / seconds


class Watcher:
    """Looks every `interval` seconds in its own thread; `latest()`, `history()`, `events()`
    for readers in other threads."""

    def __init__(self, look: Callable[[], dict[str, Any]], interval: float,
                 clock: Callable[[], float] = time.time) -> None:
        self._look, self.interval, self._clock = look, interval, clock
        self._lock = threading.Lock()
        self._latest: Look | None = None
        self._last_good: Look | None = None
        self._history: deque[Point] = deque(maxlen=HISTORY)
        self._events: deque[Event] = deque(maxlen=EVENTS)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def look_once(self) -> Look:
        """Gather once and keep it (the thread's body; tests call it directly)."""
        started = time.monotonic()
        try:
            status, error = self._look(), None
        except SparkctlError as exc:  # an inventory or connection failure: shown, retried
            status, error = None, str(exc)
        look = Look(self._clock(), round(time.monotonic() - started, 3), status, error)
        if status is not None and self._last_good is not None:
            add_rates(self._last_good, look)
        with self._lock:
            self._events.extend(changes(self._last_good, self._latest, look))
            self._latest = look
            if status is not None:
                self._last_good = look
                self._history.append(point_of(look))
        return look

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sparkctl-dashboard-look",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 1)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.look_once()
            except Exception as exc:  # a bug in one look must not end the page's updates
                with self._lock:
                    self._latest = Look(self._clock(), 0.0, None, f"{type(exc).__name__}: {exc}")
            # like `status --watch`: the pause follows the look, so looks never overlap or
            # come closer than `interval` whatever the nodes' answer time
            self._stop.wait(self.interval)

    def latest(self) -> Look | None:
        with self._lock:
            return self._latest

    def history(self) -> list[Point]:
        with self._lock:
            return list(self._history)

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)
