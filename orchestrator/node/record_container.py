"""Which container the server record names (runs on the node as `python3 -c`; arguments: the
path of server.json, the default container, and an engine name or ""): prints the container
when the recorded server is that engine's (or any, with ""). Standard library only.
"""
import json
import sys

try:
    with open(sys.argv[1]) as handle:
        record = json.load(handle)
except Exception:
    record = {}
engine = record.get("engine", "trtllm")
if sys.argv[3] in ("", engine):
    print(record.get("container") or sys.argv[2])
