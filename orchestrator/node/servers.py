"""The servers recorded on this node (runs on the node as `python3 -c`; one JSON argument:
{"run": RUN_DIR, "probe": bool, "ready_lines": {engine: its ready line}, "migrate": null or, on
the head, {"container": the `up` container, "engine": the engine of a record that names none,
"ours": its process words, "nodes": the cluster's nodes in rank order}, "serverctl": the text of
serverctl.py}).

Every server has its directory RUN_DIR/servers/<name>/, with its record server.json on the
server's first node. A server that is its containers (SGLang, llama.cpp) is alive while they
run (`docker inspect`); a server that is processes in a shared container (TensorRT-LLM's mpirun
and ranks in the `up` container) has, on each of its nodes, processes.json ({"container",
"ours"}) next to its pid files, which serverctl.py checks inside that container: the record's
"main" pid file must live. With "probe" its /health on 127.0.0.1:<port> is asked (the server
binds the node's loopback).
The one-time migration (with "migrate", on the head): the older single record RUN_DIR/server.json
of a server an earlier sparkctl launched before servers had names (TensorRT-LLM's, vLLM's
one-per-cluster server) becomes that server's record in RUN_DIR/servers/<name>/ before anything
is listed, in the current format plus "migrated_from" (docs/launch.md).
With "probe", a server that does not answer 200 also gets "ready_log": whether its engine
logged that it served (stalled, not loading; orchestrator/engines/liveness.py).
Also every member of a named server on this node, whichever node holds the record: containers
labelled sparkctl.server, and the pid files of a process server: {server: {"container",
"running", "rss_kb" (its processes together), "process" (what runs)}}, so a server whose other
node lost its process (an rpc-server, a rank) is seen dead, and status shows what each uses.
A record with a "pid_file" (a process started in its own container by `docker exec`: vLLM's
vllm serve in its Ray container) is alive only while that process is (node-side main_alive).
A server with an API key that answers /health is also asked /v1/models without its key
("keyless": the HTTP code; 401 or 403 when the key is really enforced).
Prints {"servers": [record + {"alive", "health"}], "members": {...}}. Standard
library only.
"""
import json
import os
import subprocess
import sys

# urllib (with http.client, email and ssl: ~20 ms of a node's CPU) is imported where a server is
# asked (answer()): every launch gathers this on every node, most of which hold no server

a = json.loads(sys.argv[1])
run = a["run"]


def load(path):
    try:
        with open(path) as handle:
            record = json.load(handle)
        return record if isinstance(record, dict) else None
    except (OSError, ValueError):
        return None


def text(value):
    return value if isinstance(value, str) else ""


class Record:
    """One server.json as this program reads it, typed once: the fields it uses (a field of
    another type reads as absent: the controller's read names it, orchestrator/records.py);
    `data` is the whole record, printed with what this node saw."""

    def __init__(self, data, name):
        data.setdefault("name", name)
        self.data = data
        self.engine = text(data.get("engine"))
        port = data.get("port")
        self.port = port if isinstance(port, int) and not isinstance(port, bool) else 0
        self.host = text(data.get("host")) or "127.0.0.1"
        self.container = text(data.get("container"))
        self.main = text(data.get("main"))
        self.pid_file = text(data.get("pid_file"))
        ours = data.get("ours")
        self.ours = [w for w in ours if isinstance(w, str)] if isinstance(ours, list) else []
        self.api_key_file = text(data.get("api_key_file"))
        self.ready_at = text(data.get("ready_at"))
        self.migrated_from = text(data.get("migrated_from"))


def running(container):
    try:
        proc = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", container],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.returncode == 0 and proc.stdout.decode().strip() == "true"


def health(record):
    """/health where the server binds (every engine leaves /health open with an API key)."""
    return answer(record, "/health")


def keyless(record):
    """A path every engine guards with a key, asked without it: 401/403 when it is enforced."""
    return answer(record, "/v1/models")


def answer(record, path):
    """The HTTP code of PATH where the server binds, asked without any key (0: no answer)."""
    host = record.host
    if host in ("0.0.0.0", "::", "localhost"):
        host = "127.0.0.1"
    url = "http://%s:%d%s" % (host, record.port, path)
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception:
        return 0


def main_alive(record):
    """A server whose main process was started in its container by `docker exec` (its record's
    "pid_file", the pid in the container's PID namespace): that process lives. The container
    may run on without it (a Ray node), so the container alone does not say the server lives.
    A restarted container has a new namespace whose numbers start again: the process must also
    be the server's (its command line holds one of the record's "ours" words)."""
    try:
        with open(record.pid_file) as handle:
            pid = int(handle.read().strip())
        proc = subprocess.run(["docker", "inspect", "-f", "{{.State.Pid}}", record.container],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        init = int(proc.stdout.decode().strip() or 0)
        namespace = os.readlink("/proc/%d/ns/pid" % init)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return False
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/status" % entry) as handle:
                fields = dict(line.split(":", 1) for line in handle if ":" in line)
            if (fields.get("NSpid", "").split() or ["0"])[-1] == str(pid) and \
                    fields.get("State", "").split()[:1] not in (["Z"], ["X"]) and \
                    os.readlink("/proc/%s/ns/pid" % entry) == namespace:
                with open("/proc/%s/cmdline" % entry, "rb") as handle:
                    command = handle.read().replace(b"\0", b" ").decode(errors="replace")
                return any(word in command for word in record.ours or [""])
        except (OSError, ValueError):
            continue
    return False


def first_match(lines, text):
    """Read until the first line with TEXT (the ready line comes early in a log)."""
    return any(text in line for line in lines)


def ready_log(record, directory):
    """The record's engine logged that it served (its ready line, from the "ready_lines"
    argument): in server.log / rank-0.log of its directory for a process server (and the older
    single record), in its container's log otherwise. Tells a stalled server from one still
    loading."""
    line = (a.get("ready_lines") or {}).get(record.engine)
    if not line:
        return False
    if record.migrated_from or record.pid_file or record.main:
        # a process started in a container: its log is beside its pid file (vLLM's vllm serve),
        # or in the server's directory (TensorRT-LLM's mpirun and ranks, a migrated record)
        where = os.path.dirname(record.pid_file) if record.pid_file else directory
        for name in ("server.log", "rank-0.log"):
            try:
                with open(os.path.join(where, name), errors="replace") as handle:
                    if first_match(handle, line):
                        return True
            except OSError:
                continue
        return False
    try:
        proc = subprocess.Popen(["docker", "logs", record.container],
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


def namespace_usage(pid):
    """(VmRSS in kB of every process in PID's namespace, the name of the largest) when PID is a
    container's first process: processes `docker exec` started there (vLLM's vllm serve) are
    not its descendants, yet they are the server. None outside a container's namespace."""
    try:
        space = os.readlink("/proc/%d/ns/pid" % pid)
        if space == os.readlink("/proc/self/ns/pid"):
            return None
    except OSError:
        return None
    total, largest = 0, (0, "")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink("/proc/%s/ns/pid" % entry) != space:
                continue
            with open("/proc/%s/status" % entry) as handle:
                fields = dict(line.split(":", 1) for line in handle if ":" in line)
            rss = int((fields.get("VmRSS") or "0 kB").split()[0])
        except (OSError, ValueError):
            continue
        total += rss
        largest = max(largest, (rss, fields.get("Name", "").strip()))
    return total, largest[1]


def processes(directory):
    """A process server's pid files in DIRECTORY, checked in its container: {pid file: {"pid",
    "alive", "rss_kb"}}, or None when it has none here (or its container cannot tell)."""
    info = load(os.path.join(directory, "processes.json"))
    if info is None or not a.get("serverctl"):
        return None
    args = {"action": "status", "run": directory, "ours": info.get("ours") or []}
    try:
        proc = subprocess.run(["docker", "exec", str(info.get("container")), "python3", "-c",
                               a["serverctl"], json.dumps(args)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=60)
        pids = json.loads(proc.stdout.decode() or "{}").get("pids") if proc.returncode == 0 else {}
    except (OSError, ValueError, subprocess.TimeoutExpired):
        pids = {}  # its container is gone: so are its processes
    return {"container": info.get("container"), "pids": pids or {}}


def process_member(found):
    """A process server's member on this node: running while every recorded process lives."""
    pids = {k: v for k, v in found["pids"].items() if k != "memguard.pid"}
    alive = [k for k, v in sorted(pids.items()) if v.get("alive")]
    return {"container": found["container"], "running": bool(pids) and len(alive) == len(pids),
            "rss_kb": sum(int(v.get("rss_kb") or 0) for v in pids.values() if v.get("alive")),
            "process": ", ".join(k[:-4] for k in alive),
            "ended": ["%s (pid %s)" % (k[:-4], v.get("pid")) for k, v in sorted(pids.items())
                      if not v.get("alive")]}


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
        usage = namespace_usage(pid) if pid else None
        out[labels.get("sparkctl.server") or "?"] = {
            "container": (item.get("Name") or "").lstrip("/"), "running": bool(state.get("Running")),
            "rss_kb": usage[0] if usage else (tree_rss_kb(pid) if pid else 0),
            "process": (usage[1] if usage else "") or process}
    return out


MOVED_SUFFIXES = (".pid", ".log", ".yml")
"""What an earlier sparkctl's server kept directly in RUN_DIR (pid files, logs, TensorRT-LLM's
extra LLM API config): it moves into the server's directory with its record."""


def migrate(how):
    """One time: RUN_DIR/server.json (no name, engine or nodes in TensorRT-LLM's; vLLM's in its
    own containers) becomes RUN_DIR/servers/<name>/server.json in the current format, its files
    moving along (a rename: the running processes keep writing their logs). The old record goes
    last, so an interrupted migration runs again on the next read."""
    old = os.path.join(run, "server.json")
    record = load(old)
    if record is None:
        return
    record.setdefault("engine", how["engine"])
    record.setdefault("container", how["container"])
    name = str(record.get("name") or record.get("recipe") or "server")
    if "/" in name or name.startswith("."):  # (sparkctl never wrote such a name)
        name = "server"
    if os.path.exists(os.path.join(run, "servers", name, "server.json")):
        name += "-earlier"  # a named server of that name runs too: never overwrite its record
    record["name"] = name
    if not record.get("nodes"):  # TensorRT-LLM's: the head and the next tp_size - 1 nodes
        record["nodes"] = how["nodes"][:max(1, int(record.get("tp_size") or 1))]
    record.setdefault("recipe", name)
    record["migrated_from"] = old
    directory = os.path.join(run, "servers", name)
    os.makedirs(directory, exist_ok=True)
    for entry in sorted(os.listdir(run)):
        path = os.path.join(run, entry)
        if entry.endswith(MOVED_SUFFIXES) and os.path.isfile(path):
            os.replace(path, os.path.join(directory, entry))
    if record["container"] == how["container"]:  # mpirun and ranks in the `up` container
        record.setdefault("main", "mpirun.pid")
        record.setdefault("ours", how["ours"])
        write(os.path.join(directory, "processes.json"),
              {"container": record["container"], "ours": record["ours"]})
    else:  # its own containers (vLLM's sparkctl-vllm): alive while they run, as it always was
        record.pop("main", None)
    write(os.path.join(directory, "server.json"), record)
    os.remove(old)


def write(path, data):
    with open(path + ".tmp", "w") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.write("\n")
    os.replace(path + ".tmp", path)


if a.get("migrate"):
    try:
        migrate(a["migrate"])
    except OSError as exc:  # (a read-only or full disk: listed as it is, said once)
        sys.stderr.write("cannot migrate %s/server.json: %s\n" % (run, exc))


found, own = [], {}
base = os.path.join(run, "servers")
for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
    directory = os.path.join(base, name)
    procs = processes(directory)
    if procs is not None:
        own[name] = process_member(procs)
        # a guard stops the whole server from any of its nodes: its record is on that node
        own[name]["memguard"] = load(os.path.join(directory, "memguard-stopped.json"))
    data = load(os.path.join(directory, "server.json"))  # (a guard's directory alone: skip)
    if data is None:
        continue
    record = Record(data, name)
    # the memory guard's stop record (node/memguard.py), if it stopped this server
    data["memguard"] = load(os.path.join(directory, "memguard-stopped.json"))
    if record.pid_file:  # started in its own container by docker exec: both must live
        data["alive"] = bool(running(record.container)) and main_alive(record)
    elif record.main:  # processes in a shared container: its main process must live
        main = ((procs or {}).get("pids") or {}).get(record.main) or {}
        data["alive"] = bool(main.get("alive"))
    else:
        data["alive"] = bool(running(record.container))
    found.append((record, directory))
if a.get("probe"):
    for record, directory in found:
        seen = record.data
        seen["health"] = health(record) if seen["alive"] else None
        if record.migrated_from and not record.main and not seen["health"]:
            seen["alive"] = False  # its container runs on, the server does not answer
        if record.api_key_file and seen["health"] == 200:
            # a path every engine guards, asked without the key: only a refusal (401/403)
            # proves the key is enforced (status says "with API key" for nothing less)
            seen["keyless"] = keyless(record)
        if seen["alive"] and seen["health"] != 200 and not record.ready_at:
            seen["ready_log"] = ready_log(record, directory)
print(json.dumps({"servers": [record.data for record, _ in found],
                  "members": {**members(), **own}}))
