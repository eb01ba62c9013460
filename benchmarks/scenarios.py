"""The benchmark scenarios: each brings up its own lab(s) on one lab id and takes them down."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import fanout, fanout_probe, floor, staging
from benchmarks.labctl import SPARKCTL, BenchError, Lab, Timed
from benchmarks.stats import Measurement, median

RECIPE = "qwen3-235b"  # two ranks: launch stages the model from the head to the peer
DELAY_MS = 30.0


@dataclass
class Settings:
    lab_id: int
    runs: int
    sizes: list[int]
    model_bytes: int
    engine_load_seconds: float
    log: Callable[[str], None] = print


@dataclass
class Results:
    rows: dict[str, Measurement] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def row(self, name: str, unit: str = "s", note: str = "") -> Measurement:
        if name not in self.rows:
            self.rows[name] = Measurement(name, unit, note=note)
        return self.rows[name]

    def add(self, name: str, timed: Timed, note: str = "") -> None:
        """Record a sparkctl run: its wall time (None if it failed) and trace counts."""
        row = self.row(name, note=note)
        row.runs.append(timed.seconds if timed.ok else None)
        row.connections = timed.trace.max_connections
        row.commands = timed.trace.max_commands
        if not timed.ok:
            self.notes.append(f"{name}: sparkctl failed, {timed.failure()}")


def read_host_keys(lab: Lab) -> dict[str, str]:
    return {n: lab.exec(n, f"cat {floor.HOST_KEY}") for n in lab.node_names()}


def bench_help(s: Settings, res: Results) -> None:
    """`sparkctl --help` (target < 0.1 s), beside the interpreter's own start-up, alternating:
    on a busy machine the second says how much of the first is Python starting at all."""
    row = res.row("sparkctl --help", note="python start-up + click")
    bare = res.row("floor: python start-up alone (python -c pass)", note="same interpreter")
    for _ in range(max(5, s.runs)):
        for argv, into in (([SPARKCTL, "--help"], row), ([sys.executable, "-c", "pass"], bare)):
            started = time.perf_counter()
            subprocess.run(argv, capture_output=True, check=True)
            into.runs.append(time.perf_counter() - started)


def bench_two_node(s: Settings, res: Results, workdir: Path) -> None:
    """Fresh 2-node lab per run: cold up, no-change up, netcheck, launch, down; staging; floor."""
    captures = {"cold": workdir / "capture-cold.json", "noop": workdir / "capture-noop.json"}
    host_keys: dict[str, str] = {}
    inventory: dict[str, object] = {}
    for run in range(s.runs):
        lab = Lab(s.lab_id, 2, "b2b", workdir)
        s.log(f"two-node run {run + 1}/{s.runs}: lab up")
        lab.up(s.engine_load_seconds, s.model_bytes)
        try:
            first = run == 0
            cold = lab.sparkctl("up", "--yes", capture=captures["cold"] if first else None)
            res.add("up cold, 2 nodes", cold)
            if not cold.ok:
                continue
            if first:
                host_keys, inventory = read_host_keys(lab), lab.inventory_data()
                lab.sparkctl("up", "--yes", capture=captures["noop"])  # untimed: the commands
            res.add("up no-change, 2 nodes", lab.sparkctl("up", "--yes"),
                    note="over the connections the last run left kept (remote/keeper.py)")
            res.add("up no-change, 2 nodes, first contact", lab.sparkctl(
                "up", "--yes", env={"SPARKCTL_SSH_PERSIST": "0"}),
                note="SPARKCTL_SSH_PERSIST=0: connects and logs in itself")
            res.add("netcheck, 2 nodes", lab.sparkctl("netcheck"))
            token = workdir / "hf_token"  # the lab's hub takes any hf_* token
            token.write_text("hf_sparklab_benchmark\n")
            token.chmod(0o600)
            launch = lab.sparkctl("launch", RECIPE, "--yes", "--timeout", "300",
                                  "--hf-token-file", str(token))
            res.add(f"launch {RECIPE}, 2 nodes", launch,
                    note=f"engine load {s.engine_load_seconds:g} s; incl. staging")
            if launch.ok:
                _staging(lab, launch, res)
            res.add("down, 2 nodes", lab.sparkctl("down", "--yes"))
        finally:
            lab.down()
    if not inventory:
        res.notes.append("floor: not measured (the cold up never succeeded)")
        return
    for run in range(s.runs):
        lab = Lab(s.lab_id, 2, "b2b", workdir)
        s.log(f"floor run {run + 1}/{s.runs}")
        lab.up(s.engine_load_seconds, s.model_bytes)
        try:
            data = lab.inventory_data()
            _floor(res, "floor: up cold, 2 nodes", captures["cold"], data, host_keys)
            _floor(res, "floor: up no-change, 2 nodes", captures["noop"], data)
        finally:
            lab.down()


def _staging(lab: Lab, launch: Timed, res: Results) -> None:
    """The launch's model copy (its distribute step's own figures), next to iperf3; the fanout
    scenario measures it in depth."""
    head, peer = lab.node_names()[:2]
    copied = fanout.fanout_rate(launch, peer)
    if copied is None:
        res.notes.append("model copy: launch copied nothing (was the model already there?)")
    else:
        res.row("model copy head->peer in the launch (fan-out, verified)", "MB/s",
                note=f"{copied.mb:.0f} MB").runs.append(copied.mb_per_s)
        res.row("model copy seconds", note=f"{copied.mb:.0f} MB").runs.append(copied.seconds)
    res.row("iperf3 raw TCP head->peer, fabric", "MB/s",
            note="1 stream, 3 s").runs.append(staging.iperf(lab, head, peer))


def _floor(res: Results, name: str, capture: Path, inventory: dict[str, object],
           host_keys: dict[str, str] | None = None) -> None:
    scripts = floor.scripts_from_capture(floor.load_capture(capture), inventory, host_keys)
    result = floor.run_floor(scripts, inventory)
    row = res.row(name, note="1 OpenSSH conn/node, 1 script")
    row.runs.append(result.seconds)
    row.connections, row.commands = 1, 1
    if result.failed:
        res.notes.append(f"{name}: replayed commands failed: {', '.join(result.failed)}")


def bench_delay(s: Settings, res: Results, workdir: Path) -> None:
    """No-change up with +30 ms on every node's management egress (node -> controller)."""
    lab = Lab(s.lab_id, 2, "b2b", workdir)
    s.log(f"delay: lab up, +{DELAY_MS:g} ms on eth0")
    lab.up(s.engine_load_seconds, s.model_bytes)
    capture = workdir / "capture-noop-delay.json"
    label = f"+{DELAY_MS:g} ms"
    try:
        cold = lab.sparkctl("up", "--yes")
        if not cold.ok:
            raise BenchError(f"delay: cold up failed: {cold.failure()}")
        lab.sparkctl("up", "--yes", capture=capture)  # untimed: records the commands
        data = lab.inventory_data()
        for _ in range(s.runs):  # the baseline, on this same lab
            res.add("up no-change, 2 nodes", lab.sparkctl("up", "--yes"),
                    note="over the connections the last run left kept (remote/keeper.py)")
            res.add("up no-change, 2 nodes, first contact", lab.sparkctl(
                "up", "--yes", env={"SPARKCTL_SSH_PERSIST": "0"}),
                note="SPARKCTL_SSH_PERSIST=0: connects and logs in itself")
            _floor(res, "floor: up no-change, 2 nodes", capture, data)
        for node in lab.node_names():
            lab.delay(node, "eth0", DELAY_MS)
        res.row(f"TCP connect controller->node, {label}", "ms",
                note="1 RTT: checks the delay").runs.append(_tcp_connect_ms(lab))
        for _ in range(s.runs):
            res.add(f"up no-change, 2 nodes, {label}", lab.sparkctl("up", "--yes"))
        for _ in range(s.runs):
            _floor(res, f"floor: up no-change, 2 nodes, {label}", capture, data)
        _rtt_equivalents(res, label)
    finally:
        lab.restore_faults()
        lab.down()


def _rtt_equivalents(res: Results, label: str) -> None:
    """(time with delay - time without) / delay = round trips on the critical path."""
    pairs = {"sparkctl": ("up no-change, 2 nodes", f"up no-change, 2 nodes, {label}"),
             "floor": ("floor: up no-change, 2 nodes", f"floor: up no-change, 2 nodes, {label}")}
    for who, (plain, delayed) in pairs.items():
        a, b = res.rows.get(plain), res.rows.get(delayed)
        if a and b and a.value is not None and b.value is not None:
            res.row(f"{who}: sequential RTTs seen ((delayed - plain) / {DELAY_MS:g} ms)", "RTT",
                    note="measured").runs.append((b.value - a.value) / (DELAY_MS / 1000))


def _tcp_connect_ms(lab: Lab, tries: int = 5) -> float | None:
    """Median TCP handshake time to the first node's sshd: one round trip."""
    host = lab.inventory_data()["nodes"][0]["host"]
    times = []
    for _ in range(tries):
        started = time.perf_counter()
        with socket.create_connection((host, 22), timeout=5):
            times.append((time.perf_counter() - started) * 1000)
    return median(times)


def bench_scale(s: Settings, res: Results, workdir: Path) -> None:
    """Cold and no-change up on a switch topology of each size (one fresh lab per size)."""
    for size in s.sizes:
        lab = Lab(s.lab_id, size, "switch", workdir)
        s.log(f"scale: {size} nodes (switch): lab up")
        lab.up(s.engine_load_seconds, s.model_bytes)
        capture = workdir / f"capture-noop-{size}.json"
        try:
            cold = lab.sparkctl("up", "--yes")
            res.add(f"up cold, {size} nodes", cold, note="switch; 1 run (fresh lab)")
            if not cold.ok:
                continue
            lab.sparkctl("up", "--yes", capture=capture)  # untimed: records the commands
            for _ in range(s.runs):
                res.add(f"up no-change, {size} nodes", lab.sparkctl("up", "--yes"))
            data = lab.inventory_data()
            for _ in range(s.runs):
                _floor(res, f"floor: up no-change, {size} nodes", capture, data)
        finally:
            lab.down()


FANOUT_MIN_BYTES = 384 * 2**20


def bench_fanout(s: Settings, res: Results, workdir: Path) -> None:
    """Fan-out vs SSH streams vs iperf3 on one 2-node lab, interleaved run by run."""
    lab = Lab(s.lab_id, 2, "b2b", workdir)
    model_bytes = max(s.model_bytes, FANOUT_MIN_BYTES)  # issue #18 measures >= 384 MiB
    s.log(f"fanout: lab up, model {model_bytes / 2**20:.0f} MiB")
    lab.up(s.engine_load_seconds, model_bytes)
    head, peer = lab.node_names()[:2]
    size = f"{model_bytes / 2**20:.0f} MiB model + draft"
    try:
        if not lab.sparkctl("up", "--yes").ok:
            raise BenchError("fanout: up failed")
        token = workdir / "hf_token"
        token.write_text("hf_sparklab_benchmark\n")
        token.chmod(0o600)
        launch = ["launch", RECIPE, "--yes", "--timeout", "300", "--hf-token-file", str(token)]
        first = lab.sparkctl(*launch)
        if not first.ok:
            raise BenchError(f"fanout: launch failed: {first.failure()}")
        for run in range(s.runs):
            s.log(f"fanout run {run + 1}/{s.runs}")
            res.row("iperf3 raw TCP head->peer (fan-out lab)", "MB/s",
                    note="1 stream, 3 s").runs.append(staging.iperf(lab, head, peer))
            # as a model is copied in a launch: no server holds the nodes' memory yet, and the
            # head's files are in its page cache (just downloaded)
            stopped = lab.sparkctl("down", "--server", RECIPE, "--yes")
            if not stopped.ok:
                raise BenchError(f"fanout: down --server failed: {stopped.failure()}")
            fanout.warm_head(lab, head)
            mb_s, total, _ = fanout.ssh_parallel(lab, head, peer)
            res.row("fan-out over SSH, 1 stream per file (aes128-gcm)", "MB/s",
                    note=f"{total / 2**20:.0f} MiB").runs.append(mb_s)
            fanout.clear_peer(lab, peer)
            fanout.warm_head(lab, head)
            again = lab.sparkctl(*launch)
            copied = fanout.fanout_rate(again, peer) if again.ok else None
            if copied is None:
                res.notes.append(f"fanout: launch copied nothing or failed: {again.failure()}")
                continue
            res.row("fan-out sparkctl (raw TCP, verified), wall", "MB/s",
                    note=size).runs.append(copied.mb_per_s)
            res.row("fan-out sparkctl seconds", note=size).runs.append(copied.seconds)
            if copied.wire:
                res.row("fan-out sparkctl, on the wire (sender's seconds)", "MB/s",
                        note=size).runs.append(copied.mb / copied.wire)
            if copied.cpu_busy is not None:
                res.row("fan-out sparkctl: receiver's CPU busy", "%",
                        note="near 100: CPU-bound").runs.append(copied.cpu_busy)
            res.row("disk read, head, cold (O_DIRECT)", "MB/s",
                    note="the limit when the model is not in the page cache"
                    ).runs.append(fanout.disk_read(lab, head))
            time.sleep(1)
        s.log("fanout: where the time goes (node script alone, interleaved with iperf3)")
        # no server either (the last launch started one: it would hold the nodes' memory)
        lab.sparkctl("down", "--server", RECIPE, "--yes")
        rows = fanout_probe.probe(lab, head, peer, model_bytes // 2**20, s.runs)
        for name, values in rows.items():
            label = "iperf3 raw TCP head->peer (probe)" if name == "iperf3" else \
                f"fan-out node script: {name}"
            unit = "%" if name in fanout_probe.PERCENT else "MB/s"
            res.row(label, unit, note=f"{model_bytes / 2**20:.0f} MiB, wire time"
                    ).runs.extend(values)
    finally:
        lab.down()
