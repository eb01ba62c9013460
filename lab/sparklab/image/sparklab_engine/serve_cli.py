"""`trtllm-serve [serve] MODEL [OPTIONS]`: click-like parsing, then startup like the real server."""
from __future__ import annotations

import os
import signal
import sys

from .common import SIMULATION_NOTE, ModelMissing, NcclError, fault, lab_config, resolve_model, trt_log
from .llm_args import ValidationError, draft_model, validate

OPTIONS: dict[str, type | tuple] = {
    "--tokenizer": str, "--host": str, "--port": int,
    "--backend": ("pytorch", "tensorrt", "_autodeploy", "trt"),
    "--log_level": ("internal_error", "error", "warning", "info", "verbose", "debug", "trace"),
    "--max_beam_width": int, "--max_batch_size": int, "--max_num_tokens": int,
    "--max_seq_len": int, "--tp_size": int, "--pp_size": int, "--ep_size": int,
    "--cluster_size": int, "--gpus_per_node": int, "--kv_cache_free_gpu_memory_fraction": float,
    "--num_postprocess_workers": int, "--extra_llm_api_options": str, "--config": str,
    "--reasoning_parser": str, "--tool_parser": str, "--metadata_server_config_file": str,
    "--server_role": str, "--otlp_traces_endpoint": str, "--disagg_cluster_uri": str,
    "--media_io_kwargs": str, "--chat_template": str, "--moe_expert_parallel_size": int,
    "--moe_cluster_parallel_size": int, "--revision": str,
}
FLAGS = {"--trust_remote_code", "--enable_chunked_prefill",
         "--fail_fast_on_attention_window_too_large", "--disable_log_stats"}
USAGE = "Usage: trtllm-serve serve [OPTIONS] MODEL"
HELP = f"""{USAGE}

  Running an OpenAI API compatible server

  MODEL: model name | HF checkpoint path | TensorRT engine path

  {SIMULATION_NOTE}

Options:
""" + "\n".join(f"  {o}" for o in [*OPTIONS, *sorted(FLAGS)]) + "\n  --help"


class UsageError(Exception):
    pass


def parse(args: list[str]) -> dict:
    if args[:1] == ["serve"]:
        args = args[1:]
    opts: dict = {"host": "localhost", "port": 8000, "backend": "pytorch", "tp_size": 1,
                  "pp_size": 1, "model": None}
    i = 0
    while i < len(args):
        a = args[i]
        name, eq, val = a.partition("=")
        if a == "--help":
            print(HELP)
            raise SystemExit(0)
        if name in OPTIONS:
            if not eq:
                i += 1
                if i >= len(args):
                    raise UsageError(f"Option '{name}' requires an argument.")
                val = args[i]
            kind = OPTIONS[name]
            if isinstance(kind, tuple):
                if val not in kind:
                    raise UsageError(f"Invalid value for '{name}': '{val}' is not one of "
                                     + ", ".join(f"'{k}'" for k in kind) + ".")
            elif kind is not str:
                try:
                    val = kind(val)
                except ValueError:
                    noun = "integer" if kind is int else "float"
                    raise UsageError(f"Invalid value for '{name}': '{val}' is not a valid "
                                     f"{noun}.") from None
            key = "extra_llm_api_options" if name == "--config" else name[2:]
            opts[key] = val
        elif a in FLAGS:
            opts[a[2:]] = True
        elif a.startswith("-"):
            raise UsageError(f"No such option: {name}")
        elif opts["model"] is None:
            opts["model"] = a
        else:
            raise UsageError(f"Got unexpected extra argument ({a})")
        i += 1
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
