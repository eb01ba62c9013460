"""Node-side facts gatherer: answers one JSON request with one JSON object, read-only.

Sent on stdin to `python3 - REQUEST_JSON` (as root through sudo), so a phase learns everything
it needs about a node in one round trip. Standard library only (python3-yaml is used when the
node has it, as every netplan node does). Keep it compatible with Python 3.8.
Only the `lock` request writes, and only under /var/lib/sparkctl; and a `batch`: the commands of
consecutive steps the executor sends in one round trip (core/batch.py), run in order after the
lock was taken (never when it was not), each step's outcome answered on its own.
A command may be gated on an image ("gates": {key: {"image", "run_while": "present"|"absent",
"otherwise": its answer when it does not run}}): the gathering inspects each image once, for the
`images` fact and every command gated on it, instead of each command asking docker again.
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time

# hashlib (files' sha256) is imported where a file is read, and a small pool of threads stands in
# for concurrent.futures: every command sparkctl runs starts with this gatherer on every node,
# and those imports were ~8 ms of each one's ~35 ms of CPU before it asked anything

MAX_CONTENT = 256 * 1024


def run(argv, timeout=30, shell=False):
    try:
        proc = subprocess.run(
            argv, shell=shell, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout
        )
        return {
            "rc": proc.returncode,
            "out": proc.stdout.decode(errors="replace"),
            "err": proc.stderr.decode(errors="replace")[-2000:],
        }
    except FileNotFoundError:
        return {"rc": 127, "out": "", "err": "command not found: %s" % (argv if shell else argv[0])}
    except subprocess.TimeoutExpired:
        return {"rc": 124, "out": "", "err": "timed out after %ss" % timeout}


def file_fact(path, want_content):
    try:
        st = os.stat(path)
    except OSError:
        return {"exists": False}
    fact = {"exists": True, "mode": st.st_mode & 0o7777, "uid": st.st_uid, "size": st.st_size}
    if os.path.isfile(path):
        import hashlib

        with open(path, "rb") as handle:
            data = handle.read()
        fact["sha256"] = hashlib.sha256(data).hexdigest()
        if want_content and len(data) <= MAX_CONTENT:
            fact["content"] = data.decode(errors="replace")
    return fact


def netplan_definition(section, body):
    """What one netplan definition sets that can fight another file's: the interface it matches
    (match.name / set-name), its addresses and DHCP (preflight judges, orchestrator/phases)."""
    body = body if isinstance(body, dict) else {}
    match = body.get("match") if isinstance(body.get("match"), dict) else {}
    addresses = body.get("addresses") or []
    if isinstance(addresses, dict):
        addresses = list(addresses)
    return {
        "section": section,
        "match": str(match["name"]) if match.get("name") is not None else None,
        "matches_other": sorted(k for k in match if k != "name"),
        "set_name": body.get("set-name"),
        "addresses": [str(a if not isinstance(a, dict) else next(iter(a), "")) for a in addresses],
        "dhcp4": body.get("dhcp4") in (True, "true", "yes", "on"),
        "dhcp6": body.get("dhcp6") in (True, "true", "yes", "on"),
        "mtu": body.get("mtu"),
    }


def netplan_files(directory="/etc/netplan"):
    """Every netplan file with the ethernets it defines (to spot files fighting over one)."""
    out = {}
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return out
    for name in names:
        if not name.endswith((".yaml", ".yml")):
            continue
        path = os.path.join(directory, name)
        fact = file_fact(path, True)
        interfaces = []
        definitions = {}
        try:
            import yaml

            doc = yaml.safe_load(fact.get("content", "")) or {}
            for section in ("ethernets", "bonds", "bridges", "vlans"):
                found = (doc.get("network") or {}).get(section) or {}
                interfaces += list(found.keys())
                for key, body in found.items():
                    definitions[str(key)] = netplan_definition(section, body)
        except Exception as exc:  # a broken file is a fact too
            fact["error"] = str(exc)[:300]
        fact["interfaces"] = interfaces
        fact["definitions"] = definitions
        fact.pop("content", None)
        out[path] = fact
    return out


def links():
    result = run(["ip", "-j", "-d", "addr", "show"])
    if result["rc"] != 0:
        return {"error": result["err"]}
    out = {}
    for entry in json.loads(result["out"] or "[]"):
        out[entry["ifname"]] = {
            "operstate": entry.get("operstate", "UNKNOWN"),
            "up": "UP" in entry.get("flags", []),
            "carrier": "NO-CARRIER" not in entry.get("flags", []),
            "mtu": entry.get("mtu"),
            "addresses": [
                "%s/%s" % (a["local"], a["prefixlen"])
                for a in entry.get("addr_info", [])
                if a.get("family") == "inet"
            ],
        }
    return out


def ibdev2netdev():
    result = run(["ibdev2netdev"])
    out = {}
    for line in result["out"].splitlines():
        # rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)
        parts = line.split()
        if len(parts) >= 6 and parts[3] == "==>":
            out[parts[4]] = {"device": parts[0], "state": parts[5].strip("()")}
    return {"rc": result["rc"], "devices": out, "err": result["err"]}


def docker_inspect(kind, name):
    """The inspect document of a container or an image; None when there is no such object,
    {"error": why} when docker could not tell."""
    argv = ["docker", "image", "inspect", name] if kind == "image" else ["docker", "inspect", name]
    result = run(argv)
    if result["rc"] != 0:
        return None if "No such" in result["err"] else {"error": result["err"][-300:]}
    try:
        return json.loads(result["out"])[0]
    except (ValueError, IndexError):
        return {"error": result["out"][-300:]}


IMAGES = {}  # type: dict[str, object]
_IMAGE_LOCKS = {}  # type: dict[str, threading.Lock]


def image(name):
    """`docker image inspect NAME`, asked once per gathering whoever asks first (the `images`
    fact or a command gated on it); the others wait for that answer."""
    with _IMAGE_LOCKS.setdefault(name, threading.Lock()):
        if name not in IMAGES:
            IMAGES[name] = docker_inspect("image", name)
    return IMAGES[name]


def gated(command, gate, timeout):
    """COMMAND run while its image is as the gate wants it, else the gate's answer without
    running it. An inspect that failed counts as absent, as a shell's `if docker image inspect`."""
    inspected = image(gate["image"])
    present = isinstance(inspected, dict) and "error" not in inspected
    if present != (gate["run_while"] == "present"):
        return {"rc": 0, "out": gate["otherwise"], "err": ""}
    return run(command, timeout=timeout, shell=True)


def disk(paths):
    out = {}
    for path in paths:
        probe = path
        while probe and not os.path.exists(probe):
            probe = os.path.dirname(probe)
        try:
            st = os.statvfs(probe or "/")
            out[path] = {"free_bytes": st.f_bavail * st.f_frsize, "checked": probe or "/"}
        except OSError as exc:
            out[path] = {"error": str(exc)}
    return out


def routes(addresses):
    out = {}
    for address in addresses:
        result = run(["ip", "-j", "route", "get", address])
        try:
            out[address] = json.loads(result["out"])[0].get("dev")
        except (ValueError, IndexError):
            out[address] = None
    return out


def probes(request):
    """Run read-only probe commands (pings, ssh, mpirun) at once, each with its own deadline.

    In parallel so a dead link costs one timeout, not one per probe (netcheck sends these).
    """
    import threading

    out = {}

    def one(key, spec):
        started = time.time()
        result = run(spec["argv"], timeout=spec.get("timeout", 30))
        result["seconds"] = round(time.time() - started, 3)
        out[key] = result

    threads = [threading.Thread(target=one, args=item) for item in sorted(request.items())]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out


def resolve(hosts):
    """IPv4/IPv6 addresses each name resolves to on the node (an IP resolves to itself)."""
    out = {}
    for host in hosts:
        try:
            out[host] = sorted({info[4][0] for info in socket.getaddrinfo(host, None)})
        except (OSError, UnicodeError):
            out[host] = []
    return out


if "take_lock" not in globals():  # run as a file or imported (tests); nodes get one script
    try:
        from orchestrator.node.gather_lock import peek_lock, take_lock
    except ImportError:
        from gather_lock import peek_lock, take_lock  # type: ignore


SPACE_PATHS = ("/var/lib/sparkctl", "/etc/sparkctl", "/etc/netplan")


def space():
    """Free space and read-only flag where sparkctl writes (always answered: a full disk or a
    read-only filesystem must be named, not surface later as some other failure)."""
    out = {}
    for path in SPACE_PATHS:
        probe = path
        while probe and not os.path.exists(probe):
            probe = os.path.dirname(probe)
        try:
            st = os.statvfs(probe or "/")
        except OSError as exc:
            out[path] = {"error": str(exc)}
            continue
        out[path] = {"free_bytes": st.f_bavail * st.f_frsize, "checked": probe or "/",
                     "readonly": bool(st.f_flag & os.ST_RDONLY)}
    return out


def collectors(request):
    """(key, function) for every fact asked for; they run in parallel threads because most of
    the time is spent waiting on subprocesses (docker, ip, ibdev2netdev)."""
    timeout = request.get("timeout", 30)
    tasks = []
    simple = (
        ("netplan", lambda: netplan_files()),
        ("links", lambda: links()),
        ("ibdev2netdev", lambda: ibdev2netdev()),
        ("containers", lambda: {name: docker_inspect("container", name)
                                for name in request["containers"]}),
        ("images", lambda: {name: image(name) for name in request["images"]}),
        ("disk", lambda: disk(request["disk"])),
        ("routes", lambda: routes(request["routes"])),
        ("resolve", lambda: resolve(request["resolve"])),
        ("python", lambda: list(sys.version_info[:3])),
        ("users", lambda: {u: run(["id", u])["rc"] == 0 for u in request["users"]}),
        ("probes", lambda: probes(request["probes"])),
    )
    for key, function in simple:
        if request.get(key):
            tasks.append(((key,), function))
    for path, want in (request.get("files") or {}).items():
        tasks.append((("files", path), lambda path=path, want=want: file_fact(path, want)))
    gates = request.get("gates") or {}
    for key, command in (request.get("commands") or {}).items():
        if key in gates:
            tasks.append((("commands", key),
                          lambda command=command, gate=gates[key]: gated(command, gate, timeout)))
        else:
            tasks.append((("commands", key),
                          lambda command=command: run(command, timeout=timeout, shell=True)))
    return tasks


def run_all(tasks, workers=8):
    """Each task's answer, WORKERS at a time; a task that raised raises here, in order."""
    answers, pending, lock = {}, list(enumerate(tasks)), threading.Lock()

    def work():
        while True:
            with lock:
                if not pending:
                    return
                index, (_, function) = pending.pop(0)
            try:
                answers[index] = (True, function())
            except BaseException as exc:  # re-raised by the main thread, as a pool's result()
                answers[index] = (False, exc)

    threads = [threading.Thread(target=work) for _ in range(min(workers, len(tasks)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out = []
    for index, (key, _) in enumerate(tasks):
        ok, value = answers[index]
        if not ok:
            raise value
        out.append((key, value))
    return out


def run_batch(batch):
    """Each step's commands in order, as the steps would run them one by one: a failed command
    ends its step, and ends the batch unless the step keeps going (a failure it only reports);
    the steps after an end are answered as not run."""
    answers, going = [], True
    for item in batch:
        results = []
        for command in item["commands"] if going else []:
            started = time.time()
            result = run(command, timeout=item.get("timeout", 600), shell=True)
            result["seconds"] = time.time() - started
            results.append(result)
            if result["rc"] != 0:
                going = bool(item.get("keep_going"))
                break
        answers.append({"step": item["step"], "ran": bool(results) or not item["commands"],
                        "results": results})
    return answers


def main():
    request = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    facts = {"hostname": socket.gethostname(), "time": time.time(), "space": space()}
    if "lock" in request:
        facts["lock"] = take_lock(request["lock"], request.get("lock_stale_seconds", 7200))
    elif request.get("lock_peek"):
        facts["lock"] = peek_lock()
    for key, answer in run_all(collectors(request)):
        if len(key) == 1:
            facts[key[0]] = answer
        else:
            facts.setdefault(key[0], {})[key[1]] = answer
    if request.get("batch") and facts.get("lock", {"held": True}).get("held"):
        facts["batch"] = run_batch(request["batch"])
    json.dump(facts, sys.stdout)


main()
