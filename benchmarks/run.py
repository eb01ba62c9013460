"""`make bench`: sparkctl's own overhead on the simulated lab, against the physical floor.

    python -m benchmarks.run [--quick] [--runs N] [--only NAME] [--lab-id ID] [--out FILE]

Prints a results table (medians of --runs runs), a targets table (pass/miss) and writes the
same as JSON. Needs root (the lab is network namespaces). See docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import engines, gateway_routers, launch_overhead, scenarios
from benchmarks.labctl import BenchError
from benchmarks.stats import Target, results_table, targets_table

SCENARIOS = ("help", "two-node", "fanout", "engines", "delay", "scale", "launch", "gateway")
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "latest.json"
MIB = 2**20

TARGETS = [
    Target("no-change up, 2 nodes < 1 s", "up no-change, 2 nodes", 1.0),
    Target("no-change up, 16 nodes < 1.5 s", "up no-change, 16 nodes", 1.5),
    Target("no-change up, 2 nodes, +30 ms < 2 s", "up no-change, 2 nodes, +30 ms", 2.0),
    Target("cold up <= 1.5x floor", "up cold, 2 nodes", 1.5, "floor: up cold, 2 nodes"),
    Target("cold up, 16 nodes <= 1.5x 2 nodes", "up cold, 16 nodes", 1.5, "up cold, 2 nodes"),
    Target("no-change up, 16 nodes <= 1.5x 2 nodes", "up no-change, 16 nodes", 1.5,
           "up no-change, 2 nodes"),
    Target("fan-out >= 70% of iperf3", "fan-out sparkctl (raw TCP, verified), wall", 0.70,
           "iperf3 raw TCP head->peer (fan-out lab)", at_least=True),
    Target("fan-out >= 50% of iperf3 (the minimum)", "fan-out sparkctl (raw TCP, verified), wall",
           0.50, "iperf3 raw TCP head->peer (fan-out lab)", at_least=True),
    Target("fan-out on the wire >= 50% of iperf3",
           "fan-out sparkctl, on the wire (sender's seconds)", 0.50,
           "iperf3 raw TCP head->peer (fan-out lab)", at_least=True),
    # what limits the verified copy on the lab, computed from the same run's figures: both ends
    # share the machine's CPUs, which move (TCP, splice, page cache) and hash every byte
    Target("fan-out >= 90% of the verified ceiling on these CPUs",
           "fan-out sparkctl (raw TCP, verified), wall", 0.90,
           "fan-out node script: verified copy's ceiling on these CPUs (computed)", at_least=True),
    Target("that ceiling >= 50% of iperf3 (can any verified copy make the minimum here?)",
           "fan-out node script: verified copy's ceiling on these CPUs (computed)", 0.50,
           "iperf3 raw TCP head->peer (probe)", at_least=True),
    Target("transport alone (node script, not verified) >= 70% of iperf3",
           "fan-out node script: not verified (sha256 no-op), 4 streams", 0.70,
           "iperf3 raw TCP head->peer (probe)", at_least=True),
    Target("sparkctl --help < 0.1 s", "sparkctl --help", 0.1),
    Target("no-change up, 2 nodes <= 1.2x floor", "up no-change, 2 nodes", 1.2,
           "floor: up no-change, 2 nodes"),
    Target("cold up <= 1.2x floor", "up cold, 2 nodes", 1.2, "floor: up cold, 2 nodes"),
    Target("launch (real llama-server, model in place) <= 1.3x by hand",
           f"launch {launch_overhead.RECIPE} (real llama-server), model in place", 1.3,
           f"floor: the same docker run by hand + /health, {launch_overhead.RECIPE}"),
    *gateway_routers.TARGETS,
]


def machine() -> dict[str, Any]:
    meminfo = Path("/proc/meminfo").read_text().split("\n")[0].split()
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.processor() or "?")
    return {"nproc": os.cpu_count(), "source": source_version(),
            "memory_gib": round(int(meminfo[1]) / MIB, 1),
            "kernel": platform.release(), "cpu": cpu, "python": platform.python_version(),
            "loadavg_at_start": os.getloadavg()[0]}


def source_version() -> str:
    """The commit measured, and whether the tree had local changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + (" + local changes" if dirty else "")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one run of each (same as --runs 1)")
    parser.add_argument("--runs", type=int, default=3, help="runs per benchmark (median)")
    parser.add_argument("--only", choices=SCENARIOS, action="append",
                        help="run only this scenario (repeatable)")
    parser.add_argument("--lab-id", type=int, default=int(os.environ.get("SPARKLAB_ID", "9")),
                        help="lab id to use (default $SPARKLAB_ID or 9); must not be up")
    parser.add_argument("--sizes", default="4,8,16", help="node counts for the scale scenario")
    parser.add_argument("--model-mib", type=int, default=256, help="lab model size for staging")
    parser.add_argument("--engine-load-seconds", type=float, default=0.0,
                        help="the lab engine's simulated load time (launch includes it)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs = 1
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    return args


def compiled() -> None:
    """sparkctl's modules compiled to bytecode, as `pip install` leaves an installed copy: with
    PYTHONDONTWRITEBYTECODE set in the shell (as on this project's machine) every start would
    otherwise compile ~100 modules from source again (about 1 s, measured with cProfile), which
    no user's installed sparkctl does."""
    import compileall

    root = Path(__file__).resolve().parent.parent
    for folder in ("orchestrator", "lab/sparklab"):
        compileall.compile_dir(root / folder, quiet=1)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if os.geteuid() != 0:
        print("benchmarks: the lab needs root (network namespaces); run as root", file=sys.stderr)
        return 2
    settings = scenarios.Settings(
        lab_id=args.lab_id, runs=args.runs, sizes=[int(n) for n in args.sizes.split(",") if n],
        model_bytes=args.model_mib * MIB, engine_load_seconds=args.engine_load_seconds,
        log=lambda line: print(f"[bench {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr))
    results = scenarios.Results()
    compiled()
    info = machine()
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="sparkctl-bench-"))
    try:
        for name in args.only or SCENARIOS:
            try:
                if name == "help":
                    scenarios.bench_help(settings, results)
                elif name == "two-node":
                    scenarios.bench_two_node(settings, results, workdir)
                elif name == "fanout":
                    scenarios.bench_fanout(settings, results, workdir)
                elif name == "engines":
                    engines.bench_engines(settings, results, workdir)
                elif name == "delay":
                    scenarios.bench_delay(settings, results, workdir)
                elif name == "launch":
                    launch_overhead.bench_launch(settings, results, workdir)
                elif name == "gateway":
                    gateway_routers.bench_gateway(settings, results, workdir)
                else:
                    scenarios.bench_scale(settings, results, workdir)
            except BenchError as exc:
                results.notes.append(f"{name}: {exc}")
            # a broken lab or tool must not hide the other scenarios' figures
            except (OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
                results.notes.append(f"{name}: {type(exc).__name__}: {exc}")
    except KeyboardInterrupt:
        print("benchmarks: interrupted (labs taken down)", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(workdir, ignore_errors=True)  # captures hold the labs' cluster keys
    elapsed = time.monotonic() - started
    print_report(results, info, elapsed, args)
    write_json(args.out, results, info, elapsed, args)
    return 0


def print_report(results: scenarios.Results, info: dict[str, Any], elapsed: float,
                 args: argparse.Namespace) -> None:
    print(f"\nsparkctl benchmarks: {info['nproc']} CPUs ({info['cpu']}), {info['memory_gib']} GiB,"
          f" kernel {info['kernel']}, source {info['source']};"
          f" {args.runs} run(s) each, {elapsed:.0f} s in all\n")
    print(results_table(list(results.rows.values())))
    print()
    print(targets_table(TARGETS, results.rows))
    for note in results.notes:
        print(f"note: {note}")
    print(f"\nJSON: {args.out}")


def write_json(path: Path, results: scenarios.Results, info: dict[str, Any], elapsed: float,
               args: argparse.Namespace) -> None:
    targets = []
    for target in TARGETS:
        status, value, limit = target.evaluate(results.rows)
        targets.append({"target": target.name, "status": status, "measured": value,
                        "limit": limit})
    data = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "machine": info,
            "runs": args.runs, "seconds": round(elapsed, 1),
            "settings": {"model_bytes": args.model_mib * MIB, "sizes": args.sizes,
                         "engine_load_seconds": args.engine_load_seconds},
            "results": [row.to_json() for row in results.rows.values()],
            "targets": targets, "notes": results.notes}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
