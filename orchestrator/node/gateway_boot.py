"""The gateway back after a reboot (node side; Python 3.8+, standard library only).

Two modes:
- `python3 -c <this> install` (from `gateway up` and when a replica joins; stdin: JSON
  {"files": [[path, mode, text], ...], "unit": name}): writes the files that changed (atomic
  rename) and enables the unit (`systemctl daemon-reload` first when a file changed). Prints
  "installed" or "unchanged".
- `python3 <this file> <plan.json>` (ExecStart of sparkctl-gateway.service, at boot; the plan:
  {"run": the gateway's run folder, "config": router.json, "tree": the unpacked router,
  "relay": relay.py, "router": the router's launcher, "address_wait": seconds}):
  1. every relay whose arguments `gateway up` left in <run>/relay-<server>.args and that does
     not run: started again, once its listen address (the fabric) is on the node;
  2. the router, when this node holds the gateway (its config and record) and it does not run.
  The state is what `gateway up` and the gateway's followers keep current; `gateway down`
  removes it with the unit, so nothing comes back after a down.
Every process starts detached, exactly as `gateway up` starts it (same launcher, same files).
"""
import glob
import json
import os
import socket
import subprocess
import sys
import time

RELAY_MARK = b"/run/gateway/relay-"
ROUTER_MARK = b"/run/gateway/router.pid"


def say(text):
    print("%s sparkctl-gateway: %s" % (time.strftime("%Y-%m-%d %H:%M:%S"), text), flush=True)


def install():
    request = json.load(sys.stdin)
    changed = False
    for path, mode, text in request["files"]:
        try:
            with open(path) as handle:
                same = handle.read() == text and (os.stat(path).st_mode & 0o777) == mode
        except OSError:
            same = False
        if same:
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path + ".new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        os.fchmod(fd, mode)  # the mode before the text lands
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(path + ".new", path)
        changed = True
    if changed:
        subprocess.run(["systemctl", "daemon-reload"], check=False)
    done = subprocess.run(["systemctl", "enable", request["unit"]], capture_output=True, text=True)
    if done.returncode != 0:
        print("systemctl enable %s: %s" % (request["unit"], (done.stdout + done.stderr).strip()),
              file=sys.stderr)
        sys.exit(1)
    print("installed" if changed else "unchanged")


def running(pidfile, mark):
    """The pid file's process still runs and is ours (after a reboot the number may be
    another process's)."""
    try:
        with open(pidfile) as handle:
            pid = int(handle.read().strip())
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return mark in handle.read()
    except (OSError, ValueError):
        return False


def address_present(address, seconds):
    """Until ADDRESS can be bound here (networkd puts the fabric's address up at boot)."""
    deadline = time.monotonic() + seconds
    while True:
        probe = socket.socket()
        try:
            probe.bind((address, 0))
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(1)
        finally:
            probe.close()


def start(argv, log):
    with open(log, "ab") as out:
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                         start_new_session=True)


def boot(plan_path):
    with open(plan_path) as handle:
        plan = json.load(handle)
    run = plan["run"]
    for path in sorted(glob.glob(os.path.join(run, "relay-*.args"))):
        server = os.path.basename(path)[len("relay-"):-len(".args")]
        try:
            with open(path) as handle:
                args = json.load(handle)
        except (OSError, ValueError) as exc:
            say("relay %s: unreadable %s (%s): not started" % (server, path, exc))
            continue
        if running(args["pidfile"], RELAY_MARK):
            say("relay %s runs" % server)
            continue
        if not address_present(args["listen"], plan["address_wait"]):
            say("relay %s: %s is not on this node after %ds: not started"
                % (server, args["listen"], plan["address_wait"]))
            continue
        for stale in (args["state"], args["pidfile"]):
            if os.path.exists(stale):
                os.unlink(stale)
        start(["python3", plan["relay"], json.dumps(args, sort_keys=True)],
              os.path.join(run, "relay-%s.log" % server))
        say("relay %s started on %s:%s" % (server, args["listen"], args["port"]))
    pidfile = os.path.join(run, "router.pid")
    if not (os.path.exists(plan["config"]) and os.path.exists(os.path.join(run, "gateway.json"))):
        say("no gateway on this node")
    elif running(pidfile, ROUTER_MARK):
        say("router runs")
    else:
        if os.path.exists(pidfile):
            os.unlink(pidfile)
        args = {"config": plan["config"], "tree": plan["tree"], "module": plan["module"],
                "pidfile": pidfile}
        start(["python3", plan["router"], json.dumps(args, sort_keys=True)],
              os.path.join(run, "router.log"))
        say("router started (log: %s)" % os.path.join(run, "router.log"))


if __name__ == "__main__":
    if sys.argv[1:] == ["install"]:
        install()
    else:
        boot(sys.argv[1])
