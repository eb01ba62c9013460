"""Server control inside a container (runs as `python3 -c`, one JSON argument).

Actions: status (pid files, server.json, HTTP probes), stop (what the pid files name, with
descendants), started (record server.json once the detached launcher wrote its pid), chat (one
completion, for the smoke test). Standard library only: it runs on the container's python3.
"""
import contextlib
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request

a = json.loads(sys.argv[1])
run = a["run"]


def read(path):
    with open(path) as f:
        return f.read()


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
def pidfiles():
    out = {}
    for name in sorted(os.listdir(run)) if os.path.isdir(run) else []:
        if name.endswith(".pid"):
            try:
                pid = int(read(os.path.join(run, name)).strip())
            except (OSError, ValueError):
                continue
            words = a.get("ours") or ("mpirun", "trtllm", "orted", "sparkctl-memguard")
            ours = any(w in cmdline(pid) for w in words)
            out[name] = {"pid": pid, "alive": alive(pid) and ours}
    return out
# where the probed server answers and its API key's header: from its record (aim_at)
target = {"host": "127.0.0.1", "headers": {"Content-Type": "application/json"}}


def aim_at(record):
    """Probe the recorded server where it binds, with its key (the node file the record names,
    read here: the run dir is mounted; never on a command line)."""
    if not record or int(record.get("port") or 0) != int(a.get("port") or 0):
        return
    host = record.get("host") or "127.0.0.1"
    target["host"] = "127.0.0.1" if host in ("0.0.0.0", "::", "localhost") else host
    with contextlib.suppress(OSError):
        if record.get("api_key_file"):
            target["headers"]["Authorization"] = "Bearer " + read(record["api_key_file"]).strip()


def http(path, body=None, timeout=10):
    url = "http://%s:%d%s" % (target["host"], a["port"], path)
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=target["headers"])
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")[:20000]
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")[:2000]
    except Exception as e:
        return 0, str(e)[:300]
def children(pid):
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(read(f"/proc/{entry}/stat").rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                kids += [int(entry), *children(int(entry))]
    return kids
def ready_in_log(record):
    """The record's engine logged that it serves (its ready line, from the "ready_lines"
    argument): read until the first match, which comes early, so a long log of requests is
    not read through."""
    line = (a.get("ready_lines") or {}).get((record or {}).get("engine") or "trtllm")
    for name in ("server.log", "rank-0.log") if line else ():
        try:
            with open(os.path.join(run, name), errors="replace") as f:
                if any(line in text for text in f):
                    return True
        except OSError:
            continue
    return False
out = {"action": a["action"]}
if a["action"] == "started":
    deadline = time.time() + 15
    main = a.get("main", "mpirun.pid")  # the launcher's pid file (mpirun, vllm serve, ...)
    while time.time() < deadline and not os.path.exists(os.path.join(run, main)):
        time.sleep(0.2)
    pid = None
    with contextlib.suppress(OSError, ValueError):
        pid = int(read(os.path.join(run, main)).strip())
    record = dict(a["server"])
    record[main.replace(".", "_")] = pid
    tmp = os.path.join(run, "server.json.tmp")
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
    os.rename(tmp, os.path.join(run, "server.json"))
    time.sleep(a.get("settle", 2))
    out.update(pid=pid, alive=bool(pid and alive(pid)))
    try:
        out["log"] = read(os.path.join(run, "server.log"))[-3000:]
    except OSError:
        out["log"] = ""
if a["action"] == "stop":
    targets = {}
    for name, info in pidfiles().items():
        if info["alive"]:
            for pid in [info["pid"], *children(info["pid"])]:
                targets[pid] = name
    for pid in targets:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.time() + a.get("grace", 15)
    while time.time() < deadline and any(alive(p) for p in targets):
        time.sleep(0.2)
    killed = [p for p in targets if alive(p)]
    for pid in killed:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    for name in pidfiles():
        os.unlink(os.path.join(run, name))
    if a.get("rotate"):
        for name in os.listdir(run):
            if name.endswith(".log") or name == "memguard-stopped.json":
                os.replace(os.path.join(run, name), os.path.join(run, name + ".1"))
    out.update(stopped=sorted(set(targets.values())), killed=len(killed),
               left=[p for p in targets if alive(p)])
if a["action"] in ("status", "chat"):
    out["pids"] = pidfiles()
    try:
        out["server"] = json.loads(read(os.path.join(run, "server.json")))
    except (OSError, ValueError):
        out["server"] = None
    aim_at(out["server"])
    try:
        out["memguard"] = json.loads(read(os.path.join(run, "memguard-stopped.json")))
    except (OSError, ValueError):
        out["memguard"] = None
    if a.get("port") or a.get("ready_log"):
        out["ready_log"] = ready_in_log(out["server"])
    if a.get("port"):
        out["health"] = http("/health")[0]
        if a.get("deep") and out["health"] == 200:
            if a.get("generate", True):  # TensorRT-LLM only: one token through every rank
                out["health_generate"] = http("/health_generate", timeout=60)[0]
            code, body = http("/v1/models")
            out["models"] = [m.get("id") for m in json.loads(body).get("data", [])] if code == 200 else []
    if a["action"] == "chat":
        started = time.time()
        code, body = http("/v1/chat/completions", a["request"], timeout=a.get("timeout", 120))
        out.update(code=code, body=body, seconds=time.time() - started)
json.dump(out, sys.stdout)
