"""Which container the server record names (runs on the node as `python3 -c`; arguments: the
path of server.json, the default container, an engine name or "", and optionally the engine of
a record that names none): prints the container when the recorded server is that engine's (or
any, with ""). Standard library only.
"""
import json
import sys

try:
    with open(sys.argv[1]) as handle:
        record = json.load(handle)
except Exception:
    record = {}
engine = record.get("engine") or (sys.argv[4] if len(sys.argv) > 4 else "")
if sys.argv[3] in ("", engine):
    print(record.get("container") or sys.argv[2])
