"""The RoCE device behind each fabric interface as RDMA sees it (runs on a node as `python3 -c`;
argument: JSON {"interfaces": [names], "sysfs": "/sys/class/infiniband"}): which device
(`ibdev2netdev`), its port's state and active MTU from
`ibv_devinfo -d DEV`, and its GID table: from sysfs (ports/1/gids/N with gid_attrs/types/N
and gid_attrs/ndevs/N, as the kernel fills them) when the device is there, else from
`show_gids DEV` (mlx5's tool prints the same table). netcheck judges the answer
(netcheck/roce.py). Reads only; standard library; Python 3.8+.
"""
import ipaddress
import json
import os
import re
import subprocess
import sys

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def run(argv):
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=20)
    except OSError as exc:
        return 127, "", str(exc)
    except subprocess.TimeoutExpired:
        return 124, "", " ".join(argv) + " timed out"
    return done.returncode, done.stdout, done.stderr


def devinfo(device):
    """{"state", "active_mtu"} of port 1, or {"error"}."""
    rc, out, err = run(["ibv_devinfo", "-d", device])
    if rc != 0:
        return {"error": (err or out).strip()[-300:] or "ibv_devinfo exited %d" % rc}
    state = re.search(r"^\s*state:\s*(\S+)", out, re.M)
    mtu = re.search(r"^\s*active_mtu:\s*(\d+)", out, re.M)
    if mtu is None:
        return {"error": "ibv_devinfo -d %s printed no active_mtu" % device}
    return {"state": state.group(1) if state else "?", "active_mtu": int(mtu.group(1))}


def ipv4_of(gid):
    """The IPv4 address an IPv4-mapped GID (::ffff:a.b.c.d) carries, else ""."""
    try:
        mapped = ipaddress.IPv6Address(gid).ipv4_mapped
    except ValueError:
        return ""
    return str(mapped) if mapped else ""


def read(path):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:  # an unused GID slot reads as EINVAL
        return ""


def sysfs_gids(root, device):
    port = os.path.join(root, device, "ports", "1")
    names = os.listdir(os.path.join(port, "gids"))
    table = []
    for name in sorted(names, key=lambda n: int(n) if n.isdigit() else -1):
        gid = read(os.path.join(port, "gids", name))
        if not gid or gid == ZERO_GID:
            continue
        kind = read(os.path.join(port, "gid_attrs", "types", name))
        table.append({"index": int(name), "gid": gid, "ipv4": ipv4_of(gid),
                      "version": "v2" if "v2" in kind else "v1",
                      "ndev": read(os.path.join(port, "gid_attrs", "ndevs", name))})
    return table


def show_gids(device):
    rc, out, err = run(["show_gids", device])
    if rc != 0:
        raise OSError((err or out).strip()[-300:] or "show_gids exited %d" % rc)
    table = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 5 or fields[0] != device or not fields[2].isdigit():
            continue
        version = next((f for f in fields[4:] if f in ("v1", "v2")), "v1")
        table.append({"index": int(fields[2]), "gid": fields[3], "ipv4": ipv4_of(fields[3]),
                      "version": version, "ndev": fields[-1]})
    return table


def devices():
    """{interface: RoCE device} from `ibdev2netdev` ("rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)")."""
    rc, out, err = run(["ibdev2netdev"])
    if rc != 0:
        raise OSError((err or out).strip()[-300:] or "ibdev2netdev exited %d" % rc)
    found = {}
    for line in out.splitlines():
        match = re.match(r"^\s*(\S+)\s+port\s+\d+\s+==>\s+(\S+)", line)
        if match:
            found[match.group(2)] = match.group(1)
    return found


def main():
    args = json.loads(sys.argv[1])
    root = args.get("sysfs") or "/sys/class/infiniband"
    try:
        by_interface = devices()
    except OSError as exc:
        print(json.dumps({"error": "no RDMA devices: %s" % exc}))
        return
    out = {}
    for interface in args.get("interfaces") or []:
        device = by_interface.get(interface)
        if device is None:
            out[interface] = {"error": "ibdev2netdev lists no RoCE device for %s" % interface}
            continue
        entry = devinfo(device)
        entry["device"] = device
        try:
            if os.path.isdir(os.path.join(root, device)):
                entry["gids"], entry["source"] = sysfs_gids(root, device), "sysfs"
            else:
                entry["gids"], entry["source"] = show_gids(device), "show_gids"
        except OSError as exc:
            entry["gid_error"] = str(exc)[-300:]
        out[interface] = entry
    print(json.dumps({"interfaces": out}, sort_keys=True))


main()
