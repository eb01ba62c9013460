"""The server's HTTP health as the node sees it (runs on the node as `python3 -c`; arguments:
the path of server.json, and JSON {"paths": {engine: its health paths}, "default": the engine of
records that name none}): works with the container down. Standard library only.
"""
import json
import sys
import urllib.error
import urllib.request

try:
    with open(sys.argv[1]) as handle:
        server = json.load(handle)
except Exception as exc:
    print(json.dumps({"error": f"no server record: {exc}"}))
    sys.exit(0)
host = server.get("host") or "127.0.0.1"
if host in ("0.0.0.0", "::", "localhost"):
    host = "127.0.0.1"
out = {}
engines = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
paths = (engines.get("paths") or {}).get(server.get("engine") or engines.get("default")) or [
    "/health", "/v1/models"]
for index, path in enumerate(paths[:2]):
    timeout = 5 if index == 0 else 20
    try:
        with urllib.request.urlopen("http://{}:{}{}".format(host, server.get("port", 8000), path),
                                    timeout=timeout) as answer:
            out[path] = answer.status
    except urllib.error.HTTPError as exc:
        out[path] = exc.code
    except Exception as exc:
        out[path] = str(getattr(exc, "reason", exc))[:200]
    if out[path] != 200:
        break
print(json.dumps(out))
