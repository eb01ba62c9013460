"""Node-side facts gatherer: answers one JSON request with one JSON object, read-only.

Sent on stdin to `python3 - REQUEST_JSON` (as root through sudo), so a phase learns everything
it needs about a node in one round trip. Standard library only (python3-yaml is used when the
node has it, as every netplan node does). Keep it compatible with Python 3.8.
Only the `lock` request writes, and only under /var/lib/sparkctl; and a `batch`: the commands of
consecutive steps the executor sends in one round trip (core/batch.py), run in order after the
lock was taken (never when it was not), each step's outcome answered on its own.
"""

import hashlib
import json
import os
import socket
import subprocess
import sys
import time

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


def docker_inspect(kind, names):
    out = {}
    for name in names:
        argv = ["docker", "image", "inspect", name] if kind == "image" else ["docker", "inspect", name]
        result = run(argv)
        if result["rc"] == 0:
            try:
                out[name] = json.loads(result["out"])[0]
            except (ValueError, IndexError):
                out[name] = {"error": result["out"][-300:]}
        else:
            out[name] = None if "No such" in result["err"] else {"error": result["err"][-300:]}
    return out


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


def os_error(exc, where):
    """A write that failed (full disk, read-only filesystem), with the free space where it failed."""
    path = exc.filename or where
    probe = path
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    try:
        st = os.statvfs(probe or "/")
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = None
    return {"error": exc.strerror or str(exc), "errno": exc.errno, "path": path, "free_bytes": free}


LOCK_BASE = "/var/lib/sparkctl"


def _generation(base):
    """How many times the lock was taken on this head (0 before the first): a run that looked
    at the cluster without the lock takes it only if this did not move since (nobody changed
    anything in between)."""
    try:
        with open(os.path.join(base, "lock-generation")) as handle:
            return int(handle.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def peek_lock():
    """Who holds the lock, without taking it (a run that may change nothing needs no lock)."""
    lock = os.path.join(LOCK_BASE, "lock")
    answer = {"free": not os.path.isdir(lock), "generation": _generation(LOCK_BASE)}
    if not answer["free"]:
        try:
            with open(os.path.join(lock, "owner")) as handle:
                answer["holder"] = json.load(handle)
        except (OSError, ValueError):
            answer["holder"] = {}
        try:
            answer["age"] = time.time() - os.stat(lock).st_mtime
        except OSError:
            answer["age"] = 0
    return answer


def take_lock(owner, stale_seconds):
    """mkdir is atomic: the first run to create the directory holds the lock."""
    lock = os.path.join(LOCK_BASE, "lock")
    try:
        return _take_lock(LOCK_BASE, lock, owner, stale_seconds)
    except OSError as exc:
        return {"held": False, "error": os_error(exc, lock)}


def _take_lock(base, lock, owner, stale_seconds):
    os.makedirs(base, exist_ok=True)
    for _ in range(2):
        try:
            os.mkdir(lock, 0o700)
        except FileExistsError:
            try:
                with open(os.path.join(lock, "owner")) as handle:
                    holder = json.load(handle)
            except (OSError, ValueError):
                holder = {}
            age = time.time() - os.stat(lock).st_mtime
            if holder.get("token") == owner.get("token"):
                return {"held": True}
            # no owner: a run that could not write it (full disk) or died right after mkdir
            half_made = not holder.get("token") and age > 30
            if age > stale_seconds or owner.get("break") or half_made:
                subprocess.run(["rm", "-rf", lock])
                continue
            return {"held": False, "holder": holder, "age": age}
        generation = _generation(base)
        expected = owner.get("generation")
        if expected is not None and generation != expected:
            os.rmdir(lock)  # another run took it (and changed things) since this one looked
            return {"held": False, "moved": True, "generation": generation}
        try:
            with open(os.path.join(lock, "owner"), "w") as handle:
                json.dump(owner, handle)
                handle.flush()
                os.fsync(handle.fileno())
            with open(os.path.join(base, "lock-generation.new"), "w") as handle:
                handle.write(str(generation + 1))
            os.replace(os.path.join(base, "lock-generation.new"),
                       os.path.join(base, "lock-generation"))
        except OSError:
            subprocess.run(["rm", "-rf", lock])  # never leave a lock without its owner
            raise
        return {"held": True}
    return {"held": False, "holder": {}, "age": 0}


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
        ("containers", lambda: docker_inspect("container", request["containers"])),
        ("images", lambda: docker_inspect("image", request["images"])),
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
    for key, command in (request.get("commands") or {}).items():
        tasks.append((("commands", key), lambda command=command: run(command, timeout=timeout, shell=True)))
    return tasks


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
    from concurrent.futures import ThreadPoolExecutor

    request = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    facts = {"hostname": socket.gethostname(), "time": time.time(), "space": space()}
    if "lock" in request:
        facts["lock"] = take_lock(request["lock"], request.get("lock_stale_seconds", 7200))
    elif request.get("lock_peek"):
        facts["lock"] = peek_lock()
    tasks = collectors(request)
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = [(key, pool.submit(function)) for key, function in tasks]
    for key, future in results:
        if len(key) == 1:
            facts[key[0]] = future.result()
        else:
            facts.setdefault(key[0], {})[key[1]] = future.result()
    if request.get("batch") and facts.get("lock", {"held": True}).get("held"):
        facts["batch"] = run_batch(request["batch"])
    json.dump(facts, sys.stdout)


main()
