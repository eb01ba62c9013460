"""Unified memory: the preflight before `launch` touches anything, and the guard during load.

A DGX Spark's 128 GB are shared by CPU and GPU. A load that overshoots does not fail cleanly:
the node thrashes and stops answering until a hard reset. So:

- **preflight** (a phase before the models are fetched, judged from facts: each serving node's
  /proc/meminfo rides along with the one facts request): MemAvailable (what dropping the page
  cache leaves; MemFree with --no-drop-caches), plus what the server this launch replaces frees,
  against the recipe's estimate for the node (weights share, draft, runtime) and the KV cache
  that TensorRT-LLM then takes as a fraction of what is left. What stays available must be at
  least the guard's threshold, else launch is refused with the numbers and the options.
- **guard** (`orchestrator/node/memguard.py`, started detached in the container of every
  serving node just before the server, its pid recorded like the server's): stops the server
  cleanly when MemAvailable falls below the threshold, and records why
  (`memguard-stopped.json` in the run dir), which `status` and the launch report show.

The figures of a node's plan are recorded in `memory.json` in the run dir (the guard's input,
what `status` shows; the lab's simulated engine sizes its allocation from it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.commands import quote, sh_cmd
from orchestrator.core.step import Change, NodeContext, NotDone, Outcome, Step, Unchanged
from orchestrator.errors import InputError
from orchestrator.node import script
from orchestrator.paths import RUN_DIR
from orchestrator.remote.container import ContainerCommands, ContainerTransport
from orchestrator.remote.gathered import NodeFacts

MEMINFO = "/proc/meminfo"
PLAN_FILE = f"{RUN_DIR}/memory.json"
GUARD_DEFAULT_GB = 2.0


def guard_threshold(option: float | None, recipe: Any) -> float:
    """The memory guard's threshold: `launch --guard-min-available-gb`, else the recipe's
    `memory.guard_min_available_gb`, else GUARD_DEFAULT_GB (one rule for every engine)."""
    return next(v for v in (option, recipe.memory.guard_min_available_gb, GUARD_DEFAULT_GB)
                if v is not None)
GIB = 1024**3


class Spec(Protocol):
    nodes: list[str]
    """The serving nodes, the first first."""
    first: str
    """The server's first node (where its record and main process are)."""
    run_dir: str
    """The server's directory (its pid files: what the guard stops)."""
    drop_caches: bool
    guard_min_available_gb: float

    def decision(self, ctx: NodeContext) -> str: ...


@dataclass(frozen=True)
class NodePlan:
    """What one serving node holds, from the recipe's estimate (GB)."""

    weights_gb: float
    draft_gb: float
    runtime_gb: float
    kv_cache_fraction: float
    tp_size: int
    total_weights_gb: float

    @property
    def loaded_gb(self) -> float:
        return self.weights_gb + self.draft_gb + self.runtime_gb


@dataclass(frozen=True)
class Verdict:
    fits: bool
    text: str
    options: tuple[str, ...] = ()


def parse_meminfo(text: str) -> dict[str, float]:
    """/proc/meminfo -> {"MemTotal": GB, ...}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1) / GIB
    return out


def usable_gb(meminfo: dict[str, float], drop_caches: bool) -> float:
    """MemAvailable counts the page cache the kernel would reclaim; a GPU allocation on unified
    memory does not get it back by itself, so without dropping caches only MemFree counts."""
    if drop_caches:
        return meminfo.get("MemAvailable", meminfo.get("MemFree", 0.0))
    return meminfo.get("MemFree", 0.0)


def judge(plan: NodePlan, total: float, usable: float, guard: float, freed: float = 0.0,
          drop_caches: bool = True) -> Verdict:
    """Pure: does the recipe fit in what the node has now, with the guard's margin left?"""
    start = min(total, usable + freed)
    left = start - plan.loaded_gb
    kv = max(0.0, left) * plan.kv_cache_fraction
    after = left - kv
    what = "MemAvailable" if drop_caches else "MemFree (--no-drop-caches)"
    text = (f"{what} {usable:.1f} of {total:.1f} GB"
            + (f" + {freed:.1f} GB the replaced server frees" if freed else "")
            + f"; the recipe holds {plan.loaded_gb:.1f} GB here (weights {plan.weights_gb:.1f}, "
            f"draft {plan.draft_gb:.1f}, runtime {plan.runtime_gb:.1f}), then a KV cache of "
            f"{plan.kv_cache_fraction:g} x {max(left, 0):.1f} GB = {kv:.1f} GB, leaving "
            f"{after:.1f} GB available (the memory guard stops the server below {guard:g} GB)")
    if after >= guard:
        return Verdict(True, text)
    options = []
    if left > guard:
        options.append(f"lower memory.kv_cache_fraction to {math.floor((1 - guard / left) * 100) / 100:g} "
                       "or less")
    else:
        options.append("a lower kv_cache_fraction does not help: the weights alone do not leave "
                       f"{guard:g} GB")
    per_node_fixed = plan.draft_gb + plan.runtime_gb
    for nodes in range(plan.tp_size + 1, 65):
        if start - (plan.total_weights_gb / nodes + per_node_fixed) > guard:
            options.append(f"more nodes: tp_size {nodes} holds {plan.total_weights_gb / nodes:.1f} GB "
                           "of weights per node")
            break
    options.append("fewer tokens (a lower max_num_tokens needs less runtime memory)")
    if total - usable > 1:
        options.append(f"free memory on the node: {total - usable:.1f} GB are in use by other "
                       "processes" + ("" if drop_caches else " or the page cache"))
    return Verdict(False, text, tuple(options))


def facts(inventory: Any, node: Any) -> dict[str, Any]:
    return {"files": {MEMINFO: True}}


def node_meminfo(ctx: NodeContext) -> dict[str, float] | None:
    meminfo = ctx.facts.file(MEMINFO)
    if meminfo is None or not meminfo.content:
        return None
    return parse_meminfo(meminfo.content)


def freed_by_replaced(ctx: NodeContext, status: dict[str, Any], decision: str) -> float:
    """What the server this launch stops gives back on this node (its recorded estimate)."""
    if decision not in ("replace", "restart", "start"):
        return 0.0
    server = status.get("server") or {}
    alive = any(info.get("alive") for info in (status.get("pids") or {}).values())
    if not alive:
        return 0.0
    return float(server.get("memory_gb_per_node") or 0.0)


class MemoryPreflight(Step):
    """Before any download: the recipe fits in what each serving node has available now."""

    name = "memory-preflight"

    def __init__(self, spec: Spec, plan: NodePlan, status_of: Any) -> None:
        self.spec = spec
        self.plan = plan
        self.status_of = status_of

    def check(self, ctx: NodeContext) -> Outcome:
        if ctx.node.name not in self.spec.nodes:
            return Unchanged("not a serving node")
        decision = self.spec.decision(ctx)
        if decision in ("noop", "loading"):
            return Unchanged("the same server already runs here")
        info = node_meminfo(ctx)
        if info is None or "MemTotal" not in info:
            return Unchanged(f"could not read {MEMINFO}; memory not checked")
        first = ctx.cluster_facts.get(self.spec.first) or NodeFacts(self.spec.first)
        freed = freed_by_replaced(ctx, self.status_of(first), decision)
        verdict = judge(self.plan, info["MemTotal"], usable_gb(info, self.spec.drop_caches),
                        self.spec.guard_min_available_gb, freed, self.spec.drop_caches)
        if not verdict.fits:
            raise InputError(f"{ctx.node.name}: the recipe does not fit in the memory available "
                             f"now: {verdict.text}. Options: " + "; ".join(verdict.options)
                             + ". Nothing was downloaded or started.")
        return Unchanged("fits: " + verdict.text)


def plan_record(node: str, plan: NodePlan, guard: float, recipe: str) -> dict[str, Any]:
    return {"node": node, "recipe": recipe, "weights_gb": round(plan.weights_gb, 2),
            "draft_gb": plan.draft_gb, "runtime_gb": plan.runtime_gb,
            "loaded_gb": round(plan.loaded_gb, 2), "kv_cache_fraction": plan.kv_cache_fraction,
            "guard_min_available_gb": guard}


def write_plan_cmd() -> str:
    return sh_cmd(f"umask 022; cat > {quote(PLAN_FILE)}.tmp && mv {quote(PLAN_FILE)}.tmp "
                  f"{quote(PLAN_FILE)}")


def stop_guard_cmd(run: str) -> str:
    """Stop the guard an earlier launch started for this run dir, if it still runs (its pid
    file names a process whose command line is a guard's: a pid reused after a reboot is
    left alone): a relaunch starts its own, and two guards would watch the one server, the
    older with the older threshold."""
    pid = quote(f"{run}/memguard.pid")
    return (f"if [ -f {pid} ] && grep -qsa sparkctl-memguard /proc/\"$(cat {pid})\"/cmdline; "
            f"then kill \"$(cat {pid})\" 2>/dev/null; rm -f {pid}; fi")


def guard_cmd(container: str, node: str, guard: float, run: str = RUN_DIR) -> str:
    """`docker exec -d` of the guard in the node's container (it records its own pid in `run`,
    the server's directory, and guards the pid files there)."""
    args = json.dumps({"run": run, "node": node, "min_available_gb": guard}, sort_keys=True)
    return ContainerCommands(container).exec_cmd(
        ["python3", "-c", script("memguard.py"), "sparkctl-memguard", args], detach=True)


class StartGuard(Step):
    """Record the node's memory plan and start the memory guard, before the server starts."""

    name = "memory-guard"

    def __init__(self, spec: Spec, plan: NodePlan, recipe: str) -> None:
        self.spec = spec
        self.plan = plan
        self.recipe = recipe

    def check(self, ctx: NodeContext) -> Outcome:
        if ctx.node.name not in self.spec.nodes:
            return Unchanged("not a serving node")
        if self.spec.decision(ctx) in ("noop", "loading"):
            return Unchanged("the server already runs (with its guard)")
        guard = self.spec.guard_min_available_gb
        return Change(f"start the memory guard: stops the server here if MemAvailable falls "
                      f"below {guard:g} GB (record {PLAN_FILE})",
                      commands=(guard_cmd(ctx.inventory.container.name, ctx.node.name, guard,
                                          self.spec.run_dir),))

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        guard = self.spec.guard_min_available_gb
        record = plan_record(ctx.node.name, self.plan, guard, self.recipe)
        ctx.run(write_plan_cmd(), stdin=json.dumps(record, indent=1) + "\n", sudo=True,
                timeout=30, display=f"write {PLAN_FILE}").check()
        container = ctx.inventory.container.name
        # an earlier guard's stop record is about the server this launch starts again
        ctx.run(f"rm -f {quote(self.spec.run_dir + '/memguard-stopped.json')}", sudo=True,
                timeout=30).check()
        # the previous launch's guard, in the container's PID namespace where it runs
        inside = ContainerTransport(ctx, container)
        inside.run(["sh", "-c", stop_guard_cmd(self.spec.run_dir)], timeout=60,
                   display=f"stop the earlier memory guard in {container}").check()
        ctx.run(change.commands[0], timeout=60,
                display=inside.shown("python3 -c <sparkctl memguard>", detach=True)).check()
        return f"memory guard started (stops the server below {guard:g} GB available)"


def node_guard_cmd(record_dir: str, node: str, guard: float, containers: list[str]) -> str:
    """The memory guard on the node itself, watching the server's containers (SGLang, vLLM's
    Ray): started detached (setsid) in place of a guard an earlier launch of this server left
    running (its threshold may differ); a stop record of an earlier run is removed first (this
    launch starts the server again)."""
    args = json.dumps({"run": record_dir, "node": node, "min_available_gb": guard,
                       "containers": containers}, sort_keys=True)
    start = " ".join(quote(a) for a in ("python3", "-c", script("memguard.py"), "sparkctl-memguard", args))
    return (f"mkdir -p {quote(record_dir)} && rm -f {quote(record_dir + '/memguard-stopped.json')} "
            f"&& {{ {stop_guard_cmd(record_dir)}; }} && "
            f"{{ setsid {start} </dev/null >/dev/null 2>&1 & }}")


class NodeGuard(Step):
    """The memory guard on every serving node of a server whose processes are its containers."""

    name = "memory-guard"
    batch = True  # its one command, judged by the default `done`

    def __init__(self, nodes: list[str], record_dir: str, containers: list[str], guard: float,
                 not_needed: Callable[[NodeContext], str | None]) -> None:
        self.nodes, self.record_dir, self.containers = nodes, record_dir, containers
        self.guard, self.not_needed = guard, not_needed

    def check(self, ctx: NodeContext) -> Outcome:
        if ctx.node.name not in self.nodes:
            return Unchanged("not a serving node")
        reason = self.not_needed(ctx)
        if reason:
            return Unchanged(reason)
        return Change(f"start the memory guard: stops {', '.join(self.containers)} here if "
                      f"MemAvailable falls below {self.guard:g} GB",
                      commands=(node_guard_cmd(self.record_dir, ctx.node.name, self.guard,
                                               self.containers),))


def stop_record(status: dict[str, Any]) -> dict[str, Any] | None:
    record = status.get("memguard")
    return record if isinstance(record, dict) else None


def describe_stop(stop: dict[str, Any]) -> str:
    """The guard's own record of a stop (node/memguard.py's memguard-stopped.json)."""
    return (f"stopped by the memory guard on {stop.get('node', '?')}: "
            f"{stop.get('available_gb', '?')} GB available < {stop.get('min_available_gb', '?')} GB "
            f"(of {stop.get('total_gb', '?')} GB, at {stop.get('time', '?')})")


DROP_CACHES = "sync; echo 3 > /proc/sys/vm/drop_caches"


class DropCaches(Step):
    """NVIDIA's advice for unified-memory trouble while loading: on by default before a cold
    start (--no-drop-caches skips it); where /proc/sys is read-only it says so and continues.

    `not_cold(ctx)` says why this node needs no drop (not a serving node, already loaded,
    skipped by the flag), or None before a cold start: each engine knows that its own way."""

    name = "drop-caches"
    batch = True
    keep_going = True  # a page cache that cannot be dropped is a warning, not a failure
    timeout = 120

    def __init__(self, not_cold: Callable[[NodeContext], str | None]) -> None:
        self.not_cold = not_cold

    def check(self, ctx: NodeContext) -> Outcome:
        reason = self.not_cold(ctx)
        if reason:
            return Unchanged(reason)
        return Change("drop the page cache before the cold start (unified memory: the GPU does "
                      "not get page cache back by itself; --no-drop-caches skips this)",
                      commands=(DROP_CACHES,))

    def done(self, ctx: NodeContext, change: Change, results: list[Any]) -> str | None:
        result = results[-1]  # (a failure is a warning)
        if result.ok:
            return "dropped the page cache"
        return NotDone("skipped: could NOT drop the page cache ("
                       + (result.stderr.strip().splitlines() or ["?"])[-1]
                       + "; /proc/sys is read-only here, e.g. in the lab); continuing without it")
