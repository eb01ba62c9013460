"""Which server runs on this node, whichever engine started it (runs on the head as `python3 -c`;
arguments: the path of server.json, the default container, the server-control script, the
engine of a record that names none, and that engine's process words as JSON).

Reads the server record, then asks the record's container (`docker exec ... python3 -c
SERVERCTL`) whether the record's main process is alive. Prints {"server": record or None,
"alive": bool, "error": why it could not tell}. Standard library only.
"""
import json
import subprocess
import sys

out: dict = {"server": None, "alive": False}
try:
    with open(sys.argv[1]) as handle:
        record = json.load(handle)
except (OSError, ValueError):
    record = None
if isinstance(record, dict):
    record.setdefault("engine", sys.argv[4])
    record.setdefault("container", sys.argv[2])
    record.setdefault("main", "mpirun.pid")
    out["server"] = record
    args = {"action": "status", "run": sys.argv[1].rsplit("/", 1)[0], "main": record["main"],
            "ours": record.get("ours") or json.loads(sys.argv[5])}
    try:
        proc = subprocess.run(["docker", "exec", record["container"], "python3", "-c", sys.argv[3],
                               json.dumps(args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=60)
        if proc.returncode == 0:
            pids = json.loads(proc.stdout.decode()).get("pids") or {}
            out["alive"] = bool((pids.get(record["main"]) or {}).get("alive"))
        else:  # its container is gone: so is the server
            out["error"] = proc.stderr.decode(errors="replace")[-300:]
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        out["error"] = str(exc)
print(json.dumps(out))
