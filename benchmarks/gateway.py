"""What the gateway (the SGLang Model Gateway) costs against the same servers directly, in the same run.

    python -m benchmarks.gateway --inventory F [--runs N] [--tg T] [--out FILE]

Needs a cluster (or lab) with a gateway up in front of its replicas (docs/gateway.md). Runs
`sparkctl bench --gateway --json` (both paths measured on the gateway's node, interleaved),
judges issue 40's goals (median added latency < 5 ms; throughput at concurrency 8 through the
gateway within 5 % of direct) and appends the run to FILE (default
benchmarks/results/gateway.json), so the history stays next to the code that produced it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gateway.json"
ADDED_MS_GOAL = 5.0
THROUGHPUT_GOAL = 0.95


def judge(doc: dict[str, Any]) -> dict[str, Any]:
    """The goals, pass or miss, from one `bench --gateway --json` document (pure)."""
    return {
        "added_latency_ms": {"value": doc["added_ms"], "goal": f"< {ADDED_MS_GOAL:g}",
                             "pass": doc["added_ms"] < ADDED_MS_GOAL},
        "throughput_ratio_c8": {"value": doc["ratio"], "goal": f">= {THROUGHPUT_GOAL:g}",
                                "pass": doc["ratio"] >= THROUGHPUT_GOAL},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inventory", required=True)
    parser.add_argument("--runs", type=int, default=5, help="x10 requests for the latency median")
    parser.add_argument("--tg", type=int, default=4, help="tokens per request")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--note", default="", help="what was measured (lab, hardware)")
    args = parser.parse_args(argv)
    sparkctl = str(Path(sys.executable).with_name("sparkctl"))
    result = subprocess.run([sparkctl, "bench", "--gateway", "--inventory", args.inventory,
                             "--tg", str(args.tg), "-c", "8", "--runs", str(args.runs), "--json"],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        print(result.stderr, file=sys.stderr)
        return result.returncode
    doc = json.loads(result.stdout)
    run = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "note": args.note,
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
           "tg": args.tg, "bench": doc, "goals": judge(doc)}
    history = json.loads(args.out.read_text()) if args.out.exists() else {"runs": []}
    history["runs"].append(run)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(history, indent=1) + "\n")
    for name, goal in run["goals"].items():
        print(f"{name:<22} {goal['value']:>8} (goal {goal['goal']}): "
              f"{'pass' if goal['pass'] else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
