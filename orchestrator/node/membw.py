"""The node's memory bandwidth as one core copies memory (runs on the node as `python3 -`,
argv[1] JSON {"mb": N, "rounds": R}): copies an N MB buffer into another R times (a memcpy each,
far larger than any CPU cache) and prints {"gbs": ...}, the best round's bytes read + written per
second (STREAM's "copy" counting). What a CPU engine's decode reads at, one thread's share of it:
`sparkctl advise --memory-bandwidth measure` (docs/advise.md). Standard library only.
"""
import json
import sys
import time

args = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
size = int(args.get("mb", 64)) * 1024 * 1024
rounds = int(args.get("rounds", 8))
source = bytearray(b"\x5a") * size
target = bytearray(size)  # touched once first, so page faults are not timed
target[:] = source
best = float("inf")
for _ in range(rounds):
    start = time.perf_counter()
    target[:] = source
    best = min(best, time.perf_counter() - start)
print(json.dumps({"gbs": round(2 * size / best / 1e9, 2), "mb": size // (1024 * 1024),
                  "rounds": rounds}))
