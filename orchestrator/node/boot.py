"""Bring a persistent server back after a reboot (node side; runs as root from the systemd unit
sparkctl-serve-<server>.service; Python 3.8+, standard library only).

Usage: python3 sparkctl-boot.py /etc/sparkctl/boot/<server>.json

Does on this node what `sparkctl launch` did, with the same checks, in order (the plan is
written by orchestrator/phases/persist.py): already serving? -> fabric up with its address ->
containers running (`docker start` when docker's restart policy did not) -> models present ->
memory (MemAvailable >= what the recipe loads here + the guard's margin) -> wait for the peers
(the head only: head last) -> the start commands -> this node's part answers. Every line goes
to stdout (the journal) and to the plan's log file. Exit 0 when the part is up, 1 when a check
fails or the deadline passes (the line before says which, with the figures).
"""

import json
import os
import subprocess
import sys
import time
import urllib.request

BOOT_TIME = "@SPARKCTL_BOOT_TIME@"  # in a start command: the time the server starts
PLAN = {}  # type: dict
LOG = None


def say(text):
    line = "%s %s" % (time.strftime("%Y-%m-%d %H:%M:%S"), text)
    print(line, flush=True)
    if LOG is not None:
        LOG.write(line + "\n")
        LOG.flush()


def fail(text):
    say("FAILED: " + text)
    sys.exit(1)


def sh(cmd, timeout=120):
    try:
        done = subprocess.run(["sh", "-c", cmd], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, "timed out after %ds" % timeout
    return done.returncode, (done.stdout + done.stderr).strip()


def health(port):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=5) as r:
            return r.status
    except Exception as exc:  # refused, 503 while loading, ...
        return getattr(exc, "code", 0) or 0


def until(deadline, what, test, every=1.0):
    """Poll test() until it holds; fail with `what` at the deadline."""
    while True:
        ok = test()
        if ok:
            return
        if time.monotonic() > deadline:
            fail("%s: not so within the deadline (%ds)" % (what, PLAN["deadline_seconds"]))
        time.sleep(every)


def link_has(interface, address):
    rc, out = sh("ip -j addr show dev %s" % interface, timeout=10)
    if rc != 0:
        return False
    try:
        link = json.loads(out)[0]
    except (ValueError, IndexError):
        return False
    flags = link.get("flags", [])
    up = "UP" in flags and "LOWER_UP" in flags
    have = [a.get("local") for a in link.get("addr_info", [])]
    return up and (not address or address in have)


def container_running(name):
    rc, out = sh("docker inspect -f '{{.State.Running}}' %s" % name, timeout=30)
    return rc == 0 and out.strip() == "true"


def ensure_containers(names):
    """Start what docker did not restart; True once every container runs."""
    every = True
    for name in names:
        if not container_running(name):
            rc, out = sh("docker start %s" % name, timeout=60)
            say("container %s was not running: docker start -> %s" % (
                name, "ok" if rc == 0 else "exit %d: %s" % (rc, out[-300:])))
            every = every and rc == 0 and container_running(name)
    return every


def mem_available_gb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024.0 / 1024.0
    return 0.0


def ready(plan):
    conditions = [sh(c["cmd"], timeout=60)[0] == 0 for c in plan["ready"]]
    port = plan.get("health_port")
    return all(conditions) and (port is None or health(port) == 200)


def main(path):
    global PLAN, LOG
    with open(path) as f:
        PLAN = json.load(f)
    plan = PLAN
    os.makedirs(os.path.dirname(plan["log"]), mode=0o755, exist_ok=True)
    LOG = open(plan["log"], "a")  # noqa: SIM115 - for the whole run
    deadline = time.monotonic() + plan["deadline_seconds"]
    say("boot of server %s (%s) on %s, %s of %s" % (
        plan["server"], plan["engine"], plan["node"], plan["role"], ", ".join(plan["nodes"])))
    if plan.get("health_port") and health(plan["health_port"]) == 200:
        say("already serving on 127.0.0.1:%d; nothing to do" % plan["health_port"])
        return 0
    for link in plan["fabric"]:
        until(deadline, "fabric %s up with %s" % (link["interface"], link["address"]),
              lambda link=link: link_has(link["interface"], link["address"]))
        say("fabric: %s up with %s" % (link["interface"], link["address"]))
    until(deadline, "containers %s running" % ", ".join(plan["containers"]),
          lambda: ensure_containers(plan["containers"]), every=2.0)
    say("containers running: %s" % ", ".join(plan["containers"]))
    missing = [d for d in plan["models"] if not os.path.isdir(d) or not os.listdir(d)]
    if missing:
        fail("models missing on this node: %s (`sparkctl launch` fetches them)" % ", ".join(missing))
    say("models present: %s" % ", ".join(plan["models"]))
    memory = plan["memory"]
    if memory is None:
        say("memory: not checked here (this node's server came back with its container)")
    else:
        available = mem_available_gb()
        need = memory["loaded_gb"] + memory["guard_gb"]
        if available < need:
            fail("memory: MemAvailable %.1f GB < %.1f GB (the recipe loads %.1f GB here and the "
                 "memory guard keeps %.1f GB)"
                 % (available, need, memory["loaded_gb"], memory["guard_gb"]))
        say("memory: MemAvailable %.1f GB >= %.1f GB needed" % (available, need))
    for item in plan["wait"]:
        until(deadline, item["what"], lambda item=item: sh(item["cmd"], timeout=60)[0] == 0,
              every=2.0)
        say("ready: %s" % item["what"])
    now = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    for item in plan["start"]:
        rc, out = sh(item["cmd"].replace(BOOT_TIME, now), timeout=120)
        if rc != 0:
            fail("%s: exit %d: %s" % (item["what"], rc, out[-600:]))
        say("started: %s" % item["what"])

    def part_up():
        ensure_containers(plan["containers"])
        return ready(plan)

    until(deadline, "server %s answering here" % plan["server"], part_up, every=2.0)
    say("up: server %s%s" % (plan["server"], " answers on 127.0.0.1:%d" % plan["health_port"]
                             if plan.get("health_port") else " (this node's part)"))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: sparkctl-boot.py /etc/sparkctl/boot/SERVER.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
