"""Which machines answer on each fabric interface (runs on a node as `python3 -`; argument: JSON
{"interfaces": [names]}). `sparkctl init` reads the cabling from it: a cable joins two ports, a
switch joins one port of every node, a ring joins each node's two ports to two neighbours.

The probe changes nothing on the node. On every interface that is up it pings the IPv6
all-nodes group (ff02::1) through the interface's link-local address, which the kernel gives
every up interface with no configuration (so it works before any fabric address exists), then
reads the neighbour table of that interface: the MAC address of every machine that answered.
Its own MACs let the controller say whose those are. Standard library only; Python 3.8+.
"""
import json
import subprocess
import sys

PING_SECONDS = "2"


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


def neighbours(interface):
    """MACs that answered the all-nodes ping on INTERFACE, or why none could be asked."""
    run(["ping", "-6", "-n", "-q", "-c", "3", "-i", "0.3", "-w", PING_SECONDS,
         "ff02::1%" + interface])
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
