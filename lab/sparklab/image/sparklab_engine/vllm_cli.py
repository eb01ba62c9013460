"""Simulated `vllm serve` (sparklab: no GPU, no real model) over the REAL Ray cluster.

The command line is checked against vLLM's real option table (the one sparkctl validates recipes
with, extracted from the pinned vLLM source): unknown flags and bad values exit 2 the way vLLM's
argparse does. With `--distributed-executor-backend ray` (or tp*pp > 1) it joins the running Ray
cluster (`ray.init(address="auto")`), fails like vLLM when there is none or when it has fewer GPUs
than tp*pp, reserves one GPU per rank in a placement group and puts one actor per rank on the
nodes Ray picks; every rank checks the model on its own node. Then it serves the OpenAI API
(/health, /v1/models, /v1/completions, /v1/chat/completions, /version); each request takes one
step through every rank, so a dead rank turns /health to 503 and requests to 500.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

from .common import (
    ModelMissing,
    UsageError,
    fault,
    hostname,
    image_version,
    lab_config,
    option_table,
    resolve_model,
    usage_errors,
)

VERSION = image_version("0.31.0")  # the image's vLLM (catalog.json); the flags stay 0.31.0's table
USAGE = "usage: vllm serve [model_tag] [options]"


def log(level: str, where: str, message: str) -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"(APIServer pid={os.getpid()}) {level} {stamp} [{where}] {message}", file=sys.stderr,
          flush=True)


def parse(args: list[str], table) -> dict:  # type: ignore[no-untyped-def]
    usage_errors(table.check_flags(args))
    opts: dict = {"model": None, "tp": 1, "pp": 1, "backend": None, "host": None, "port": 8000,
                  "served": None, "util": 0.92, "nnodes": 1, "rank": 0, "master": "127.0.0.1",
                  "mport": 29501, "headless": False}
    names = {"--tensor-parallel-size": "tp", "-tp": "tp", "--pipeline-parallel-size": "pp",
             "-pp": "pp", "--distributed-executor-backend": "backend", "--host": "host",
             "--port": "port", "--served-model-name": "served", "--model": "model",
             "--gpu-memory-utilization": "util", "--nnodes": "nnodes", "--node-rank": "rank",
             "--master-addr": "master", "--master-port": "mport", "--api-key": "api_key"}
    i = 0
    while i < len(args):
        token = args[i]
        flag, eq, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        flag = table.canonical(flag) or flag  # -tp, --max_model_len, unique abbreviations
        if flag == "--headless":
            opts["headless"], i = True, i + 1
            continue
        if flag in names:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            opts[names[flag]] = value
            i += 1 if eq else 2
            continue
        if not token.startswith("-") and opts["model"] is None:
            opts["model"] = token
        i += 1
    opts["model"] = opts["model"] or "Qwen/Qwen3-0.6B"
    for key in ("tp", "pp", "port", "nnodes", "rank", "mport"):
        opts[key] = int(opts[key])
    opts["util"] = float(opts["util"])
    if not 0 < opts["util"] <= 1:
        raise UsageError(f"argument --gpu-memory-utilization: {opts['util']} must be in (0, 1]")
    return opts


def ask_real_vllm(argv: list[str]) -> int | None:
    """The real vLLM 0.31.0's parser and EngineArgs judge the command line first (vllm_verdict.py):
    its exit code when it refuses (its message on stderr, as `vllm serve` prints it), else None."""
    from .vllm_verdict import ask

    verdict = ask(argv, option_table("vllm").version)
    if verdict is None:
        log("INFO", "sparklab", "the real vLLM is not installed here: the option table alone "
            "checks the command line (docs/lab.md)")
        return None
    if verdict.code:
        print(verdict.message, file=sys.stderr, flush=True)
        return verdict.code
    log("INFO", "sparklab", "vLLM 0.31.0's own parser and EngineArgs accept the command line"
        f"{' (verdict cached)' if verdict.cached else ''}")
    return None


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    from .vllm_real import exec_if_real

    exec_if_real(argv)  # a real model: the real vLLM 0.31.0 serves it (docs/lab.md)
    if argv[:1] in (["--version"], ["-v"]):
        print(VERSION)
        return 0
    if argv[:1] != ["serve"]:
        print(f"usage: vllm [-h] [-v] {{chat,complete,serve,bench,collect-env,run-batch}} ...\n"
              f"vllm: error: argument subparser: invalid choice: {(argv or [''])[0]!r} "
              "(sparklab simulates `vllm serve` only)", file=sys.stderr)
        return 2
    refused = ask_real_vllm(argv)
    if refused is not None:
        return refused
    try:
        opts = parse(argv[1:], option_table("vllm"))
    except UsageError as exc:
        print(f"{USAGE}\nvllm serve: error: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    log("INFO", "api_server.py", f"vLLM API server version {VERSION} (sparklab simulation)")
    log("INFO", "utils.py", f"non-default args: {json.dumps({k: v for k, v in opts.items() if v})}")
    server = None
    executor = None
    try:
        world = opts["tp"] * opts["pp"]
        backend = opts["backend"] or ("ray" if world > 1 and _ray_running() else "mp")
        if backend not in ("ray", "mp", "uni"):
            raise ValueError(f"sparklab simulates the ray, mp and uni executors, not {backend}")
        resolve_model(opts["model"])
        if backend == "mp" and opts["nnodes"] > 1:
            executor = multinode(opts, world)
            if executor is None:  # a headless rank: no API server, its share of the model
                from .vllm_mp import run_headless

                return run_headless(opts["rank"], opts["master"], opts["mport"])
        elif backend == "ray":
            from .vllm_ray import RayExecutor

            executor = RayExecutor(opts["model"], world)
            executor.start()
            signal.signal(signal.SIGTERM, _interrupt)  # Ray's own handler replaced ours
        elif world > 1:
            raise ValueError(
                f"World size ({world}) is larger than the number of available GPUs (1) in this "
                "node. If this is intentional and you are using:\n- ray, set "
                "'--distributed-executor-backend ray'.\n- multiprocessing, set '--nnodes' and "
                "'--node-rank'.")
        seconds = float(lab_config()["engine_load_seconds"])
        log("INFO", "gpu_model_runner.py", f"Loading weights of {opts['model']} (sparklab: "
            f"{seconds:g} s)")
        end = time.monotonic() + seconds
        while time.monotonic() < end or fault("engine-hang"):
            time.sleep(0.1)
        if executor:
            executor.load()
        from .vllm_http import start_vllm_http

        host = opts["host"] or "0.0.0.0"
        names = opts["served"] or opts["model"]
        # vLLM: `args.api_key or [envs.VLLM_API_KEY]` (entrypoints/openai/api_server.py)
        key = opts.get("api_key") or os.environ.get("VLLM_API_KEY") or None
        server = start_vllm_http(opts["model"], names, executor, host, opts["port"], key)
        log("INFO", "launcher.py", f"Route: /health, /v1/models, /v1/chat/completions, "
            f"/v1/completions ({hostname()})")
        print("INFO:     Application startup complete.", file=sys.stderr, flush=True)
        print(f"INFO:     Uvicorn running on http://{host}:{opts['port']} (Press CTRL+C to quit)",
              file=sys.stderr, flush=True)
        while True:
            signal.pause()
    except KeyboardInterrupt:
        print("INFO:     Shutting down\nINFO:     Application shutdown complete.",
              file=sys.stderr, flush=True)
        return 0
    except (ValueError, RuntimeError, ModelMissing, OSError, ConnectionError) as exc:
        log("ERROR", "core.py", "EngineCore failed to start.")
        kind = "" if isinstance(exc, ModelMissing) else f"{type(exc).__name__}: "
        print(f"{kind}{exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if server:
            server.shutdown_quietly()
        if executor:
            executor.shutdown()
    return 0


def multinode(opts: dict, world: int):  # type: ignore[no-untyped-def]
    """vLLM's native multi-node: rank 0 gets the executor that drives the others (over the
    fabric, from --master-addr:--master-port); the other ranks must run --headless."""
    nnodes, rank = opts["nnodes"], opts["rank"]
    if world % nnodes or world // nnodes > 1:
        raise ValueError(f"World size ({world}) is larger than the number of available GPUs (1) "
                         f"in this node (sparklab: --nnodes {nnodes} gives each node "
                         f"{world / nnodes:g} rank(s); a Spark has one GPU)")
    if not 0 <= rank < nnodes:
        raise ValueError(f"--node-rank {rank} must be in [0, {nnodes})")
    log("INFO", "multiproc_executor.py", f"multi-node: node rank {rank} of {nnodes}, master "
        f"{opts['master']}:{opts['mport']}{' (headless)' if opts['headless'] else ''}")
    if opts["headless"] and rank > 0:
        return None
    if rank > 0:
        raise ValueError(f"node rank {rank} serves no API: start the ranks > 0 with --headless")
    from .vllm_mp import MpExecutor

    executor = MpExecutor(opts["model"], nnodes, opts["master"], opts["mport"])
    executor.start()
    return executor


def _ray_running() -> bool:
    return os.path.exists("/tmp/ray/ray_current_cluster") or bool(os.environ.get("RAY_ADDRESS"))


if __name__ == "__main__":
    threading.current_thread().name = "MainThread"
    sys.exit(main(sys.argv[1:]))
