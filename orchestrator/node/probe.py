"""A server's HTTP answers as its node sees them (runs on the node as `python3 -c`), the one HTTP
probe program of every engine's server that answers on the node itself. Standard library only.

Two ways to call it:
- `probe.py RECORD ENGINES` (`status`): RECORD is the path of server.json, ENGINES the JSON
  {"paths": {engine: its health paths}, "default": the engine of records that name none}; the
  server is probed where its record says it binds; prints {path: code} and stops at the first
  path that does not answer 200. Works with the container down.
- `probe.py --at PORT HOST KEY_FILE [BODY]` (readiness and the smoke test while launching): /health,
  then /v1/models' model ids ({"health": code, "models": [...]}); with BODY (JSON) one chat
  completion instead ({"code", "body", "seconds"}).
- `probe.py --wait SECONDS CONTAINER SEEN PORT HOST KEY_FILE [RECORD WHEN [BODY]]` (readiness
  while launching): the look of `--at` repeated here on the node every LOOK_EVERY s, plus whether
  CONTAINER runs ("running"), until the answer differs from what the controller last saw (SEEN:
  its /health code), the model is listed, the container stops or SECONDS pass; prints the last
  look. SEEN "-" (the controller's first look, nothing seen yet): only the model listed, the
  container stopped or SECONDS end it, so a server that is ready within SECONDS costs one round
  trip. One SSH round trip per change instead of one per look, and a server that becomes ready
  is seen within LOOK_EVERY s, as a person's `curl` loop sees it. Once the model is listed,
  RECORD gets its ready_at (as `--mark`; "ready_at" in the answer: WHEN, the controller's time
  as it sent the command, plus the seconds this wait took) and BODY is sent as the
  launch's one chat completion ("first": {"code", "body", "seconds"}): what the controller would
  otherwise ask for in two more commands.
- `probe.py --mark RECORD WHEN`: adds "ready_at": WHEN to the server record RECORD unless it is
  already there, atomically; prints {"ready_at": ...}. `status` and `launch` tell a stalled
  server (ready once, no answer now) from one still loading by it (engines/liveness.py).
- `probe.py --metrics PORT HOST [KEY_FILE]` (`status`'s server figures): GET /metrics; prints its
  Content-Type on the first line, then the body as it came; exits 1 (the reason on stderr) when
  it does not answer 200.

A server with an API key gets it in the `Authorization` header, read here (as root) from its
node file (the record's "api_key_file", or KEY_FILE), never from a command line.
"""
import json
import os
import sys
import time

# urllib (with http.client, email and ssl) and subprocess are imported where a probe asks or
# looks: `--mark` runs right after a server's load on a node filled to within its memory
# guard's margin, and those imports are ~8 MB of its RSS (22 MB against 14)


def key_headers(key_file):
    headers = {"Content-Type": "application/json"}
    if key_file:
        try:
            with open(key_file) as handle:
                headers["Authorization"] = "Bearer " + handle.read().strip()
        except OSError:
            pass  # the probe then says 401: the key file is gone
    return headers


def loopback(host):
    return "127.0.0.1" if host in ("0.0.0.0", "::", "localhost", "") else host


def ask(host, port, path, headers, body=None, timeout=5):
    """(HTTP status, body) of one request; (0, why) when nothing answered."""
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request("http://%s:%d%s" % (host, port, path), data=data,
                                     headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read().decode(errors="replace")[:20000]
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")[:2000]
    except Exception as exc:
        return 0, str(getattr(exc, "reason", exc))[:300]


def chat(host, port, headers, body):
    """One chat completion: {"code", "body", "seconds"}."""
    started = time.time()
    code, text = ask(host, port, "/v1/chat/completions", headers, body, 300)
    return {"code": code, "body": text, "seconds": time.time() - started}


def launching(argv):
    """--at PORT HOST KEY_FILE [BODY]: readiness, or one chat completion."""
    port, host, headers = int(argv[0]), loopback(argv[1]), key_headers(argv[2])
    if len(argv) > 3:
        return chat(host, port, headers, json.loads(argv[3]))
    out = {}
    out["health"] = ask(host, port, "/health", headers)[0]
    if out["health"] == 200:
        code, body = ask(host, port, "/v1/models", headers)
        out["models"] = [m.get("id") for m in json.loads(body).get("data", [])] if code == 200 else []
    return out


LOOK_EVERY = 0.1
"""Seconds between two looks at a loading server (each is one local HTTP request)."""
FIRST = "-"
"""SEEN of the first look: no answer and 503 alike are not yet worth a round trip."""
INSPECT_EVERY = 1.0
"""Seconds between two `docker inspect`s of its container (costlier than a look)."""


def container_running(container):
    import subprocess

    try:
        proc = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", container],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return True  # docker cannot tell now: the next look asks again
    return proc.stdout.decode().strip() == "true"


def mark_ready(path, when):
    """--mark RECORD WHEN: RECORD's ready_at, set to WHEN unless it is already there."""
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
    return {"ready_at": record["ready_at"]}


def later(when, seconds):
    """WHEN (an ISO time with its offset) plus SECONDS, as the controller writes times."""
    import datetime

    moment = datetime.datetime.fromisoformat(when) + datetime.timedelta(seconds=seconds)
    return moment.isoformat(timespec="seconds")


def waiting(argv):
    """--wait SECONDS CONTAINER SEEN PORT HOST KEY_FILE [RECORD WHEN [BODY]]: looks until
    something changes (above); once ready, marks RECORD and sends BODY."""
    started = time.time()
    deadline = started + float(argv[0])
    container, seen, running = argv[1], argv[2], True
    # the first look follows the serve step, which saw the container run: the first `docker
    # inspect` (~30 ms of the node's CPU while the server loads) waits INSPECT_EVERY; a server
    # ready sooner (a small model in the page cache) is then never inspected here
    inspected = started if seen == FIRST else 0.0
    while True:
        out = launching(argv[3:6])
        # (not again once the model is listed: the server's answer says it runs, and its
        # container was seen running at most INSPECT_EVERY ago)
        if time.time() - inspected >= INSPECT_EVERY:
            running, inspected = container_running(container), time.time()
        out["running"] = running
        changed = seen != FIRST and str(out["health"]) != seen
        if running and out.get("models") and len(argv) > 7:
            try:
                out.update(mark_ready(argv[6], later(argv[7], time.time() - started)))
            except (OSError, ValueError) as exc:  # the controller marks it again and says why
                out["mark_error"] = str(exc)[:300]
            if len(argv) > 8:
                out["first"] = chat(loopback(argv[4]), int(argv[3]), key_headers(argv[5]),
                                    json.loads(argv[8]))
        if not running or out.get("models") or changed or time.time() >= deadline:
            return out
        time.sleep(LOOK_EVERY)


def recorded(argv):
    """RECORD ENGINES: the recorded server's health paths, in order."""
    try:
        with open(argv[0]) as handle:
            server = json.load(handle)
    except Exception as exc:
        return {"error": f"no server record: {exc}"}
    headers = key_headers(server.get("api_key_file"))
    headers.pop("Content-Type")
    engines = json.loads(argv[1]) if len(argv) > 1 else {}
    paths = (engines.get("paths") or {}).get(server.get("engine") or engines.get("default")) or [
        "/health", "/v1/models"]
    out = {}
    host, port = loopback(server.get("host") or "127.0.0.1"), int(server.get("port", 8000))
    for index, path in enumerate(paths[:2]):
        code, why = ask(host, port, path, headers, timeout=5 if index == 0 else 20)
        out[path] = code if code else why[:200]
        if out[path] != 200:
            break
    return out


def metrics(argv):
    """--metrics PORT HOST [KEY_FILE]: the exposition whole (it may be long), or exit 1."""
    import urllib.error
    import urllib.request

    port, host = int(argv[0]), loopback(argv[1])
    headers = key_headers(argv[2] if len(argv) > 2 else None)
    headers.pop("Content-Type")
    request = urllib.request.Request("http://%s:%d/metrics" % (host, port), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            body = answer.read().decode("utf-8", "replace")
            sys.stdout.write(answer.headers.get("Content-Type", "") + "\n" + body)
    except Exception as exc:  # HTTP Error 401: Unauthorized; or why nothing answered
        why = exc if isinstance(exc, urllib.error.HTTPError) else getattr(exc, "reason", exc)
        sys.stderr.write("GET /metrics: %s\n" % str(why)[:300])
        sys.exit(1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--wait"]:
        print(json.dumps(waiting(sys.argv[2:])))
    elif sys.argv[1:2] == ["--mark"]:
        print(json.dumps(mark_ready(sys.argv[2], sys.argv[3])))
    elif sys.argv[1:2] == ["--metrics"]:
        metrics(sys.argv[2:])
    else:
        print(json.dumps(launching(sys.argv[2:]) if sys.argv[1:2] == ["--at"] else recorded(sys.argv[1:])))
