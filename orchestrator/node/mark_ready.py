"""Record that a server is ready (runs on the node as `python3 -c`; arguments: the path of the
server record and an ISO timestamp): adds "ready_at" to the record unless it is already there,
atomically. `status` and `launch` tell a stalled server (ready once, no answer now) from one still
loading by it (orchestrator/engines/liveness.py). Prints {"ready_at": ...}. Standard library only.
"""
import json
import os
import sys

path, when = sys.argv[1], sys.argv[2]
with open(path) as handle:
    record = json.load(handle)
if not isinstance(record, dict):
    sys.exit("%s: not a server record" % path)
if not record.get("ready_at"):
    record["ready_at"] = when
    tmp = path + ".ready.tmp"
    with open(tmp, "w") as handle:
        json.dump(record, handle, indent=1, sort_keys=True)
    os.chmod(tmp, os.stat(path).st_mode & 0o777)
    os.replace(tmp, path)
print(json.dumps({"ready_at": record["ready_at"]}))
