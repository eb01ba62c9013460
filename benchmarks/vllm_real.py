"""`sparkctl bench`, llama-benchy 0.4.0 and `vllm bench serve` measure the same REAL vLLM server.

    python -m benchmarks.vllm_real [--lab-id 24] [--recipe lab-tiny-llama-vllm]
                                   [--tg 64] [--pp 128] [--runs 2] [--rounds 3]

On a 2-node lab with room for the real vLLM (`--node-memory 5G --memory-scale 25`, docs/lab.md):
`up`, `launch` of a lab vLLM recipe (the real vLLM 0.31.0 CPU build serving the lab hub's
sparklab/tiny-llama), then one `sparkctl tunnel` that the three clients use in the same run,
taking turns (`--rounds`): `sparkctl bench -c 1`, llama-benchy at concurrency 1 (offline, the
repo's tokenizer.json: benchmarks/llamacpp_benchy.py says how), and vLLM's own `vllm bench serve`
(the lab's vLLM venv on this host: random dataset of pp-token prompts, tg tokens each with
--ignore-eos, one request at a time, the repo's tokenizer; offline). Single-request generation
rate: sparkctl's and llama-benchy's `tg_throughput`; vLLM's 1000 / mean TPOT (its time per output
token after the first), the same quantity. Passes when sparkctl agrees with each within 25 %;
writes benchmarks/results/vllm-real.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

from benchmarks.labctl import SPARKCTL, BenchError, Lab
from benchmarks.llamacpp_benchy import (
    AGREE,
    HUB,
    benchy,
    compare,
    llama_benchy,
    seeded_corpus,
    tg_values,
    tunnel,
)

MODEL = "sparklab/tiny-llama"
VLLM_PYTHON = Path("/var/lib/sparklab/cache/vllm/0.31.0/root/usr/lib/sparklab/vllm/bin/python")
OUT = Path(__file__).resolve().parent / "results" / "vllm-real.json"


@dataclass(frozen=True)
class Client:
    """How to reach a lab's servers from here: its inventory and sparkctl's environment."""

    inventory: Path
    env: dict[str, str]


def sparkctl_bench(client: Client, server: str, tg: int, pp: int, runs: int) -> dict[str, Any]:
    done = subprocess.run([SPARKCTL, "bench", "--inventory", str(client.inventory), "--server",
                           server, "--tg", str(tg), "--pp", str(pp), "--depth", "0", "-c", "1",
                           "--runs", str(runs), "--json"], env=client.env, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise BenchError(f"sparkctl bench exited {done.returncode}: {done.stderr[-400:]}")
    return dict(json.loads(done.stdout))


def vllm_bench(port: int, workdir: Path, tg: int, pp: int, runs: int, turn: int) -> dict[str, Any]:
    """`vllm bench serve` of the lab's own vLLM, offline, one request at a time."""
    name = f"vllm-bench-{turn}.json"
    argv = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.cli.main", "bench", "serve",
            "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
            "--base-url", f"http://127.0.0.1:{port}", "--model", MODEL,
            "--tokenizer", str(HUB / MODEL), "--dataset-name", "random",
            "--random-input-len", str(pp), "--random-output-len", str(tg),
            "--num-prompts", str(runs), "--max-concurrency", "1", "--ignore-eos", "--seed",
            str(20261128 + turn), "--save-result", "--result-dir", str(workdir),
            "--result-filename", name]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env, cwd=workdir)
    saved = workdir / name
    if done.returncode != 0 or not saved.exists():
        raise BenchError(f"vllm bench serve exited {done.returncode}: "
                         f"{(done.stdout + done.stderr)[-800:]}")
    return dict(json.loads(saved.read_text()))


def bench_against_benchy(client: Client, server: str, workdir: Path, tg: int, pp: int,
                         runs: int, rounds: int, with_vllm: bool = False,
                         log: Callable[[str], None] = print) -> dict[str, Any]:
    """The clients take turns through one tunnel to the running server (a change in the
    machine's load, 2 shared cores, falls on all alike); compare()'s document, plus vLLM's own
    figure with `with_vllm`."""
    exe, corpus = benchy(), seeded_corpus()
    proc, port = tunnel(client, server)
    ours: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    vllms: list[dict[str, Any]] = []
    try:
        for turn in range(rounds):
            log(f"round {turn + 1}/{rounds} through 127.0.0.1:{port}")
            ours.append(sparkctl_bench(client, server, tg, pp, runs))
            theirs.append(llama_benchy(exe, workdir / f"benchy-{turn}.json", port, tg, pp, runs,
                                       model=MODEL))
            if with_vllm:
                vllms.append(vllm_bench(port, workdir, tg, pp, runs, turn))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    doc = compare(ours, theirs, corpus, tg, pp, runs)
    if with_vllm:
        rates = [1000.0 / float(v["mean_tpot_ms"]) for v in vllms if v.get("mean_tpot_ms")]
        if not rates:
            raise BenchError("vllm bench serve reported no mean TPOT")
        ratio = mean(tg_values(ours)) / mean(rates)
        doc.update({"vllm_bench_tg_tps": round(mean(rates), 1),
                    "vllm_bench_tg_values": [round(r, 1) for r in rates],
                    "ratio_vllm": round(ratio, 3), "ok_vllm": abs(ratio - 1) <= AGREE,
                    "vllm_bench_result": vllms})
        doc["ok"] = bool(doc["ok"] and doc["ok_vllm"])
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lab-id", type=int, default=24)
    ap.add_argument("--recipe", default="lab-tiny-llama-vllm")
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--pp", type=int, default=128)
    ap.add_argument("--runs", type=int, default=2, help="runs per client and round")
    ap.add_argument("--rounds", type=int, default=3, help="turns each client takes")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    lab = Lab(args.lab_id)
    try:
        lab.up(engine_load_seconds=1, model_bytes=1 << 20,
               extra=("--node-memory", "5G", "--memory-scale", "25"))
        for step in (("up", "--yes"), ("launch", args.recipe, "--yes", "--timeout", "400")):
            timed = lab.sparkctl(*step)
            if not timed.ok:
                raise BenchError(f"sparkctl {step[0]}: {timed.failure()}")
        doc = bench_against_benchy(Client(lab.inventory, lab.env), args.recipe, lab.workdir,
                                   args.tg, args.pp, args.runs, args.rounds, with_vllm=True)
    except BenchError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    finally:
        lab.down()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"| client | c1 generation (tg{args.tg}, pp{args.pp}), mean | values |\n"
          "| --- | --- | --- |\n"
          f"| sparkctl bench | {doc['sparkctl_tg_tps']} t/s | {doc['sparkctl_tg_values']} |\n"
          f"| llama-benchy | {doc['llama_benchy_tg_tps']} t/s | {doc['llama_benchy_tg_values']} |\n"
          f"| vllm bench serve (1000/TPOT) | {doc['vllm_bench_tg_tps']} t/s | "
          f"{doc['vllm_bench_tg_values']} |\n"
          f"sparkctl/llama-benchy {doc['ratio']}, sparkctl/vllm {doc['ratio_vllm']} "
          f"({'agree' if doc['ok'] else 'DISAGREE'} within {AGREE:.0%}); {args.out}")
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
