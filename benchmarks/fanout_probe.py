"""Where the fan-out's time goes: its node script run directly between two lab nodes, no sparkctl.

Same lab, same run, interleaved: the fan-out's own sender and receiver (orchestrator/node/
fanout.py, unchanged) copy one folder head -> peer over the fabric with 1, 2 and 4 streams
(4: sparkctl's default); again with the receiver's older data path (recv into a buffer + pwrite
instead of splice + hash from the page cache); with sha256 replaced by a no-op (the hashing's
share); sha256 alone on the node (one core: the verification's floor); the receiver's CPU busy
share during the verified and the unverified copies (near 100 %: CPU-bound); from those, the
ceiling of any verified copy when both ends share the machine's CPUs (`ceiling`); and iperf3
next to them. Nothing here is timed by sparkctl: the rates are the sender's own seconds (first
connection to the receiver's confirmation that the last chunk is verified and written), so
process start-up (docker exec, python) is excluded from every row.

    python -m benchmarks.fanout_probe --lab-id 30 [--mib 384] [--runs 3]   (a lab that is up)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from statistics import median

from benchmarks.labctl import Lab
from benchmarks.staging import fabric_ip, iperf

DIR = "/var/tmp/sparkctl-fanout-probe"
NODE = Path(__file__).resolve().parent.parent / "orchestrator" / "node"
FILES = 4
SHA_ROW = "sha256, 1 core, in memory"
CPU_ROW = "receiver's CPU busy while verified (%)"
CPU_UNVERIFIED_ROW = "receiver's CPU busy while not verified (%)"
CEILING_ROW = "verified copy's ceiling on these CPUs (computed)"
DEFAULT = "verified, 4 streams (sparkctl's default)"
UNVERIFIED = "not verified (sha256 no-op), 4 streams"
UNITLESS = (SHA_ROW, CPU_ROW, CPU_UNVERIFIED_ROW)
PERCENT = (CPU_ROW, CPU_UNVERIFIED_ROW)
NO_HASH = ("import hashlib\nclass _Same(str):\n    __hash__ = str.__hash__\n"
           "    def __eq__(self, other): return True\n    def __ne__(self, other): return False\n"
           "class _NoHash:\n    def __init__(self, data=b''): pass\n"
           "    def update(self, data): pass\n    def hexdigest(self): return _Same('skipped')\n"
           "hashlib.sha256 = _NoHash\n")
NO_SPLICE = "import os\nif hasattr(os, 'splice'):\n    del os.splice\n"
PLAN = """
import hashlib, json, os, sys
sys.path.insert(0, {dir!r})
from fanout_manifest import hash_file, CHUNK
root = {dir!r} + "/src"
files = []
for rel in sorted(os.listdir(root)):
    whole, chunks = hash_file(os.path.join(root, rel))
    files.append({{"rel": rel, "size": os.path.getsize(os.path.join(root, rel)),
                  "sha256": whole, "chunks": chunks}})
print(json.dumps({{"files": files, "chunk": CHUNK}}))
"""
SHA = ("import hashlib, os, time\nb = os.urandom(32 << 20)\nt = time.perf_counter(); n = 0\n"
       "while time.perf_counter() - t < 2:\n    hashlib.sha256(b).digest(); n += len(b)\n"
       "print(n / (time.perf_counter() - t) / 1e6)\n")


def install(lab: Lab, node: str) -> None:
    lab.exec(node, f"rm -rf {DIR} && mkdir -p {DIR}")
    for name in ("stdin_watch.py", "fanout_manifest.py", "fanout_io.py", "fanout_receiver.py",
                 "fanout.py"):
        lab.exec(node, f"cat > {DIR}/{name}", stdin=(NODE / name).read_text())
    script = (NODE / "fanout.py").read_text()
    lab.exec(node, f"cat > {DIR}/fanout_nohash.py", stdin=NO_HASH + script)
    lab.exec(node, f"cat > {DIR}/fanout_nosplice.py", stdin=NO_SPLICE + script)


def prepare(lab: Lab, head: str, peer: str, mib: int) -> dict[str, object]:
    """FILES random files of mib/FILES MiB on the head; their manifest (chunk hashes)."""
    for node in (head, peer):
        install(lab, node)
    each = mib // FILES
    lab.exec(head, f"mkdir -p {DIR}/src && for i in $(seq 1 {FILES}); do head -c {each}M "
                   f"/dev/urandom > {DIR}/src/shard-$i.bin; done")
    return dict(json.loads(lab.exec(head, f"python3 -c {_q(PLAN.format(dir=DIR))}")))


def _q(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def copy(lab: Lab, head: str, peer: str, manifest: dict[str, object], streams: int,
         script: str = "fanout.py", dst: str = f"{DIR}/dst", cpu: list[float] | None = None
         ) -> float:
    """One copy into an empty folder on the peer; MB/s as the sender measured it (and the
    receiver's CPU busy share appended to `cpu`)."""
    files = manifest["files"]
    assert isinstance(files, list)
    lab.exec(peer, f"rm -rf {dst} && mkdir -p {dst}")
    plan = {"token": "probe-token-0123456789abcdef", "chunk": manifest["chunk"],
            "repos": [{"root": dst, "files": files, "links": {}, "refs": {}}]}
    ip = fabric_ip(lab, peer)
    args = json.dumps({"listen": ip, "streams": streams})
    lab.exec(peer, f"cat > {DIR}/plan.json", stdin=json.dumps(plan))
    # `lab exec` waits for its command: the receiver runs detached, its lines go to a file
    lab.exec(peer, f"rm -f {DIR}/recv.out; setsid python3 {DIR}/{script} recv {_q(args)} "
                   f"< {DIR}/plan.json > {DIR}/recv.out 2>&1 &")
    ready: dict[str, object] = {}
    for _ in range(600):
        first = lab.exec(peer, f"head -n1 {DIR}/recv.out", check=False).strip()
        if first.startswith("{"):
            ready = json.loads(first)
            break
        time.sleep(0.1)
    job = {"token": plan["token"], "files": [[f"{DIR}/src", f["rel"]] for f in files],
           "need": ready["need"]}
    lab.exec(head, f"cat > {DIR}/job.json", stdin=json.dumps(job))
    send_args = json.dumps({"host": ip, "port": ready["port"], "streams": ready["streams"]})
    sent = lab.exec(head, f"python3 {DIR}/{script} send {_q(send_args)} < {DIR}/job.json")
    final = ""
    for _ in range(600):
        final = lab.exec(peer, f"cat {DIR}/recv.out", check=False)
        if '"done"' in final or '"error"' in final:
            break
        time.sleep(0.1)
    last = json.loads(sent.strip().splitlines()[-1])
    lab.exec(peer, f"rm -rf {dst}")
    if not last.get("done") or '"done": true' not in final:
        raise RuntimeError(f"probe copy failed: {sent[-300:]} {final[-300:]}")
    busy = json.loads(final.strip().splitlines()[-1]).get("cpu_busy")
    if cpu is not None and busy is not None:
        cpu.append(100 * float(busy))
    return float(last["sent"]) / float(last["seconds"]) / 1e6


def sha256_rate(lab: Lab, node: str) -> float:
    return float(lab.exec(node, f"python3 -c {_q(SHA)}").strip())


def ceiling(cpus: int, unverified: float, busy_percent: float, sha256: float) -> float:
    """The fastest a verified copy can go when both ends share CPUS (the lab): moving a MB
    costs what the unverified copy used (CPUS x busy / its rate, core-seconds: TCP, splice,
    page cache), hashing it 1/sha256 more; CPUS divided by the sum. MB/s."""
    moving = cpus * busy_percent / 100 / unverified
    return cpus / (moving + 1 / sha256)


def probe(lab: Lab, head: str, peer: str, mib: int, runs: int) -> dict[str, list[float]]:
    """Every row, `runs` times, interleaved."""
    manifest = prepare(lab, head, peer, mib)
    cpus = int(lab.exec(peer, "nproc").strip())
    rows: dict[str, list[float]] = {}
    for _ in range(runs):
        rows.setdefault("iperf3", []).append(iperf(lab, head, peer))
        rows.setdefault("verified, 1 stream", []).append(copy(lab, head, peer, manifest, 1))
        rows.setdefault("verified, 2 streams", []).append(copy(lab, head, peer, manifest, 2))
        rows.setdefault(DEFAULT, []).append(
            copy(lab, head, peer, manifest, 4, cpu=rows.setdefault(CPU_ROW, [])))
        rows.setdefault("verified, 4 streams, recv+write (no splice)", []).append(
            copy(lab, head, peer, manifest, 4, "fanout_nosplice.py"))
        rows.setdefault(UNVERIFIED, []).append(copy(
            lab, head, peer, manifest, 4, "fanout_nohash.py",
            cpu=rows.setdefault(CPU_UNVERIFIED_ROW, [])))
        rows.setdefault(SHA_ROW, []).append(sha256_rate(lab, peer))
        if len(rows[CPU_UNVERIFIED_ROW]) == len(rows[UNVERIFIED]):
            rows.setdefault(CEILING_ROW, []).append(ceiling(
                cpus, rows[UNVERIFIED][-1], rows[CPU_UNVERIFIED_ROW][-1], rows[SHA_ROW][-1]))
    for node in (head, peer):
        lab.exec(node, f"rm -rf {DIR}", check=False)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab-id", type=int, required=True)
    parser.add_argument("--mib", type=int, default=384)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    lab = Lab(args.lab_id)
    head, peer = lab.node_names()[:2]
    rows = probe(lab, head, peer, args.mib, args.runs)
    base = median(rows["iperf3"])
    for name, values in rows.items():
        share = f"{median(values) / base:4.0%}" if name not in UNITLESS else "    "
        unit = "%   " if name in PERCENT else "MB/s"
        print(f"{name:<60} {median(values):7.0f} {unit}  {share}  "
              f"({', '.join(f'{v:.0f}' for v in values)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
