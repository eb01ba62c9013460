"""A bounded load through one OpenAI-compatible address (runs in a lab node's network namespace;
one JSON argument: {"url": base URL, "model": name, "key_file": path or null, "concurrency": C,
"max_tokens": T, "stop_file": path, "seconds": at most S}).

C workers send chat completions one after another until STOP_FILE exists (or S seconds pass),
each answer counted as ok (HTTP 200 with a choice) or failed (anything else: refused, reset,
an error status). Prints {"ok": N, "failed": N, "errors": {first few kinds: count}} as JSON.
Standard library only.
"""
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

a = json.loads(sys.argv[1])
KEY = None
if a.get("key_file"):
    with open(a["key_file"]) as handle:
        KEY = (json.load(handle).get("general_settings") or {}).get("master_key")
BODY = json.dumps({"model": a["model"], "max_tokens": int(a["max_tokens"]),
                   "messages": [{"role": "user", "content": "Paris is great because"}]}).encode()
counts = {"ok": 0, "failed": 0}
errors: dict = {}
lock = threading.Lock()
deadline = time.monotonic() + float(a["seconds"])


def one() -> str:
    headers = {"Content-Type": "application/json"}
    if KEY:
        headers["Authorization"] = "Bearer " + KEY
    request = urllib.request.Request(a["url"] + "/v1/chat/completions", data=BODY, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            doc = json.loads(answer.read())
        return "ok" if doc.get("choices") else "no choices"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except Exception as exc:  # refused, reset, timeout: a failed request all the same
        return type(exc).__name__


def worker() -> None:
    while time.monotonic() < deadline and not os.path.exists(a["stop_file"]):
        outcome = one()
        with lock:
            if outcome == "ok":
                counts["ok"] += 1
            else:
                counts["failed"] += 1
                errors[outcome] = errors.get(outcome, 0) + 1


threads = [threading.Thread(target=worker) for _ in range(int(a["concurrency"]))]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps({**counts, "errors": errors}))
