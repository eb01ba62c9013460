"""Memory guard, started detached next to the model server on every serving node.

Runs inside the server's container (`python3 -c <this> sparkctl-memguard JSON`, stdlib only,
Python 3.8+). On unified memory (a DGX Spark's 128 GB are the CPU's and the GPU's), a load that
overshoots does not end in a clean CUDA OOM: the node thrashes and stops answering until a hard
reset. The guard watches MemAvailable in /proc/meminfo and, when it falls below the threshold,
stops the server processes sparkctl recorded (the *.pid files in the run dir and their
descendants: SIGTERM, then SIGKILL after a grace period) while the node still answers, and
records why in `memguard-stopped.json` (node, figures, time). It ends by itself when the server
it guards is gone (stopped by sparkctl, or never started).

With "containers" (engines whose server is its containers: SGLang, vLLM's Ray containers) it
runs on the node itself, not in a container: the server is those containers (docker inspect),
and stopping it is `docker stop` of them; "run" is then the server's record directory, where
its pid file and memguard-stopped.json go (status reads it there).

Argument: {"run": RUN_DIR, "node": NAME, "min_available_gb": 4.0, "interval": 0.5,
           "grace": 5, "start_timeout": 300, "containers": [NAME, ...] (optional)}
"""
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

GIB = 1024 ** 3
RECORD = "memguard-stopped.json"
OWN_PID = "memguard.pid"


def meminfo(path="/proc/meminfo"):
    """MemTotal/MemAvailable/... in bytes."""
    out = {}
    with open(path) as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def children(pid):
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                kids += [int(entry), *children(int(entry))]
    return kids


def server_pids(run):
    """The recorded server processes (every *.pid but the guard's own) that still run."""
    pids = []
    for name in sorted(os.listdir(run)) if os.path.isdir(run) else []:
        if name.endswith(".pid") and name != OWN_PID:
            try:
                with open(os.path.join(run, name)) as f:
                    pid = int(f.read().strip())
            except (OSError, ValueError):
                continue
            if alive(pid):
                pids.append(pid)
    return pids


def containers_running(names, first_ids=None):
    """Those of NAMES whose container runs (docker inspect), or None when docker cannot tell (a
    slow or busy daemon): only a container docker says is stopped or gone counts as ended, so
    one failed look never ends the guard while the server still runs. FIRST_IDS (filled here):
    the ID each name had when first seen; a container of that name with another ID is a later
    launch's (`down --server` then `launch` between two looks), so the guarded one ended: its
    guard must not watch (and stop) the next server, which has a guard of its own."""
    first_ids = {} if first_ids is None else first_ids
    up = []
    for name in names:
        try:
            proc = subprocess.run(["docker", "inspect", "-f", "{{.Id}} {{.State.Running}}", name],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        words = proc.stdout.decode().split()
        if proc.returncode == 0 and len(words) == 2 and words[1] == "true" \
                and first_ids.setdefault(name, words[0]) == words[0]:
            up.append(name)
        elif proc.returncode != 0 and b"no such" not in proc.stderr.lower():
            return None
    return up


def stop_containers(names, grace, ids=None):
    """`docker stop` (SIGTERM, SIGKILL after GRACE s) of the guarded containers (by their IDS
    when known: never a later container of the same name): a stopped container stays stopped,
    even with a restart policy (launch --persist), and keeps its log for `sparkctl logs`."""
    ids = ids or {}
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(["docker", "stop", "-t", str(int(grace)), *[ids.get(n, n) for n in names]],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=grace + 60)
    return list(names), containers_running(names, dict(ids))


def stop(pids, grace):
    targets = []
    for pid in pids:
        targets += [pid, *children(pid)]
    for pid in targets:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.time() + grace
    while time.time() < deadline and any(alive(p) for p in targets):
        time.sleep(0.1)
    killed = [p for p in targets if alive(p)]
    for pid in killed:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return targets, killed


def decide(available, threshold):
    """True when the guard must stop the server."""
    return available < threshold


def write_record(run, record):
    tmp = os.path.join(run, RECORD + ".tmp")
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
    os.rename(tmp, os.path.join(run, RECORD))


def main(args):
    run = args["run"]
    threshold = float(args.get("min_available_gb", 4.0)) * GIB
    interval = float(args.get("interval", 0.5))
    with open(os.path.join(run, OWN_PID), "w") as f:
        f.write("%d\n" % os.getpid())
    containers = args.get("containers") or []
    started = time.time()
    seen = False
    checked, pids, ids = 0.0, [], {}
    while True:
        if not containers:
            pids = server_pids(run)
        elif time.time() - checked >= float(args.get("inspect_every", 5)):
            # docker inspect is costly: memory is read more often
            found, checked = containers_running(containers, ids), time.time()
            pids = pids if found is None else found
        if pids:
            seen = True
        elif seen or time.time() - started > float(args.get("start_timeout", 300)):
            return 0  # the server ended (or never came): nothing left to guard
        info = meminfo()
        available = info.get("MemAvailable", info.get("MemFree", 0))
        if pids and decide(available, threshold):
            record = {
                "node": args.get("node"), "available_gb": round(available / GIB, 2),
                "min_available_gb": round(threshold / GIB, 2),
                "total_gb": round(info.get("MemTotal", 0) / GIB, 2),
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "state": "stopping",
            }
            write_record(run, record)  # first: whoever sees the server die learns why at once
            grace = float(args.get("grace", 5))
            targets, killed = stop_containers(pids, grace, ids) if containers else stop(pids, grace)
            write_record(run, dict(record, state="stopped", stopped=targets, killed=killed))
            return 0
        time.sleep(interval)


COMM = "sparkctl-guard"
"""The guard's process name (/proc/PID/comm): what earlyoom's --avoid protects by name
(`sparkctl up --oom-guard`, phases/oomguard.py), so earlyoom never kills the guard itself."""


def name_process():
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as f:
        f.write(COMM)


if __name__ == "__main__":
    name_process()
    sys.exit(main(json.loads(sys.argv[-1])))
