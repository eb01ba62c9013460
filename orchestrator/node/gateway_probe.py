"""What the gateway has on this node (runs as `python3 -c`; one JSON argument: {"dir": the
gateway's run folder, "host": address, "port": port, "liveliness": bool, "config": the
router's config file}).

Prints {"state": the gateway record or null, "port_free": whether HOST:PORT can be bound now,
"address_missing": whether HOST is no address of this node (binding it fails: EADDRNOTAVAIL),
"relays": {server: relay state + "alive"}, "live": the router's /health answered 200,
"workers": the router's own list ({url: {"healthy", "load"}}, asked with the master key read
here from its config; only with "liveliness" on the gateway's node)}. Standard library only.
"""
import errno
import glob
import json
import os
import socket
import sys
import urllib.request

a = json.loads(sys.argv[1])


def load(path):
    try:
        with open(path) as handle:
            value = json.load(handle)
        return value if isinstance(value, dict) else None
    except (OSError, ValueError):
        return None


def alive(pid):
    try:
        os.kill(int(pid), 0)
        return True
    except (OSError, ValueError, TypeError):
        return False


def is_relay(pid):
    """The pid is a relay's (after a reboot the recorded number may be another process's)."""
    try:
        with open("/proc/%d/cmdline" % int(pid), "rb") as handle:
            return b"/run/gateway/relay-" in handle.read()
    except (OSError, ValueError, TypeError):
        return False


def bind_error(host, port):
    """None when HOST:PORT can be bound now, else the errno."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
        return None
    except OSError as exc:
        return exc.errno
    finally:
        sock.close()


def ask(host, port, path, key=None):
    host = "127.0.0.1" if host in (None, "", "0.0.0.0") else host
    request = urllib.request.Request("http://%s:%d%s" % (host, int(port), path))
    if key:
        request.add_header("Authorization", "Bearer " + key)
    with urllib.request.urlopen(request, timeout=3) as answer:
        return answer.status, answer.read()


def live(host, port):
    try:
        return ask(host, port, "/health")[0] == 200
    except Exception:
        return False


def router_workers():
    """The router's own worker list, asked at the address and with the key of its config."""
    try:
        with open(a["config"]) as handle:
            config = json.load(handle)
        answer = ask(config["host"], config["port"], "/workers", config.get("api_key"))
        listed = json.loads(answer[1]).get("workers") or []
    except Exception:
        return None
    return {w["url"]: {"healthy": bool(w.get("is_healthy")), "load": w.get("load", 0)}
            for w in listed}


relays = {}
for path in sorted(glob.glob(os.path.join(a["dir"], "relay-*.json"))):
    name = os.path.basename(path)[len("relay-"):-len(".json")]
    state = load(path) or {}
    state["alive"] = alive(state.get("pid")) and is_relay(state.get("pid"))
    relays[name] = state
state = load(os.path.join(a["dir"], "gateway.json"))
mine = state or {}
port = a.get("port") or mine.get("port")
error = bind_error(a.get("host") or "127.0.0.1", a["port"]) if a.get("port") else None
out = {"state": state, "relays": relays,
       "port_free": error != errno.EADDRINUSE if a.get("port") else None,
       "address_missing": error == errno.EADDRNOTAVAIL,
       "live": bool(a.get("liveliness") and port and live(a.get("host") or mine.get("host"), port))}
if out["live"] and a.get("config") and os.path.exists(a["config"]):
    out["workers"] = router_workers()
print(json.dumps(out, sort_keys=True))
