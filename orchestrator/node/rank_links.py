"""The TCP connections between a multi-node server's first node and each other rank (runs inside
the server's container on its first node as `python3 -c`; argument: JSON {"pid_file": the main
process's pid file, "peers": {node name: that node's fabric address}}). Standard library only.

Why: a rank of vLLM's own multi-node (mp) that dies takes its sockets with it, yet rank 0 keeps
answering /health 200 until the next request (the real vLLM 0.31.0, seen in the lab). What
rank 0's processes still hold to each peer says whether that rank is the one the server was
built with: the boot watcher (node/boot.py) keeps the set seen while the server answered, and a
set that lost connections means the rank died; new ones from that peer mean it came back.

Prints {"peers": {name: ["local-port>remote-ip:port", ...]}} (ESTABLISHED only), or
{"error": why} with exit 1 when the main process is not running.
"""
import json
import os
import socket
import sys

ESTABLISHED = "01"


def descendants(root):
    """ROOT and every process below it (from each process's parent in /proc/PID/stat)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        parents.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += parents.get(pid, [])
    return found


def socket_inodes(pids):
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir("/proc/%d/fd" % pid)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def address(hex_address):
    """(ip, port) of /proc/net/tcp{,6}'s "HEX:PORT"; an IPv4-mapped IPv6 address as IPv4."""
    ip_hex, port_hex = hex_address.split(":")
    raw = bytes.fromhex(ip_hex)
    # the kernel prints each 32-bit word in host (little-endian) order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 4:
        ip = socket.inet_ntop(socket.AF_INET, words)
    elif words[:12] == b"\0" * 10 + b"\xff\xff":
        ip = socket.inet_ntop(socket.AF_INET, words[12:])
    else:
        ip = socket.inet_ntop(socket.AF_INET6, words)
    return ip, int(port_hex, 16)


def connections(inodes):
    """(local port, remote ip, remote port) of every ESTABLISHED socket among INODES."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != ESTABLISHED or fields[9] not in inodes:
                continue
            local, remote = address(fields[1]), address(fields[2])
            out.append((local[1], remote[0], remote[1]))
    return out


def main(args):
    try:
        with open(args["pid_file"]) as handle:
            pid = int(handle.read().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError) as exc:
        print(json.dumps({"error": "no main process (%s): %s" % (args["pid_file"], exc)}))
        return 1
    found = connections(socket_inodes(descendants(pid)))
    peers = {name: sorted("%d>%s:%d" % c for c in found if c[1] == ip)
             for name, ip in args["peers"].items()}
    print(json.dumps({"peers": peers}))
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
