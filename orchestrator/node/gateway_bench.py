"""What the gateway costs, measured on the gateway's own node (runs as `python3 -c`; one JSON
argument: {"gateway": "http://127.0.0.1:PORT", "config": the router's config path, "model": name,
"direct": [base URLs of every replica], "requests": N, "seconds": S, "concurrency": C,
"max_tokens": T}).

Both paths start here, so no SSH tunnel or controller noise enters either: "direct" sends each
request straight to a replica (round robin over all of them, as the gateway spreads them),
"gateway" sends it through the router. Latency: N requests one at a time, the two paths
interleaved (so drift in the node's load hits both alike), medians compared. Throughput: C
requests at a time for S seconds per path, completed requests and completion tokens per second.
The master key is read from the gateway's config here (root only), never passed in. Prints the
figures as JSON. Standard library only.
"""
import json
import statistics
import sys
import threading
import time
import urllib.request

a = json.loads(sys.argv[1])


def master_key():
    try:
        with open(a["config"]) as handle:
            return json.load(handle).get("api_key")
    except (OSError, ValueError):
        return None


KEY = master_key()
BODY = json.dumps({"model": a["model"], "max_tokens": int(a["max_tokens"]),
                   "messages": [{"role": "user", "content": "Paris is great because"}]}).encode()


def call(base, key):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    request = urllib.request.Request(base + "/v1/chat/completions", data=BODY, headers=headers)
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as answer:
        doc = json.loads(answer.read())
    return time.perf_counter() - started, int((doc.get("usage") or {}).get("completion_tokens") or 0)


def targets(path):
    if path == "gateway":
        while True:
            yield a["gateway"], KEY
    while True:
        for base in a["direct"]:
            yield base, None


def latency():
    samples = {"direct": [], "gateway": []}
    paths = {name: targets(name) for name in samples}
    for name in samples:  # one warm-up each: connection set-up is not what is measured
        call(*next(paths[name]))
    for _ in range(int(a["requests"])):
        for name in samples:
            samples[name].append(call(*next(paths[name]))[0])
    return {name: round(statistics.median(values) * 1000, 2) for name, values in samples.items()}


def throughput(name):
    done, tokens, errors = [0], [0], [0]
    lock = threading.Lock()
    stop = time.monotonic() + float(a["seconds"])
    source = targets(name)

    def worker():
        while time.monotonic() < stop:
            with lock:
                base, key = next(source)
            try:
                _, n = call(base, key)
            except Exception:
                with lock:
                    errors[0] += 1
                continue
            with lock:
                done[0] += 1
                tokens[0] += n

    started = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(int(a["concurrency"]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - started
    return {"requests_per_s": round(done[0] / seconds, 2), "tokens_per_s": round(tokens[0] / seconds, 1),
            "requests": done[0], "errors": errors[0], "seconds": round(seconds, 2)}


medians = latency()
rates = {name: throughput(name) for name in ("direct", "gateway")}
out = {"latency_ms": medians, "added_ms": round(medians["gateway"] - medians["direct"], 2),
       "throughput": rates, "concurrency": int(a["concurrency"]), "requests": int(a["requests"]),
       "ratio": round(rates["gateway"]["tokens_per_s"] / max(rates["direct"]["tokens_per_s"], 1e-9), 3)}
print(json.dumps(out, sort_keys=True))
