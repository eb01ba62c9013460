"""Bring a persistent server back after a reboot (node side; runs as root from the systemd unit
sparkctl-serve-<server>.service; Python 3.8+, standard library only).

Usage: python3 sparkctl-boot.py /etc/sparkctl/boot/<server>.json

Does on this node what `sparkctl launch` did, with the same checks, in order (the plan is
written by orchestrator/phases/persist.py): what comes first (a port guard) -> already
serving? -> fabric up with its address -> containers running (`docker start` when docker's
restart policy did not) -> models present ->
memory (MemAvailable >= what the recipe loads here + the guard's margin) -> wait for the peers
(the head only: head last) -> the start commands -> this node's part answers. Every line goes
to stdout (the journal) and to the plan's log file, and the last one says what was achieved
(only the first node can see the server answer). With "watch" in the plan it then stays
(watch()): a node that reboots alone must not leave the server stalled. Without it: exit 0
when the part is up, 1 when a check fails or the deadline passes (the line before says which).

A server of several nodes whose first node keeps answering /health after losing a rank (vLLM's
own multi-node) has "ranks" in its plan: a command that lists the TCP connections the server's
processes hold to each peer (node/rank_links.py). The watcher keeps the set seen while the
server answered; connections to a peer gone mean its rank died (said once, and the server is
left alone while nothing comes back: a rank cannot rejoin a running rank 0), new connections
from it mean the rank came back: the server is restarted at once, whatever /health says.
"""

import json
import os
import subprocess
import sys
import time
import urllib.request

BOOT_TIME = "@SPARKCTL_BOOT_TIME@"  # in a start command: the time the server starts
WATCH_SECONDS = 10
MISSES = 3  # checks without an answer before the first node restarts its part
PLAN = {}  # type: dict
LOG = None


def say(text):
    line = "%s %s" % (time.strftime("%Y-%m-%d %H:%M:%S"), text)
    print(line, flush=True)
    if LOG is not None:
        LOG.write(line + "\n")
        LOG.flush()


class Failed(Exception):
    """A check failed or a deadline passed (the line before says which)."""


def fail(text):
    say("FAILED: " + text)
    raise Failed(text)


def sh(cmd, timeout=120):
    try:
        done = subprocess.run(["sh", "-c", cmd], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, "timed out after %ds" % timeout
    return done.returncode, (done.stdout + done.stderr).strip()


def health_host(port):
    """Where the server answers: the address its record says it binds (`launch --host`; a
    wildcard answers on loopback). /health is open with an API key on every engine."""
    run = os.path.dirname(PLAN.get("guard_record") or "/var/lib/sparkctl/run/x")
    for path in (os.path.join(run, "servers", str(PLAN.get("server")), "server.json"),):
        try:
            with open(path) as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and int(record.get("port") or 0) == int(port):
            host = record.get("host") or "127.0.0.1"
            return "127.0.0.1" if host in ("0.0.0.0", "::", "localhost") else host
    return "127.0.0.1"


def health(port):
    try:
        url = "http://%s:%d/health" % (health_host(port), port)
        with urllib.request.urlopen(url, timeout=5) as r:
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


def run_first(plan):
    """What must hold before anything of the server serves here (a port guard: firewall rules
    do not survive a reboot, the containers' restart policy does): every boot, idempotent."""
    for item in plan.get("first") or []:
        rc, out = sh(item["cmd"], timeout=120)
        if rc != 0:
            fail("%s: exit %d: %s" % (item["what"], rc, out[-600:]))
        say("in place: %s" % item["what"])


def bring_up(plan, deadline):
    """This node's part of the server, checked and started as `launch` did."""
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
    say(achieved(plan))


def achieved(plan):
    """What is up, in exact words: only the first node can see the server answer."""
    if plan.get("health_port"):
        return "up: server %s answers on 127.0.0.1:%d" % (plan["server"], plan["health_port"])
    held = [c["what"] for c in plan["ready"]] or ["containers running: " + ", ".join(plan["containers"])]
    return ("up: this node's part of server %s (%s); whether the server answers is for %s to "
            "say (its boot log, `sparkctl status`)" % (plan["server"], "; ".join(held),
                                                        plan["nodes"][0]))


def stopped_by_guard(plan):
    path = plan.get("guard_record")
    return bool(path) and os.path.exists(path)


class Ranks:
    """The connections to each peer rank, judged against those seen while the server served."""

    def __init__(self, plan):
        self.cmd = (plan.get("ranks") or {}).get("cmd")
        self.seen = {}  # peer -> the connections its rank held
        self.said = None

    def current(self):
        rc, out = sh(self.cmd, timeout=60)
        try:
            peers = json.loads(out.splitlines()[-1]).get("peers") if rc == 0 else None
        except (ValueError, IndexError, AttributeError):
            peers = None
        return {p: set(c) for p, c in peers.items()} if isinstance(peers, dict) else None

    def judge(self):
        """None: every rank holds its connections (or it cannot tell); else ("lost" | "back",
        what), "back" when a lost rank's node connects again."""
        if not self.cmd:
            return None
        now = self.current()
        if now is None:
            return None
        lost, back = [], []
        for peer, held in sorted(now.items()):
            before = self.seen.get(peer)
            if not before:  # the first look while the server answers (or it had none yet)
                self.seen[peer] = held
                if held:
                    continue
            elif before <= held:
                continue
            (back if held - before else lost).append(peer)
        if back:
            return "back", ("the rank on %s came back (new connections from it): the server "
                            "lost its rank there and cannot take it back" % ", ".join(back))
        if lost:
            return "lost", ("the rank on %s is gone (its connections to this node closed); "
                            "/health may still answer 200, but the server cannot serve: waiting "
                            "for the rank to come back" % ", ".join(lost))
        return None

    def reset(self):
        self.seen, self.said = {}, None


def restart(plan):
    for item in plan.get("restart") or []:
        rc, out = sh(item["cmd"], timeout=120)
        say("%s: %s" % (item["what"], "ok" if rc == 0 else "exit %d: %s" % (rc, out[-300:])))
    bring_up(plan, time.monotonic() + plan["deadline_seconds"])


def watch(plan, every=WATCH_SECONDS):
    """Stay, because a node can reboot alone: a peer that comes back finds the first node's
    server stalled (a Ray worker or a rank gone for good), and nothing else restarts it. The
    first node restarts its part after MISSES checks without an answer (unless the memory guard
    stopped the server); every node starts its containers again if one stopped."""
    ranks = Ranks(plan)
    say("watching: %s every %ds" % ("the server's answer" + (" and its ranks" if ranks.cmd else "")
                                     if plan.get("health_port") else "this node's containers",
                                     every))
    misses, pause = 0, 0
    while True:
        time.sleep(every)
        if not plan.get("health_port"):
            if not all(container_running(n) for n in plan["containers"]):
                say("a container of this node's part stopped: starting it again")
                ensure_containers(plan["containers"])
            continue
        if ready(plan):
            if misses >= MISSES:
                say("server %s answers again" % plan["server"])
            misses, pause = 0, 0
            verdict = ranks.judge()
            if verdict is None or verdict[0] == "lost":
                if verdict is not None and ranks.said != verdict[1]:
                    say("server %s: %s" % (plan["server"], verdict[1]))
                ranks.said = verdict and verdict[1]
                continue
            say("server %s: %s: restarting this node's part" % (plan["server"], verdict[1]))
            ranks.reset()
            try:
                restart(plan)
            except Failed:
                pause, misses = 6, MISSES
            continue
        misses += 1
        if misses < MISSES or (misses - MISSES) < pause:
            continue
        if stopped_by_guard(plan):
            say("server %s stopped by the memory guard (%s): not restarted; stopped watching"
                % (plan["server"], plan["guard_record"]))
            return 0
        say("server %s has not answered for %d checks (%ds): restarting this node's part"
            % (plan["server"], misses, misses * every))
        ranks.reset()
        try:
            restart(plan)
            misses, pause = 0, 0
        except Failed:
            pause = min(max(2 * pause, 6), 60)  # checks before the next try: 1 min, 2, ... 10
            misses = MISSES


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
    code = 0
    try:
        run_first(plan)
    except Failed:
        return 1  # nothing brought up, nothing watched: the part's own command says what it did
    marker = plan.get("launch_marker")
    if marker and os.path.exists(marker):  # in /run: gone after a reboot
        os.remove(marker)
        say("started by `sparkctl launch`, which started the server: nothing to bring up")
    elif plan.get("health_port") and health(plan["health_port"]) == 200:
        say("already serving on 127.0.0.1:%d; nothing to do" % plan["health_port"])
    else:
        try:
            bring_up(plan, deadline)
        except Failed:
            code = 1
    if plan.get("watch"):
        return watch(plan)
    return code


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: sparkctl-boot.py /etc/sparkctl/boot/SERVER.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
