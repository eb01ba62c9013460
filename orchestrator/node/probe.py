"""The server's HTTP health as the node sees it (runs on the node as `python3 -c`; arguments:
the path of server.json, and JSON {"paths": {engine: its health paths}, "default": the engine of
records that name none}): works with the container down. A server with an API key gets it in
the `Authorization` header, read here (as root) from the node file its record names
("api_key_file"), so the second probe (/v1/models) passes its check. Standard library only.
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
headers = {}
if server.get("api_key_file"):
    try:
        with open(server["api_key_file"]) as handle:
            headers["Authorization"] = "Bearer " + handle.read().strip()
    except OSError:
        pass  # the probe then says 401: the key file is gone
out = {}
engines = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
paths = (engines.get("paths") or {}).get(server.get("engine") or engines.get("default")) or [
    "/health", "/v1/models"]
for index, path in enumerate(paths[:2]):
    timeout = 5 if index == 0 else 20
    try:
        request = urllib.request.Request(
            "http://{}:{}{}".format(host, server.get("port", 8000), path), headers=headers)
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            out[path] = answer.status
    except urllib.error.HTTPError as exc:
        out[path] = exc.code
    except Exception as exc:
        out[path] = str(getattr(exc, "reason", exc))[:200]
    if out[path] != 200:
        break
print(json.dumps(out))
