"""Launch time per engine on one 2-node lab: what a user waits for from `launch` to an answering
server, TensorRT-LLM (mpirun in the `up` container), vLLM (a Ray cluster started in its own
containers first: Ray's start-up cost is the `ray` phase) and SGLang (one node).

Every run starts from no server and no engine container (`down`, then `up`), so each launch is
cold the way a first launch after `up` is; the model is already in the head's cache after the
first run (the download is the lab hub, not what is measured). A second launch of the same recipe
right after is the no-change figure. The lab engines load in --engine-load-seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.labctl import BenchError, Lab, Timed

if TYPE_CHECKING:
    from benchmarks.scenarios import Results, Settings

ENGINES = (
    ("trtllm", "qwen3-235b", "2 nodes, mpirun"),
    ("vllm", "minimax-m2.7", "2 nodes, Ray"),
    ("sglang", "qwen3.6-27b", "1 node"),
)


def phase_seconds(report: dict[str, Any], phase: str) -> float | None:
    """The wall time of one phase in a launch's JSON report: its longest node (phases run on
    every node at once), or None when the phase did not run."""
    per_node = [sum(float(step.get("seconds") or 0.0) for step in host.get("steps") or []
                    if step.get("phase") == phase)
                for host in (report.get("hosts") or {}).values()]
    per_node = [seconds for seconds in per_node if seconds > 0]
    return max(per_node) if per_node else None


def bench_engines(s: Settings, res: Results, workdir: Path) -> None:
    lab = Lab(s.lab_id, 2, "b2b", workdir)
    s.log("engines: lab up")
    lab.up(s.engine_load_seconds, s.model_bytes)
    token = workdir / "hf_token"  # the lab's hub takes any hf_* token
    token.write_text("hf_sparklab_benchmark\n")
    token.chmod(0o600)
    note = f"engine load {s.engine_load_seconds:g} s; from down+up"
    try:
        for run in range(s.runs):
            for engine, recipe, shape in ENGINES:
                s.log(f"engines run {run + 1}/{s.runs}: {engine} ({recipe})")
                _fresh(lab)
                argv = ("launch", recipe, "--yes", "--timeout", "300", "--hf-token-file", str(token))
                cold = lab.sparkctl(*argv)
                res.add(f"launch {engine} {recipe}, cold ({shape})", cold, note=note)
                if not cold.ok:
                    continue
                if engine == "vllm":
                    ray = phase_seconds(cold.report, "ray")
                    res.row(f"  of which Ray cluster start ({shape})",
                            note="ray phase: containers, ray start, every node alive").runs.append(ray)
                res.add(f"launch {engine} {recipe}, no change", lab.sparkctl(*argv))
        _fresh(lab)
    finally:
        lab.down()


def _fresh(lab: Lab) -> None:
    """No server and no engine container: `down`, then `up` (the `up` container only)."""
    for command in (("down", "--yes"), ("up", "--yes")):
        result: Timed = lab.sparkctl(*command)
        if not result.ok:
            raise BenchError(f"engines: `sparkctl {command[0]}` failed: {result.failure()}")
