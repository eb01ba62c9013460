"""The router's workers: read them, bring them to a list, take some out (runs as `python3 -c`
on the gateway's node; stdin: {"config": router.json, "workers": the full list to keep
(written to the config) or null, "remove": worker URLs to take out of the router now without
changing the config (a rolling relaunch, `down --server`), "wait": seconds to wait until the
router lists what it should (healthy), "extra", "salt", "rounds": the record's fingerprint}).

The master key never leaves the node: it is read from the config here. A replica's key comes
on stdin (from sparkctl, which read it from the replica's node) and goes only into the config
(0600) and the router's `POST /workers` body on loopback. A worker whose key changed (a key
rotation) is removed and added again. Prints {"added", "removed": URLs, "workers": [{"url",
"healthy", "load"}], "fingerprint": when "workers" was given, else null}. Standard library only.
"""
import hashlib
import json
import os
import sys
import time
import urllib.request

a = json.load(sys.stdin)
with open(a["config"]) as handle:
    config = json.load(handle)
ASK = "127.0.0.1" if config["host"] in ("0.0.0.0", "") else config["host"]
BASE = "http://%s:%d" % (ASK, int(config["port"]))


def call(method, path, body=None):
    request = urllib.request.Request(BASE + path, method=method,
                                     data=None if body is None else json.dumps(body).encode())
    request.add_header("Content-Type", "application/json")
    if config.get("api_key"):
        request.add_header("Authorization", "Bearer " + config["api_key"])
    with urllib.request.urlopen(request, timeout=10) as answer:
        text = answer.read()
    return json.loads(text) if text.strip() else {}


def listed():
    return {w["url"]: w for w in call("GET", "/workers").get("workers") or []}


old_keys = {w["url"]: w.get("api_key") for w in config.get("workers") or []}
added, removed = [], []
fingerprint = None
if a.get("workers") is not None:
    config["workers"] = a["workers"]
    text = json.dumps(config, indent=1, sort_keys=True) + "\n"
    temporary = a["config"] + ".new"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(temporary, a["config"])
    fingerprint = hashlib.pbkdf2_hmac(
        "sha256", (text + json.dumps(a["extra"])).encode(), a["salt"].encode(),
        int(a["rounds"])).hex()
    rotated = {w["url"] for w in a["workers"] if old_keys.get(w["url"], w.get("api_key"))
               != w.get("api_key")}
else:
    rotated = set()
out_now = set(a.get("remove") or [])
wanted = {w["url"]: w for w in config.get("workers") or [] if w["url"] not in out_now}
now = listed()
for url, worker in now.items():
    if url not in wanted or url in rotated:
        call("DELETE", "/workers/" + worker["id"])
        removed.append(url)
for url, worker in wanted.items():
    if url not in now or url in rotated:
        call("POST", "/workers", worker)
        added.append(url)
deadline = time.monotonic() + float(a.get("wait") or 0)
while True:
    now = listed()
    done = (all(now.get(url, {}).get("is_healthy") for url in wanted)
            and not set(now) & out_now)
    if done or time.monotonic() >= deadline:
        break
    time.sleep(0.2)
workers = [{"url": url, "healthy": bool(w.get("is_healthy")), "load": w.get("load", 0)}
           for url, w in sorted(now.items())]
out = {"added": added, "removed": removed, "workers": workers, "fingerprint": fingerprint}
print(json.dumps(out, sort_keys=True))
