"""`trtllm-serve [serve] MODEL [OPTIONS]`: click-like parsing, then startup like the real server."""
from __future__ import annotations

import os
import signal
import sys

from .common import (
    SIMULATION_NOTE,
    ModelMissing,
    NcclError,
    fault,
    lab_config,
    option_table,
    resolve_model,
    trt_log,
)
from .llm_args import ValidationError, draft_model, validate

USAGE = "Usage: trtllm-serve serve [OPTIONS] MODEL"
# What the rest of the simulator reads, by canonical flag (aliases like --tp_size resolve to these).
KEYS = {"--tensor_parallel_size": "tp_size", "--pipeline_parallel_size": "pp_size",
        "--config": "extra_llm_api_options"}


def help_text(table) -> str:  # type: ignore[no-untyped-def]
    names = [", ".join([flag, *spec.get("aliases", [])]) for flag, spec in sorted(table.flags.items())]
    return (f"{USAGE}\n\n  Running an OpenAI API compatible server\n\n"
            f"  MODEL: model name | HF checkpoint path | TensorRT engine path\n\n  {SIMULATION_NOTE}\n\n"
            f"  Options are TensorRT-LLM {table.version}'s (sparkctl's option table).\n\nOptions:\n"
            + "\n".join(f"  {n}" for n in names) + "\n  --help")


class UsageError(Exception):
    pass


def _click_message(problem) -> str:  # type: ignore[no-untyped-def]
    """click's wording for what the option table found wrong."""
    if problem.message == "unknown option":
        hint = f" Did you mean {problem.suggestion}?" if problem.suggestion else ""
        return f"No such option: {problem.key}{hint}"
    if problem.message == "needs a value":
        return f"Option '{problem.key}' requires an argument."
    if problem.message == "takes no value":
        return f"Option '{problem.key}' does not take a value."
    message = problem.message.replace("is not an integer", "is not a valid integer").replace(
        "is not a number", "is not a valid float")  # click's words for int and float
    return f"Invalid value for '{problem.key}': {message}."


def parse(args: list[str]) -> dict:
    """trtllm-serve's click parser over TensorRT-LLM's option table: unknown flags, missing
    values, bad choices and numbers fail exactly as the real command would (exit 2)."""
    if args[:1] == ["serve"]:
        args = args[1:]
    if "--help" in args:
        print(help_text(option_table("trtllm")))
        raise SystemExit(0)
    table = option_table("trtllm")
    problems = table.check_flags(args)
    if problems:
        raise UsageError(_click_message(problems[0]))
    opts: dict = {"host": "localhost", "port": 8000, "backend": "pytorch", "tp_size": 1,
                  "pp_size": 1, "model": None}
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if not a.startswith("-"):
            if opts["model"] is not None:
                raise UsageError(f"Got unexpected extra argument ({a})")
            opts["model"] = a
            continue
        name, eq, val = a.partition("=")
        canonical = table.canonical(name) or name
        spec = table.flags.get(canonical, {})
        key = KEYS.get(canonical, canonical[2:])
        if spec.get("kind") in ("store_true", "bool_optional"):
            opts[key] = not name.startswith("--no-")
            continue
        if not eq:
            val, i = args[i], i + 1
        opts[key] = {"int": int, "float": float}.get(spec.get("kind"), str)(val)
    if opts["model"] is None:
        raise UsageError("Missing argument 'MODEL'.")
    return opts


def load_options(path: str | None) -> dict:
    if not path:
        return {}
    import yaml

    with open(path) as f:
        data = yaml.safe_load(f)
    return validate(data)


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(args: list[str]) -> int:
    try:
        opts = parse(args)
    except UsageError as exc:
        print(f"{USAGE}\nTry 'trtllm-serve serve --help' for help.\n\nError: {exc}",
              file=sys.stderr)
        return 2
    except SystemExit as exc:
        return int(exc.code or 0)
    signal.signal(signal.SIGTERM, _interrupt)
    trt_log("I", f"Starting TensorRT-LLM serve (sparklab simulation) for {opts['model']}")
    server = leader = None
    try:
        options = load_options(opts.get("extra_llm_api_options"))
        world = int(os.environ.get("SPARKLAB_LAUNCH_WORLD_SIZE", "1"))
        tp = int(options.get("tensor_parallel_size", opts["tp_size"]))
        pp = int(options.get("pipeline_parallel_size", opts["pp_size"]))
        if world > 1 and tp * pp != world:
            raise ValueError(f"n_workers must be equal to the number of processes in MPI "
                             f"(tp_size {tp} x pp_size {pp} = {tp * pp}, MPI world size "
                             f"{world})")
        if world == 1 and tp * pp > 1:
            raise RuntimeError(f"CUDA error: invalid device ordinal (sparklab: tp_size {tp} "
                               "needs that many GPUs; a Spark has one. Run it under mpirun with "
                               "trtllm-llmapi-launch, one rank per node)")
        spec = options.get("speculative_config")
        refs = [("model", opts["model"])]
        if draft_model(spec):
            refs.append(("draft model", draft_model(spec) or ""))
        for what, ref in refs:
            resolve_model(ref, what)
        from .server import EngineState, start_http

        state = EngineState(opts, options)
        server = start_http(state, opts["host"], int(opts["port"]))
        if world > 1:
            from .rendezvous import Leader

            leader = Leader(world)
            state.leader = leader
            leader.gather()
            leader.check_models([list(r) for r in refs])
        seconds = float(lab_config()["engine_load_seconds"])
        trt_log("I", f"Loading weights of {opts['model']} (sparklab: {seconds:g} s)")
        if leader:
            import threading

            loader = threading.Thread(target=leader.load, daemon=True)
            loader.start()
        import time

        from .memory import Loader

        memory = Loader()
        start = time.monotonic()
        end = start + seconds
        while time.monotonic() < end or fault("engine-hang"):
            memory.step((time.monotonic() - start) / max(seconds, 0.1))
            time.sleep(0.1)
        memory.finish()
        if leader:
            loader.join()
            if leader.dead:
                raise RuntimeError(leader.dead)
            leader.watch()
        state.ready = True
        print("INFO:     Application startup complete.", file=sys.stderr, flush=True)
        print(f"INFO:     Uvicorn running on http://{opts['host']}:{opts['port']} "
              "(Press CTRL+C to quit)", file=sys.stderr, flush=True)
        while True:
            signal.pause()
    except KeyboardInterrupt:
        print("INFO:     Shutting down\nINFO:     Application shutdown complete.",
              file=sys.stderr, flush=True)
        return 0
    except (ValidationError, ValueError, RuntimeError, ModelMissing, NcclError, OSError) as exc:
        kind = {ModelMissing: "", ValidationError: "pydantic_core._pydantic_core."
                "ValidationError: "}.get(type(exc), f"{type(exc).__name__}: ")
        if isinstance(exc, NcclError):
            kind = "RuntimeError: "
        trt_log("E", "Failed to start the server")
        print(f"{kind}{exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if leader:
            leader.shutdown()
        if server:
            server.shutdown_quietly()
    return 0
