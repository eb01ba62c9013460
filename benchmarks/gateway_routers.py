"""LiteLLM against the SGLang Model Gateway, side by side, in front of the same real replicas.

    python -m benchmarks.gateway_routers --lab-id ID [--rounds N] [--tg T] [--out FILE]

Issue 40, item 2: which router meets the gateway's goals (adds < 5 ms median at concurrency 1
against the same replicas directly; throughput at concurrency 8 within 5 %; a replica joins and
leaves with no restart and no failed request under a bounded load). A two-node lab, two
replicas of the real llama-server (`lab-tiny-llama`, one per node), `sparkctl gateway up`
(LiteLLM 1.80.11, as shipped), and beside it on the same node the SGLang Model Gateway (PyPI
`sglang-router` ROUTER_VERSION, its Rust router, `--policy power_of_two`: the less busy of two)
with the same replicas' addresses as workers. Both are measured by the gateway node's own
`bench --gateway` script (orchestrator/node/gateway_bench.py: direct and through, interleaved),
in alternating rounds. Then both take a bounded load (2 at a time) while a third replica joins
(`launch --name r-c`: sparkctl restarts LiteLLM; the router gets `POST /workers`) and one
leaves (the router: `DELETE /workers/ID` first; then `sparkctl down --server r-b`, which
drains LiteLLM's relay); the failed requests of each are counted. Results go to
benchmarks/results/gateway-routers.json.
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

ROOT = Path(__file__).resolve().parents[1]
ROUTER_VERSION = "0.3.2"
ROUTER_DIR = Path(f"/var/lib/sparklab/cache/sglang-router/{ROUTER_VERSION}")
"""pip --target, on the host (run in the head node's network namespace)."""
ROUTER_PORT = 4100
LITELLM_PORT = 4000
RECIPE = "lab-tiny-llama"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gateway-routers.json"
BENCH_SCRIPT = ROOT / "orchestrator" / "node" / "gateway_bench.py"
"""Both scripts run from the host in the head node's network namespace (in_node_netns)."""
LOAD_SCRIPT = Path(__file__).with_name("bounded_load.py")


def install_router() -> None:
    if (ROUTER_DIR / "sglang_router").is_dir():
        return
    ROUTER_DIR.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(ROUTER_DIR),
                    f"sglang-router=={ROUTER_VERSION}"], check=True)


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


def start_router(lab: Lab, head: str, workers: list[str]) -> subprocess.Popen[bytes]:
    """The router in the head node's network namespace (its loopback, its fabric routes), run
    from the host's file system where the pip tree is (the nodes see only the lab's own
    trees); stopped by its pid at the end."""
    argv = ["ip", "netns", "exec", f"sparklab{lab.lab_id}-{head}", sys.executable, "-m",
            "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(ROUTER_PORT),
            "--policy", "power_of_two", "--log-level", "warn", "--worker-urls", *workers]
    log = (lab.workdir / "router.log").open("wb")
    router = subprocess.Popen(argv, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROUTER_DIR)},
                              stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    for _ in range(120):
        answer = lab.exec(head, f"curl -s http://127.0.0.1:{ROUTER_PORT}/workers", check=False)
        try:
            listed = json.loads(answer).get("workers") or []
        except ValueError:
            listed = []
        if len(listed) == len(workers) and all(w.get("is_healthy") for w in listed):
            return router
        time.sleep(1)
    router.terminate()
    tail = (lab.workdir / "router.log").read_text(errors="replace")[-800:]
    raise BenchError(f"the router did not list its workers healthy: {tail}")


def router_call(lab: Lab, head: str, method: str, path: str, body: dict[str, Any] | None = None
                ) -> dict[str, Any]:
    data = f"-H 'Content-Type: application/json' -d '{json.dumps(body)}'" if body else ""
    answer = lab.exec(head, f"curl -s -X {method} {data} http://127.0.0.1:{ROUTER_PORT}{path}")
    return dict(json.loads(answer)) if answer.strip() else {}


def compare(lab: Lab, head: str, model: str, direct: list[str], rounds: int, tg: int
            ) -> dict[str, Any]:
    # both on the node's loopback without a key (the benchmark's clients run there)
    gateways = {"litellm": (f"http://127.0.0.1:{LITELLM_PORT}", "/nonexistent"),
                "sglang-router": (f"http://127.0.0.1:{ROUTER_PORT}", "/nonexistent")}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in gateways}
    for index in range(rounds):
        order = list(gateways) if index % 2 == 0 else list(reversed(gateways))
        for name in order:
            url, config = gateways[name]
            runs[name].append(node_python(lab, head, BENCH_SCRIPT, {
                "gateway": url, "config": config, "model": model, "requests": 30, "seconds": 15,
                "concurrency": 8, "max_tokens": tg, "direct": direct}))
    return {name: {"added_ms_median": statistics.median(r["added_ms"] for r in docs),
                   "throughput_ratio_median": statistics.median(r["ratio"] for r in docs),
                   "runs": docs} for name, docs in runs.items()}


def join_and_leave(lab: Lab, head: str, model: str) -> dict[str, Any]:
    """A bounded load through each gateway while r-c joins and r-b leaves."""
    stop = lab.workdir / "load-stop"
    loads = {}
    for name, url in (("litellm", f"http://127.0.0.1:{LITELLM_PORT}"),
                      ("sglang-router", f"http://127.0.0.1:{ROUTER_PORT}")):
        args = {"url": url, "model": model, "key_file": None, "concurrency": 2,
                "max_tokens": 4, "stop_file": str(stop), "seconds": 900}
        loads[name] = subprocess.Popen(
            [*in_node_netns(lab, head), str(LOAD_SCRIPT), json.dumps(args)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    events: list[str] = []
    try:
        time.sleep(5)
        ok(lab.sparkctl("launch", RECIPE, "--nodes", lab.node_names()[1], "--name", "r-c",
                        "--port", "8081", "--yes", "--timeout", "300"), "launch r-c")
        events.append("r-c launched; LiteLLM restarted by the gateway follow")
        relay = next(r for r in gateway_status(lab)["replicas"] if r["server"] == "r-c")
        added = router_call(lab, head, "POST", "/workers",
                            {"url": f"http://{relay['address']}:{relay['port']}"})
        events.append(f"router POST /workers: {added.get('status')}")
        time.sleep(10)
        leaving = next(r for r in gateway_status(lab)["replicas"] if r["server"] == "r-b")
        url = f"http://{leaving['address']}:{leaving['port']}"
        workers = router_call(lab, head, "GET", "/workers")["workers"]
        gone = next(w for w in workers if w["url"] == url)
        removed = router_call(lab, head, "DELETE", f"/workers/{gone['id']}")
        events.append(f"router DELETE /workers/ID (r-b): {removed.get('status')}")
        time.sleep(3)
        ok(lab.sparkctl("down", "--server", "r-b", "--yes"), "down --server r-b")
        events.append("r-b down (LiteLLM: its relay drained first)")
        time.sleep(10)
    finally:
        stop.touch()
    results = {}
    for name, proc in loads.items():
        out, err = proc.communicate(timeout=300)
        try:
            results[name] = json.loads(out)
        except ValueError:
            results[name] = {"error": err[-400:]}
    return {"events": events, "loads": results}


def gateway_status(lab: Lab) -> dict[str, Any]:
    proc = subprocess.run([SPARKCTL, "gateway", "status", "--inventory", str(lab.inventory),
                           "--json"], env=lab.env, capture_output=True, text=True, check=False)
    return dict(json.loads(proc.stdout))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway_routers",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab-id", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tg", type=int, default=4, help="tokens per request")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    install_router()
    lab = Lab(args.lab_id, 2, "b2b", Path(tempfile.mkdtemp(prefix="sparkctl-bench-")))
    lab.up(0, 256 * 2**20)
    router: subprocess.Popen[bytes] | None = None
    try:
        a, b = lab.node_names()
        ok(lab.sparkctl("up", "--yes"), "up")
        for node, name in ((a, "r-a"), (b, "r-b")):
            ok(lab.sparkctl("launch", RECIPE, "--nodes", node, "--name", name, "--yes",
                            "--timeout", "300"), f"launch {name}")
        ok(lab.sparkctl("gateway", "up", "--port", str(LITELLM_PORT)), "gateway up")
        status = gateway_status(lab)
        direct = [f"http://{r['address']}:{r['port']}" for r in status["replicas"]]
        model = status["replicas"][0]["model"]
        router = start_router(lab, a, direct)
        doc = {"when": datetime.now(UTC).isoformat(timespec="seconds"),
               "router": f"sglang-router {ROUTER_VERSION}", "litellm": status.get("litellm"),
               "replicas": direct, "tg": args.tg,
               "compare": compare(lab, a, model, direct, args.rounds, args.tg),
               "join_leave": join_and_leave(lab, a, model)}
    finally:
        if router is not None:
            router.terminate()
            router.wait(30)
        lab.sparkctl("down", "--yes")
        lab.down()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for name, figures in doc["compare"].items():
        print(f"{name:<14} adds {figures['added_ms_median']:.1f} ms (c1 median), throughput "
              f"{figures['throughput_ratio_median'] * 100:.1f} % of direct (c8)")
    for name, load in doc["join_leave"]["loads"].items():
        print(f"{name:<14} join+leave under load: {load}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
