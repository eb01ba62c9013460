"""The simulated `vllm serve` asks the REAL vLLM 0.31.0 whether it accepts the command line.

Where the real vLLM is installed (lab/sparklab/vllm_install.py, seen at /usr/lib/sparklab/vllm)
its own parser and EngineArgs checks (vllm_argcheck.py, run by its interpreter) judge the argv
before the simulator pretends to load; what they refuse, the simulator refuses with the real
message and exit code. Importing vLLM costs ~7 s of CPU, so each verdict is kept by a digest of
(vLLM version, argv with a node-specific model path replaced) in a directory the whole machine
shares (/var/lib/sparklab/cache/vllm-verdicts, seen in nodes at VERDICTS): each distinct argv costs
once per machine. Without the real vLLM (`make demo`), None: the option table alone checks.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass

from .vllm_real import model_of, python

VERDICTS = "/var/cache/sparklab-vllm-verdicts"
CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_argcheck.py")
MODEL_PLACEHOLDER = "/sparklab/model"


@dataclass(frozen=True)
class Verdict:
    code: int  # the exit code `vllm serve` would give (0: accepted)
    message: str  # what it would print, in its own words
    cached: bool = False


def normalized(argv: list[str]) -> list[str]:
    """argv with the model's node-specific path (a snapshot under one node's HF cache) replaced:
    the parser and EngineArgs never open it, and every node and lab then share one verdict."""
    model = model_of(argv[1:])
    if not model or not model.startswith(("/", "~", ".")):
        return list(argv)
    return [MODEL_PLACEHOLDER if token == model else
            f"--model={MODEL_PLACEHOLDER}" if token == f"--model={model}" else token
            for token in argv]


def digest(version: str, argv: list[str]) -> str:
    return hashlib.sha256(json.dumps([version, argv]).encode()).hexdigest()


def directory() -> str:
    return os.environ.get("SPARKLAB_VLLM_VERDICTS", VERDICTS)


def ask(argv: list[str], version: str) -> Verdict | None:
    """The real vLLM's verdict on `vllm ARGV` (argv[0] == "serve"), or None without it."""
    interpreter = python()
    if interpreter is None:
        return None
    checked = normalized(argv)
    path = os.path.join(directory(), digest(version, checked) + ".json")
    try:
        with open(path) as f:
            data = json.load(f)
        return Verdict(int(data["code"]), str(data["message"]), cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([interpreter, "-I", CHECKER, *checked], capture_output=True, text=True,
                          env=env, check=False)
    try:
        data = json.loads(done.stdout.strip().splitlines()[-1])
        verdict = Verdict(int(data["code"]), str(data["message"]))
    except (ValueError, IndexError, KeyError, TypeError):
        # the checker itself broke: say so, and let the option table judge (never cached)
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        print(f"sparklab: the real vLLM's argument check failed ({tail[0]}); the option table "
              "alone checks this command line", file=sys.stderr, flush=True)
        return None
    _store(path, data)
    return verdict


def _store(path: str, data: dict) -> None:
    """Atomically, so two nodes asking at once never read half a verdict."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w") as f:
            json.dump(data, f)
        os.replace(temporary, path)
    except OSError:
        pass  # a read-only view: the verdict still holds, it is only not kept
