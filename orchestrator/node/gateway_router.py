"""The gateway's router, started by this launcher (runs detached on the gateway's node as
`python3 -c`; one JSON argument: {"config": router.json, "tree": the unpacked router wheel,
"module": its import name, "pidfile": path}: the router's name is pinned once, in
phases/gateway_spec.py).

The argument names files, never a key. The master key and every replica's key are in the
config file (0600 root, in a 0700 folder): read here and handed to the router in-process
(its RouterArgs), so no key is on the router's command line, in `ps`, or in its log. The
router starts with no worker (its Rust core refuses none of them then) and this adds each one
through the router's own API (`POST /workers`, with that replica's key in the body, on the
node's loopback) once it answers; sparkctl later adds and removes workers the same way
(gateway_workers.py). Python 3.8+, the router's package only (no pip dependency: the router
and its arguments need none).
"""
import importlib
import json
import os
import sys
import time
import urllib.request

a = json.loads(sys.argv[1])
with open(a["config"]) as handle:
    config = json.load(handle)
sys.path.insert(0, a["tree"])
# the wheel's tree is on the path now
Router = importlib.import_module(a["module"] + ".router").Router
RouterArgs = importlib.import_module(a["module"] + ".router_args").RouterArgs

ASK = "127.0.0.1" if config["host"] in ("0.0.0.0", "") else config["host"]
BASE = "http://%s:%d" % (ASK, int(config["port"]))


def call(method, path, body=None):
    request = urllib.request.Request(BASE + path, method=method,
                                     data=None if body is None else json.dumps(body).encode())
    request.add_header("Content-Type", "application/json")
    if config.get("api_key"):
        request.add_header("Authorization", "Bearer " + config["api_key"])
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.status


def add_workers():
    """Once the router answers: every worker of the config, through its own API."""
    for _ in range(600):
        try:
            if call("GET", "/health") == 200:
                break
        except Exception:
            pass
        time.sleep(0.2)
    for worker in config.get("workers") or []:
        try:
            call("POST", "/workers", worker)
        except Exception as exc:  # the URL only: the body holds the replica's key
            print("gateway_router: could not add %s: %s" % (worker["url"], exc), file=sys.stderr)


with open(a["pidfile"] + ".new", "w") as handle:
    handle.write(str(os.getpid()))
os.replace(a["pidfile"] + ".new", a["pidfile"])
args = RouterArgs(host=config["host"], port=int(config["port"]), worker_urls=[],
                  api_key=config.get("api_key"), **config["settings"])
# a child process adds the workers: the router's start() holds the interpreter while it runs,
# so a thread of this process would never get to (measured at 0.3.2)
if os.fork() == 0:
    try:
        add_workers()
    finally:
        os._exit(0)
Router.from_args(args).start()
