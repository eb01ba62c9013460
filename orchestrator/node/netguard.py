"""sparkctl netplan rollback guard (node side; runs as root; Python 3.8+, standard library only).

Sent by sparkctl on stdin, never on a command line. Modes (argv[1], JSON config in argv[2]):
  arm      save the pre-apply state, start the detached guard, then run `netplan apply`
  guard    (detached, own session) wait for a confirmation; without one by the deadline, or
           when asked to abort, restore the previous netplan file and apply it again
  confirm  ping every fabric peer; all answer -> confirm; otherwise roll back now
Whoever creates the `decided` directory first (mkdir is atomic) wins: the confirmation or the
rollback, never both.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time

BASE = "/var/lib/sparkctl"
STATE = os.path.join(BASE, "netguard")
NETPLAN_FILE = "/etc/netplan/40-sparkctl-fabric.yaml"
BACKUP = os.path.join(BASE, "netplan-backup.yaml")
ABSENT = os.path.join(BASE, "netplan-backup.absent")
ROLLED_BACK = os.path.join(BASE, "netplan-rolled-back.json")
CONFIRMED_SHA = os.path.join(BASE, "netplan-confirmed.sha256")
LEDGER = os.path.join(BASE, "ledger.json")
# keep the node's own PATH order (site overrides in /usr/local first); only make sure sbin is there
os.environ["PATH"] = os.environ.get("PATH", "/usr/bin:/bin") + ":/usr/local/sbin:/usr/sbin:/sbin"


def path(name):
    return os.path.join(STATE, name)


def write_json(target, data):
    tmp = target + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(data, handle)
    os.rename(tmp, target)


def read_json(target):
    try:
        with open(target) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def run(argv, timeout=120):
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, "", str(exc)
    return proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")


def decide():
    try:
        os.mkdir(path("decided"))
        return True
    except FileExistsError:
        return False


def remove(target):
    if os.path.isdir(target):
        shutil.rmtree(target, ignore_errors=True)
    elif os.path.lexists(target):
        os.unlink(target)


def guard_alive():
    """The guard we started, by its recorded PID (checked against its command line)."""
    try:
        with open(path("guard.pid")) as handle:
            pid = int(handle.read().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read()
    except (OSError, ValueError):
        return None
    return pid if b"netguard.py" in cmdline and b"guard" in cmdline else None


def sha_of(target):
    try:
        with open(target, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return None


def ledger_entry():
    """What sparkctl's ledger (orchestrator/node/ledger.py) says it wrote at NETPLAN_FILE."""
    ledger = read_json(LEDGER) or {}
    return ledger, ledger.get(NETPLAN_FILE)


def set_ledger_sha(ledger, sha):
    entry = ledger.get(NETPLAN_FILE)
    if sha is None:
        ledger.pop(NETPLAN_FILE, None)
    elif entry is not None:
        entry["sha256"] = sha
    write_json(LEDGER, ledger)


def rollback(cfg, reason):
    ledger, entry = ledger_entry()
    current = sha_of(NETPLAN_FILE)
    if current is not None and (entry is None or entry.get("sha256") != current):
        # never touch a file sparkctl did not write (a user's edit since, or a stale marker)
        restored = (f"left alone: {NETPLAN_FILE} is not the file sparkctl wrote "
                    "(changed since); nothing restored")
    elif os.path.exists(ABSENT):
        remove(NETPLAN_FILE)
        set_ledger_sha(ledger, None)
        restored = "removed the sparkctl netplan file (there was none before)"
    elif os.path.exists(BACKUP):
        tmp = NETPLAN_FILE + ".sparkctl-tmp"
        shutil.copyfile(BACKUP, tmp)
        os.chmod(tmp, 0o600)
        os.rename(tmp, NETPLAN_FILE)
        set_ledger_sha(ledger, sha_of(NETPLAN_FILE))
        restored = "restored the previous netplan file"
    else:
        restored = "no backup to restore"
    rc, _, err = run(["netplan", "apply"])
    for iface, address in cfg.get("added", []):
        run(["ip", "addr", "del", address, "dev", iface])
    for iface, mtu in sorted(cfg.get("previous_mtu", {}).items()):
        if mtu:
            run(["ip", "link", "set", "dev", iface, "mtu", str(mtu)])
    result = {"reason": reason, "time": time.time(), "restored": restored,
              "apply_rc": rc, "apply_err": err[-500:]}
    write_json(ROLLED_BACK, result)
    write_json(path("result.json"), result)
    return result


def guard():
    cfg = read_json(path("armed.json")) or {}
    with open(path("guard.pid"), "w") as handle:
        handle.write(f"{os.getpid()}\n")
    open(path("ready"), "w").close()
    deadline = time.time() + float(cfg.get("seconds", 60))
    while True:
        if os.path.exists(path("confirmed")):
            return 0
        reason = None
        if os.path.exists(path("abort")):
            with open(path("abort")) as handle:
                reason = handle.read().strip() or "rollback requested"
        elif time.time() >= deadline:
            reason = (f"no confirmation from the controller within {cfg.get('seconds', 60)}s "
                      "(connection lost or sparkctl stopped)")
        if reason:
            if decide():
                rollback(cfg, reason)
            return 0
        time.sleep(0.2)


def stop_old_guard():
    pid = guard_alive()
    if pid is not None:
        os.kill(pid, 15)
        for _ in range(50):
            if guard_alive() is None:
                break
            time.sleep(0.1)


def arm(cfg):
    stop_old_guard()
    os.makedirs(STATE, mode=0o700, exist_ok=True)
    for name in ("decided", "confirmed", "abort", "result.json", "ready", "guard.pid"):
        remove(path(name))
    write_json(path("armed.json"), cfg)
    with open(path("guard.log"), "ab") as log:
        subprocess.Popen([sys.executable, os.path.abspath(__file__), "guard"], stdin=subprocess.DEVNULL,
                         stdout=log, stderr=log, start_new_session=True, close_fds=True)
    for _ in range(100):
        if os.path.exists(path("ready")):
            break
        time.sleep(0.05)
    else:
        print(json.dumps({"applied": False, "error": "the rollback guard did not start"}))
        return 1
    rc, out, err = run(["netplan", "apply"])
    if rc != 0:
        lines = (err or out).strip().splitlines()  # the last line says why; tracebacks don't
        result = abort(f"netplan apply failed (exit {rc}): {lines[-1] if lines else 'no output'}")
        print(json.dumps({"applied": False, "error": f"netplan apply exited {rc}",
                          "rollback": result}))
        return 1
    print(json.dumps({"applied": True, "seconds": cfg.get("seconds")}))
    return 0


def abort(reason, wait=60.0):
    """Have the guard roll back now (or do it here if the guard is gone); return its result."""
    with open(path("abort.tmp"), "w") as handle:
        handle.write(reason)
    os.rename(path("abort.tmp"), path("abort"))
    if guard_alive() is None and decide():
        return rollback(read_json(path("armed.json")) or {}, reason)
    deadline = time.time() + wait
    while time.time() < deadline:
        result = read_json(path("result.json"))
        if result is not None:
            return result
        if guard_alive() is None and not os.path.exists(path("result.json")):
            break
        time.sleep(0.2)
    return read_json(path("result.json")) or {"reason": reason, "restored": "unknown (guard gone)"}


def ping_until(check, seconds, failures):
    deadline = time.time() + seconds
    while True:
        rc, _, _ = run(["ping", "-c1", "-W1", "-I", check["interface"], check["address"]], timeout=5)
        if rc == 0:
            return
        if time.time() >= deadline:
            failures.append(check)
            return
        time.sleep(0.3)


def confirm(cfg):
    failures = []
    threads = [threading.Thread(target=ping_until, args=(c, float(cfg.get("seconds", 20)), failures))
               for c in cfg.get("checks", [])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if not failures:
        if decide():
            open(path("confirmed"), "w").close()
            with open(CONFIRMED_SHA, "w") as handle:
                handle.write(cfg.get("sha", "") + "\n")
            remove(ROLLED_BACK)
            print(json.dumps({"outcome": "confirmed"}))
            return 0
        result = read_json(path("result.json"))
        print(json.dumps({"outcome": "late", "rollback": result}))
        return 1
    reason = "; ".join(f"{c['peer']} unreachable at {c['address']} on {c['interface']}"
                       for c in failures)
    result = abort(reason)
    print(json.dumps({"outcome": "rolled-back", "failures": failures, "rollback": result}))
    return 1


def main():
    mode = sys.argv[1]
    cfg = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    os.makedirs(STATE, mode=0o700, exist_ok=True)
    if mode == "arm":
        return arm(cfg)
    if mode == "guard":
        return guard()
    if mode == "confirm":
        return confirm(cfg)
    if mode == "abort":
        print(json.dumps({"outcome": "rolled-back", "rollback": abort(cfg.get("reason", "aborted"))}))
        return 0
    print(f"unknown mode {mode!r}", file=sys.stderr)
    return 2


sys.exit(main())
