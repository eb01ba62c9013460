"""`trtllm-llmapi-launch CMD...`: rank 0 runs CMD without the MPI environment, others serve it."""
from __future__ import annotations

import os
import secrets
import sys

from .common import SIMULATION_NOTE, NcclError, trt_log
from .rendezvous import run_worker

USAGE = f"""usage: trtllm-llmapi-launch COMMAND [ARGS...]

Runs COMMAND (e.g. trtllm-serve) on MPI rank 0 and an executor worker on every other rank.
{SIMULATION_NOTE}
"""
SCRUBBED_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "SLURM_", "UCX_")


def main(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not args else sys.stdout)
        return 2 if not args else 0
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    if rank != 0:
        try:
            return run_worker(rank)
        except NcclError as exc:
            print(f"RuntimeError: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCRUBBED_PREFIXES)}
    env["SPARKLAB_LAUNCH_WORLD_SIZE"] = str(size)
    env["TLLM_SPAWN_PROXY_PROCESS"] = "1"
    env["TLLM_SPAWN_PROXY_PROCESS_IPC_ADDR"] = "tcp://127.0.0.1:10012"
    # Never logged, like the real launcher's HMAC key.
    env["TLLM_SPAWN_PROXY_PROCESS_IPC_HMAC_KEY"] = secrets.token_hex(32)
    trt_log("I", f"trtllm-llmapi-launch: rank 0 of {size} runs: {args[0]}")
    try:
        os.execvpe(args[0], args, env)
    except OSError as exc:
        print(f"trtllm-llmapi-launch: {args[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0
