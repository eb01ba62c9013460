"""The gateway as shipped (the SGLang Model Gateway) against the same real replicas directly,
and while replicas join and leave under load.

    python -m benchmarks.gateway_routers --lab-id ID [--rounds N] [--tg T] [--out FILE]
    python -m benchmarks.run --only gateway        (the same, as `make bench`'s rows and targets)

Issue 40, item 2: the gateway adds < 5 ms median at concurrency 1 against the same replicas
directly; throughput at concurrency 8 within 5 %; a replica joins and leaves with no restart
and no failed request under a bounded load. A two-node lab, two replicas of the real
llama-server (`lab-tiny-llama`, one per node), `sparkctl gateway up` (sglang-router
ROUTER_VERSION, least busy). Measured by the gateway node's own `bench --gateway` script
(orchestrator/node/gateway_bench.py: direct and through, interleaved) over N rounds. Then a
bounded load (2 at a time) while a third replica joins (`launch --name r-c`: `POST /workers`)
and one leaves (`down --server r-b`: `DELETE /workers/ID`, drained); the failed requests are
counted and the router's pid compared (no restart). Before issue 40 this benchmark measured
LiteLLM beside a router it started itself: those figures are in docs/performance.md.
Results go to benchmarks/results/gateway-routers.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.labctl import SPARKCTL, BenchError, Lab
from benchmarks.scenarios import Results, Settings
from benchmarks.stats import Target

ROOT = Path(__file__).resolve().parents[1]
ROUTER_VERSION = "0.3.2"
GATEWAY_PORT = 4000
RECIPE = "lab-tiny-llama"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gateway-routers.json"
BENCH_SCRIPT = ROOT / "orchestrator" / "node" / "gateway_bench.py"
"""Both scripts run from the host in the head node's network namespace (in_node_netns)."""
LOAD_SCRIPT = Path(__file__).with_name("bounded_load.py")


def in_node_netns(lab: Lab, node: str) -> list[str]:
    """Run from the host in NODE's network namespace (its loopback, its fabric routes): `lab
    exec` stops a command after 60 s, and these measure for longer."""
    return ["ip", "netns", "exec", f"sparklab{lab.lab_id}-{node}", sys.executable]


def node_python(lab: Lab, node: str, script: Path, args: dict[str, Any], timeout: float = 900
                ) -> dict[str, Any]:
    proc = subprocess.run([*in_node_netns(lab, node), str(script), json.dumps(args)],
                          capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise BenchError(f"{script.name} on {node}: {proc.stderr[-400:]}")
    return dict(json.loads(proc.stdout))


def ok(timed: Any, what: str) -> None:
    if not timed.ok:
        raise BenchError(f"{what}: {timed.failure()}")


def router_pid(lab: Lab, head: str) -> str:
    return lab.exec(head, "cat /var/lib/sparkctl/run/gateway/router.pid").strip()


def compare(lab: Lab, head: str, model: str, direct: list[str], rounds: int, tg: int
            ) -> dict[str, Any]:
    # on the node's loopback without a key (the benchmark's clients run there)
    runs = [node_python(lab, head, BENCH_SCRIPT, {
        "gateway": f"http://127.0.0.1:{GATEWAY_PORT}", "config": "/nonexistent", "model": model,
        "requests": 30, "seconds": 15, "concurrency": 8, "max_tokens": tg, "direct": direct})
        for _ in range(rounds)]
    return {"added_ms_median": statistics.median(r["added_ms"] for r in runs),
            "throughput_ratio_median": statistics.median(r["ratio"] for r in runs), "runs": runs}


def join_and_leave(lab: Lab, head: str, model: str) -> dict[str, Any]:
    """A bounded load through the gateway while r-c joins and r-b leaves."""
    stop = lab.workdir / "load-stop"
    args = {"url": f"http://127.0.0.1:{GATEWAY_PORT}", "model": model, "key_file": None,
            "concurrency": 2, "max_tokens": 4, "stop_file": str(stop), "seconds": 900}
    load = subprocess.Popen([*in_node_netns(lab, head), str(LOAD_SCRIPT), json.dumps(args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = router_pid(lab, head)
    try:
        time.sleep(5)
        ok(lab.sparkctl("launch", RECIPE, "--nodes", lab.node_names()[1], "--name", "r-c",
                        "--port", "8081", "--yes", "--timeout", "300"), "launch r-c")
        time.sleep(10)
        ok(lab.sparkctl("down", "--server", "r-b", "--yes"), "down --server r-b")
        time.sleep(10)
    finally:
        stop.touch()
    out, err = load.communicate(timeout=300)
    try:
        result = json.loads(out)
    except ValueError:
        result = {"error": err[-400:]}
    return {"load": result, "router_restarted": router_pid(lab, head) != pid}


def gateway_status(lab: Lab) -> dict[str, Any]:
    proc = subprocess.run([SPARKCTL, "gateway", "status", "--inventory", str(lab.inventory),
                           "--json"], env=lab.env, capture_output=True, text=True, check=False)
    return dict(json.loads(proc.stdout))


ADDED = "gateway: ms it adds per request, concurrency 1 (2 real llama-server replicas)"
RATIO = "gateway: throughput at concurrency 8, through / direct"
FAILED = "gateway: failed requests while a replica joins and one leaves (bounded load)"
RESTARTS = "gateway: router restarts while a replica joins and one leaves"
TARGETS = [
    Target("the gateway adds < 5 ms at concurrency 1", ADDED, 5.0),
    Target("gateway throughput at concurrency 8 >= 95% of direct", RATIO, 0.95, at_least=True),
    Target("a replica joins and leaves under load: 0 failed requests", FAILED, 0),
    Target("a replica joins and leaves: no gateway restart", RESTARTS, 0),
]


def measure(lab: Lab, rounds: int, tg: int) -> dict[str, Any]:
    """Up, two replicas (one per node), the gateway, then the comparison and the join and leave.
    The lab must be up; it is left with whatever runs (the caller takes it down)."""
    a, b = lab.node_names()
    ok(lab.sparkctl("up", "--yes"), "up")
    for node, name in ((a, "r-a"), (b, "r-b")):
        ok(lab.sparkctl("launch", RECIPE, "--nodes", node, "--name", name, "--yes",
                        "--timeout", "300"), f"launch {name}")
    ok(lab.sparkctl("gateway", "up", "--port", str(GATEWAY_PORT)), "gateway up")
    status = gateway_status(lab)
    direct = [f"http://{r['address']}:{r['port']}" for r in status["replicas"]]
    model = status["replicas"][0]["model"]
    return {"when": datetime.now(UTC).isoformat(timespec="seconds"),
            "router": status.get("router"), "replicas": direct, "tg": tg,
            "compare": compare(lab, a, model, direct, rounds, tg),
            "join_leave": join_and_leave(lab, a, model)}


def bench_gateway(s: Settings, res: Results, workdir: Path) -> None:
    """`make bench`'s gateway rows (issue 40's goals): s.runs rounds of the comparison, one
    join and leave."""
    lab = Lab(s.lab_id, 2, "b2b", workdir)
    s.log(f"gateway: lab up, up, two replicas, gateway up, {s.runs} round(s), a join and a leave")
    lab.up(0, s.model_bytes)
    try:
        doc = measure(lab, s.runs, 4)
    finally:
        lab.sparkctl("down", "--yes")
        lab.down()
    router = doc.get("router") or "the gateway"
    res.row(ADDED, unit="ms", note=f"{router}; median of each round's 30").runs.extend(
        float(r["added_ms"]) for r in doc["compare"]["runs"])
    res.row(RATIO, unit="x", note="tokens/s, 15 s each way").runs.extend(
        float(r["ratio"]) for r in doc["compare"]["runs"])
    load = doc["join_leave"]["load"]
    if "failed" not in load:
        res.notes.append(f"gateway: the bounded load reported no counts: {load}")
        return
    res.row(FAILED, unit="requests", note=f"{load['ok']} answered").runs.append(
        float(load["failed"]))
    res.row(RESTARTS, unit="restarts", note="router pid before and after").runs.append(
        float(doc["join_leave"]["router_restarted"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway_routers",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab-id", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tg", type=int, default=4, help="tokens per request")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    lab = Lab(args.lab_id, 2, "b2b", Path(tempfile.mkdtemp(prefix="sparkctl-bench-")))
    lab.up(0, 256 * 2**20)
    try:
        doc = measure(lab, args.rounds, args.tg)
    finally:
        lab.sparkctl("down", "--yes")
        lab.down()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    figures = doc["compare"]
    print(f"{doc['router']}: adds {figures['added_ms_median']:.1f} ms (c1 median), throughput "
          f"{figures['throughput_ratio_median'] * 100:.1f} % of direct (c8)")
    print(f"join+leave under load: {doc['join_leave']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
