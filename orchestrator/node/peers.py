"""Which machines answer on each fabric interface (runs on a node as `python3 -`; argument: JSON
{"interfaces": [names]}). `sparkctl init` reads the cabling from it: a cable joins two ports, a
switch joins one port of every node, a ring joins each node's two ports to two neighbours.

The probe changes nothing on the node. On every interface that is up it pings the IPv6
all-nodes group (ff02::1) through the interface's link-local address, which the kernel gives
every up interface with no configuration (so it works before any fabric address exists), then
reads the neighbour table of that interface: the MAC address of every machine that answered.
Its own MACs let the controller say whose those are. Standard library only; Python 3.8+.
"""
import contextlib
import json
import subprocess
import sys
import time

PING_SECONDS = 3
# ping refuses multicast at intervals under 1 s to users other than root
PING = ["ping", "-6", "-n", "-q", "-c", "2", "-i", "1", "-w", str(PING_SECONDS)]


def run(argv):
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, "", str(exc)
    return done.returncode, done.stdout, done.stderr


def links():
    """{name: {"mac", "up", "carrier"}} of every interface (`ip -j link`)."""
    rc, out, err = run(["ip", "-j", "link", "show"])
    if rc != 0:
        return {}, err.strip() or "ip -j link failed"
    found = {}
    for link in json.loads(out or "[]"):
        flags = link.get("flags") or []
        found[link.get("ifname")] = {"mac": (link.get("address") or "").lower(),
                                     "up": "UP" in flags,
                                     "carrier": "LOWER_UP" in flags and "NO-CARRIER" not in flags}
    return found, None


def settle(interfaces, seconds=5.0):
    """Wait (a few seconds at most) while a link-local address is still tentative: duplicate
    address detection runs right after a link comes up, and a tentative address sends nothing."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        rc, out, _ = run(["ip", "-j", "-6", "addr", "show", "scope", "link"])
        if rc != 0:
            return
        busy = [entry.get("ifname") for entry in json.loads(out or "[]")
                if entry.get("ifname") in interfaces
                and any(a.get("tentative") for a in entry.get("addr_info") or [])]
        if not busy:
            return
        time.sleep(0.2)


def ping_all(interfaces):
    """The all-nodes ping on every interface at once (so the probe takes one ping's time)."""
    pings = []
    for name in interfaces:
        with contextlib.suppress(OSError):
            pings.append(subprocess.Popen([*PING, "ff02::1%" + name], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
    for ping in pings:
        try:
            ping.wait(timeout=PING_SECONDS + 5)
        except subprocess.TimeoutExpired:
            ping.kill()
            ping.wait()


def neighbours(interface):
    """MACs that answered the all-nodes ping on INTERFACE, or why none could be asked."""
    rc, out, err = run(["ip", "-j", "-6", "neigh", "show", "dev", interface])
    if rc != 0:
        return [], err.strip() or "ip -6 neigh failed"
    macs = sorted({(entry.get("lladdr") or "").lower() for entry in json.loads(out or "[]")
                   if entry.get("lladdr") and str(entry.get("dst", "")).startswith("fe80:")
                   and "FAILED" not in (entry.get("state") or [])})
    return macs, None


def main():
    wanted = json.loads(sys.argv[1]).get("interfaces") or []
    table, error = links()
    out = {"macs": sorted({v["mac"] for v in table.values() if v["mac"]}), "interfaces": {},
           "error": error}
    live = [name for name in wanted if table.get(name, {}).get("up")
            and table.get(name, {}).get("carrier")]
    settle(live)
    ping_all(live)
    for name in wanted:
        link = table.get(name)
        if link is None:
            out["interfaces"][name] = {"present": False}
            continue
        entry = {"present": True, "up": link["up"], "carrier": link["carrier"], "mac": link["mac"],
                 "peers": []}
        if link["up"] and link["carrier"]:
            entry["peers"], entry["error"] = neighbours(name)
        out["interfaces"][name] = entry
    print(json.dumps(out, sort_keys=True))


main()
