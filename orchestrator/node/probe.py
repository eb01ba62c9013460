"""The server's HTTP health as the node sees it (runs on the node as `python3 -c`, with the
path of server.json as its argument): works with the container down. Standard library only.
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
# vLLM (and SGLang) have no /health_generate: /v1/models is their second probe
second = "/health_generate" if server.get("engine", "trtllm") == "trtllm" else "/v1/models"
for path, timeout in (("/health", 5), (second, 20)):
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
