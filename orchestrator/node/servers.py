"""The servers recorded on this node (runs on the node as `python3 -c`; one JSON argument:
{"run": RUN_DIR, "probe": bool, "ready_lines": {engine: its ready line}, "legacy_container": name
or null}).

Per-server engines (SGLang) record each server in RUN_DIR/servers/<name>/server.json on the
server's first node; its containers are `docker inspect`ed for liveness, and with "probe" its
/health on 127.0.0.1:<port> is asked (the server binds the node's loopback). The older single
record RUN_DIR/server.json (TensorRT-LLM, vLLM on the head) is listed too, marked "legacy".
With "probe", a server that does not answer 200 also gets "ready_log": whether its engine
logged that it served (stalled, not loading; orchestrator/engines/liveness.py).
Also every container on this node that belongs to a named server (label sparkctl.server, any
engine, whichever node holds the record): {server: {"container", "running", "rss_kb" (its
processes together), "process" (its main process's name)}}, so a server whose other node lost
its process (an rpc-server, a rank) is seen dead, and status shows what each process uses.
Prints {"servers": [record + {"alive", "health", "legacy"}], "members": {...}}. Standard
library only.
"""
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

a = json.loads(sys.argv[1])
run = a["run"]


def load(path):
    try:
        with open(path) as handle:
            record = json.load(handle)
        return record if isinstance(record, dict) else None
    except (OSError, ValueError):
        return None


def running(container):
    try:
        proc = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", container],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.returncode == 0 and proc.stdout.decode().strip() == "true"


def health(record):
    """/health where the server binds (every engine leaves /health open with an API key)."""
    host = record.get("host") or "127.0.0.1"
    if host in ("0.0.0.0", "::", "localhost"):
        host = "127.0.0.1"
    url = "http://%s:%d/health" % (host, int(record.get("port") or 0))
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception:
        return 0


def first_match(lines, text):
    """Read until the first line with TEXT (the ready line comes early in a log)."""
    return any(text in line for line in lines)


def ready_log(record):
    """The record's engine logged that it served (its ready line, from the "ready_lines"
    argument): in server.log / rank-0.log for the older single record (TensorRT-LLM, vLLM), in
    its container's log otherwise (SGLang). Tells a stalled server from one still loading."""
    line = (a.get("ready_lines") or {}).get(record.get("engine") or "trtllm")
    if not line:
        return False
    if record["legacy"]:
        for name in ("server.log", "rank-0.log"):
            try:
                with open(os.path.join(run, name), errors="replace") as handle:
                    if first_match(handle, line):
                        return True
            except OSError:
                continue
        return False
    try:
        proc = subprocess.Popen(["docker", "logs", record.get("container") or ""],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError:
        return False
    try:
        lines = (line.decode(errors="replace") for line in proc.stdout)
        return first_match(lines, line)
    finally:
        proc.kill()
        proc.wait()


def tree_rss_kb(pid):
    """VmRSS of a process and all its descendants, in kB (0 when it is gone)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as handle:
                ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        todo += children.get(current, [])
        try:
            with open("/proc/%d/status" % current) as handle:
                for line in handle:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return total


def members():
    try:
        ids = subprocess.run(["docker", "ps", "-aq", "--filter", "label=sparkctl.managed=true",
                              "--filter", "label=sparkctl.server"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, timeout=60).stdout.decode().split()
        if not ids:
            return {}
        proc = subprocess.run(["docker", "inspect", *ids], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=60)
        found = json.loads(proc.stdout.decode() or "[]")
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}
    out = {}
    for item in found if isinstance(found, list) else []:
        labels = (item.get("Config") or {}).get("Labels") or {}
        state = item.get("State") or {}
        pid = int(state.get("Pid") or 0) if state.get("Running") else 0
        process = ""
        if pid:
            try:
                with open("/proc/%d/comm" % pid) as handle:
                    process = handle.read().strip()
            except OSError:
                pass
        out[labels.get("sparkctl.server") or "?"] = {
            "container": (item.get("Name") or "").lstrip("/"), "running": bool(state.get("Running")),
            "rss_kb": tree_rss_kb(pid) if pid else 0, "process": process}
    return out


found = []
base = os.path.join(run, "servers")
for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
    record = load(os.path.join(base, name, "server.json"))  # (a guard's directory alone: skip)
    if record is None:
        continue
    record.setdefault("name", name)
    record["legacy"] = False
    # the memory guard's stop record (node/memguard.py), if it stopped this server
    record["memguard"] = load(os.path.join(base, name, "memguard-stopped.json"))
    record["alive"] = bool(running(record.get("container") or ""))
    found.append(record)
if a.get("legacy_container"):
    record = load(os.path.join(run, "server.json"))
    if record is not None:
        record.setdefault("engine", "trtllm")
        record.setdefault("container", a["legacy_container"])
        record.setdefault("name", record.get("recipe"))
        record["legacy"] = True
        # a guard on the node itself (vLLM's) records its stop in the server's directory
        record["memguard"] = load(os.path.join(base, str(record["name"]), "memguard-stopped.json"))
        record["alive"] = bool(running(record["container"]))
        found.append(record)
if a.get("probe"):
    for record in found:
        record["health"] = health(record) if record["alive"] else None
        if record["legacy"] and not record["health"]:
            record["alive"] = False  # the `up` container runs on, the server does not answer
        if record["alive"] and record["health"] != 200 and not record.get("ready_at"):
            record["ready_log"] = ready_log(record)
print(json.dumps({"servers": found, "members": members()}))
