"""`sparkctl bench` and llama-benchy 0.4.0 measure the same REAL llama.cpp server, side by side.

    python -m benchmarks.llamacpp_benchy [--lab-id 24] [--recipe lab-tiny-llama-rpc]
                                         [--tg 128] [--pp 256] [--runs 2] [--rounds 4]

On a 2-node lab: `up`, `launch` of a lab llama.cpp recipe (the real llama-server, and over RPC
the real rpc-server, serving the lab hub's real GGUF), then one `sparkctl tunnel` (a local port
forwarded to the server's node over SSH) that both clients use in the same run, taking turns
(`--rounds`): `sparkctl bench -c 1`, then llama-benchy at concurrency 1 with the same pp/tg.

llama-benchy runs offline: installed from PyPI once into its own venv
(/var/lib/sparklab/cache/llama-benchy-0.4.0); its tokenizer is the repo's tokenizer.json (built
from the GGUF's own vocabulary, it tokenizes exactly as llama-server's /tokenize does); its
corpus is a seeded text written where it looks for a downloaded book
(~/.cache/llama-benchy/<md5 of --book-url>.txt); `--skip-coherence` (random weights write
nonsense). Prints both generation rates (c1, t/s: the mean of every run's `tg_throughput`, the
same definition in both), their ratio, and passes when they agree within 25 %; writes the JSON
to benchmarks/results/llamacpp-benchy.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from sparklab import llamacpp_install

from benchmarks.labctl import SPARKCTL, BenchError, Lab

BENCHY = "0.4.0"
BENCHY_VENV = Path(f"/var/lib/sparklab/cache/llama-benchy-{BENCHY}")
BOOK_URL = "sparklab://seeded-corpus/20261125"
"""Never fetched: the corpus is already where llama-benchy caches a downloaded book."""
HUB = llamacpp_install.ROOT / "usr" / "lib" / "sparklab" / "hub"
MODEL = "sparklab/tiny-llama-gguf"
AGREE = 0.25
OUT = Path(__file__).resolve().parent / "results" / "llamacpp-benchy.json"
WORDS = ("the of and to in is was he that it for on with as his at by had from her be this "
         "which or an were are but not have one all their there been has when who more will "
         "would if no out so said what up its about into than them can only other new some "
         "time could these two may then first any like now my such make over our even most "
         "me state after also made many did must before back see through way where get much "
         "go well your know should down work year because come people just say each those "
         "take day good how long little own man here world house night water place hand")


def benchy() -> Path:
    """llama-benchy's command, installed from PyPI once (its own venv, never the project's)."""
    exe = BENCHY_VENV / "bin" / "llama-benchy"
    if not exe.exists():
        for argv in ([sys.executable, "-m", "venv", str(BENCHY_VENV)],
                     [str(BENCHY_VENV / "bin" / "pip"), "install", "-q", f"llama-benchy=={BENCHY}"]):
            result = subprocess.run(argv, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                raise BenchError(f"installing llama-benchy {BENCHY}: {result.stderr.strip()[-400:]}")
    return exe


def seeded_corpus(seed: int = 20261125, words: int = 60000) -> Path:
    """A deterministic text of common words, where llama-benchy looks for the downloaded book."""
    path = Path.home() / ".cache" / "llama-benchy" / f"{hashlib.md5(BOOK_URL.encode()).hexdigest()}.txt"
    rng = random.Random(seed)
    vocab = WORDS.split()
    sentences = []
    while sum(len(s) for s in sentences) < words:
        sentences.append(rng.choices(vocab, k=rng.randint(8, 20)))
    text = "\n".join(" ".join(s).capitalize() + "." for s in sentences) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


class Cluster(Protocol):
    """What a tunnel needs of a lab: its inventory and the environment sparkctl runs in."""

    @property
    def inventory(self) -> Path: ...

    @property
    def env(self) -> dict[str, str]: ...


def tunnel(lab: Cluster, server: str) -> tuple[subprocess.Popen[str], int]:
    """`sparkctl tunnel` on a free local port, until stopped; returns (process, port)."""
    proc = subprocess.Popen([SPARKCTL, "tunnel", "--inventory", str(lab.inventory), "--server",
                             server, "--local-port", "0"], text=True, stdout=subprocess.PIPE,
                            env={**lab.env, "PYTHONUNBUFFERED": "1"}, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen.append(line)
        for word in line.replace("/", " ").split():
            if word.startswith("127.0.0.1:") and word.split(":", 1)[1].rstrip(".,").isdigit():
                return proc, int(word.split(":", 1)[1].rstrip(".,"))
        if proc.poll() is not None:
            break
    proc.kill()
    raise BenchError(f"sparkctl tunnel did not say its port: {''.join(seen)[-400:]}")


def run(lab: Lab, recipe: str, tg: int, pp: int, runs: int, rounds: int,
        log: Any = print) -> dict[str, Any]:
    for args in (("up", "--yes"), ("launch", recipe, "--yes", "--timeout", "300")):
        timed = lab.sparkctl(*args)
        if not timed.ok:
            raise BenchError(f"sparkctl {args[0]}: {timed.failure()}")
    exe, corpus = benchy(), seeded_corpus()
    proc, port = tunnel(lab, recipe)
    ours: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    try:
        # the two clients take turns, so a change in the machine's load (2 shared cores) falls
        # on both alike
        for turn in range(rounds):
            log(f"round {turn + 1}/{rounds}: sparkctl bench, then llama-benchy {BENCHY}, "
                f"through 127.0.0.1:{port}")
            ours.append(sparkctl_bench(lab, recipe, tg, pp, runs))
            theirs.append(llama_benchy(exe, lab.workdir / f"benchy-{turn}.json", port, tg, pp, runs))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return compare(ours, theirs, corpus, tg, pp, runs)


def sparkctl_bench(lab: Lab, recipe: str, tg: int, pp: int, runs: int) -> dict[str, Any]:
    done = subprocess.run([SPARKCTL, "bench", "--inventory", str(lab.inventory), "--server",
                           recipe, "--tg", str(tg), "--pp", str(pp), "--depth", "0", "-c", "1",
                           "--runs", str(runs), "--json"], env=lab.env, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise BenchError(f"sparkctl bench exited {done.returncode}: {done.stderr[-400:]}")
    return dict(json.loads(done.stdout))


def llama_benchy(exe: Path, saved: Path, port: int, tg: int, pp: int, runs: int,
                 model: str = MODEL) -> dict[str, Any]:
    """llama-benchy at concurrency 1 against the server's model (the lab hub's repo `model`,
    whose tokenizer.json it counts tokens with)."""
    done = subprocess.run(
        [str(exe), "--base-url", f"http://127.0.0.1:{port}/v1", "--model", model,
         "--tokenizer", str(HUB / model / "tokenizer.json"), "--book-url", BOOK_URL,
         "--pp", str(pp), "--tg", str(tg), "--depth", "0", "--runs", str(runs),
         "--concurrency", "1", "--skip-coherence", "--no-cache", "--format", "json",
         "--save-result", str(saved)], capture_output=True, text=True, check=False)
    if done.returncode != 0 or not saved.exists():
        raise BenchError(f"llama-benchy exited {done.returncode}: {(done.stdout + done.stderr)[-600:]}")
    return dict(json.loads(saved.read_text()))


def tg_values(doc: Any) -> list[float]:
    """Every run's c1 generation rate (t/s) in a result: `tg_throughput.values` of sparkctl's
    cells or of llama-benchy's benchmarks (both use llama-benchy's definition)."""
    found: list[float] = []
    if isinstance(doc, dict):
        figure = doc.get("tg_throughput")
        if isinstance(figure, dict) and isinstance(figure.get("values"), list):
            return [float(v) for v in figure["values"] if isinstance(v, (int, float))]
        for value in doc.values():
            found += tg_values(value)
    elif isinstance(doc, list):
        for value in doc:
            found += tg_values(value)
    return found


def compare(ours: list[dict[str, Any]], theirs: list[dict[str, Any]], corpus: Path, tg: int,
            pp: int, runs: int) -> dict[str, Any]:
    from statistics import mean, median

    a, b = tg_values(ours), tg_values(theirs)
    if not a or not b:
        raise BenchError(f"no tg figures found (sparkctl: {a}, llama-benchy: {b})")
    ratio = mean(a) / mean(b)
    # each round's two clients ran back to back: a ratio per round cancels a load that changes
    # between rounds (another lab starting on the same 2 cores), which pooled medians do not
    pairs = [(tg_values([o]), tg_values([t])) for o, t in zip(ours, theirs, strict=True)]
    round_ratios = [median(o) / median(t) for o, t in pairs if o and t]
    return {"sparkctl_tg_tps": round(mean(a), 1), "llama_benchy_tg_tps": round(mean(b), 1),
            "round_ratios": [round(r, 3) for r in round_ratios],
            "paired_ratio": round(median(round_ratios), 3) if round_ratios else None,
            "sparkctl_tg_median": round(median(a), 1), "llama_benchy_tg_median": round(median(b), 1),
            "sparkctl_tg_values": [round(v, 1) for v in a],
            "llama_benchy_tg_values": [round(v, 1) for v in b],
            "ratio": round(ratio, 3), "agree_within": AGREE, "ok": abs(ratio - 1) <= AGREE,
            "tg": tg, "pp": pp, "runs_per_round": runs, "rounds": len(ours), "concurrency": 1,
            "corpus": str(corpus), "llama_benchy": BENCHY, "sparkctl": ours,
            "llama_benchy_result": theirs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lab-id", type=int, default=24)
    ap.add_argument("--recipe", default="lab-tiny-llama-rpc")
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--pp", type=int, default=256)
    ap.add_argument("--runs", type=int, default=2, help="runs per client and round")
    ap.add_argument("--rounds", type=int, default=4, help="turns each client takes")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    lab = Lab(args.lab_id)
    try:
        lab.up(engine_load_seconds=1, model_bytes=1 << 20)
        doc = run(lab, args.recipe, args.tg, args.pp, args.runs, args.rounds)
    except BenchError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    finally:
        lab.down()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"| client | c1 generation (tg{args.tg}, pp{args.pp}), mean | median | runs |\n"
          "| --- | --- | --- | --- |\n"
          f"| sparkctl bench | {doc['sparkctl_tg_tps']} t/s | {doc['sparkctl_tg_median']} | "
          f"{doc['sparkctl_tg_values']} |\n"
          f"| llama-benchy {BENCHY} | {doc['llama_benchy_tg_tps']} t/s | "
          f"{doc['llama_benchy_tg_median']} | {doc['llama_benchy_tg_values']} |\n"
          f"ratio {doc['ratio']} ({'agree' if doc['ok'] else 'DISAGREE'} within "
          f"{AGREE:.0%}); {args.out}")
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
