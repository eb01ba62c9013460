"""Who listens on the TCP ports a server is about to bind on this node (runs on the node as
`python3 -c`, as root; one JSON argument: {"ports": [port, ...], "cluster": name}).

A launch used to find a taken port only once the model had loaded (minutes on a Spark), and on
another node's step. Preflight asks here first. A listener belongs to sparkctl when its process
shares the PID namespace of a running container labelled sparkctl.managed=true for this
cluster (a server about to be kept, restarted or replaced: the launch's own steps judge it);
anything else is in the way. `docker exec`'d processes (vllm serve, mpirun) are not children
of the container's first process, hence the namespace and not the parent chain.

Prints {"ports": {"<port>": [{"pid", "process", "address", "ours", "container"}]}} with only
the wanted ports that something listens on, or {"error": why}. Standard library only.
"""
import json
import os
import re
import subprocess
import sys

a = json.loads(sys.argv[1])
WANTED = set(int(p) for p in a["ports"])
USERS = re.compile(r'\("([^"]*)",pid=(\d+),')


def listeners():
    """[(port, address, [(process, pid)])] from `ss -Hltnp` (every listening TCP socket)."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        address, _, port = fields[3].rpartition(":")
        if port.isdigit() and int(port) in WANTED:
            found.append((int(port), address, [(m.group(1), int(m.group(2)))
                                               for m in USERS.finditer(line)]))
    return found


def pid_namespace(pid):
    try:
        return os.readlink("/proc/%d/ns/pid" % pid)
    except OSError:
        return None


def managed_namespaces():
    """{PID namespace: (container name, its server's name or "")} of this cluster's running
    sparkctl containers (a named server's containers carry the label sparkctl.server)."""
    ids = subprocess.run(["docker", "ps", "-q", "--filter", "label=sparkctl.managed=true",
                          "--filter", "label=sparkctl.cluster=" + a["cluster"]],
                         capture_output=True, text=True).stdout.split()
    if not ids:
        return {}
    out = subprocess.run(["docker", "inspect", "-f",
                          '{{.Name}} {{.State.Pid}} {{index .Config.Labels "sparkctl.server"}}',
                          *ids], capture_output=True, text=True).stdout
    spaces = {}
    for line in out.splitlines():
        name, pid, server = [*line.strip().lstrip("/").split(" "), "", ""][:3]
        space = pid_namespace(int(pid)) if pid.isdigit() and int(pid) > 0 else None
        if space and space != pid_namespace(os.getpid()):  # (a --pid host container: unknown)
            spaces[space] = (name, server)
    return spaces


def main():
    try:
        found = listeners()
    except (OSError, subprocess.CalledProcessError) as exc:
        print(json.dumps({"error": "cannot list listening sockets (ss -Hltnp): %s" % exc}))
        return
    spaces = managed_namespaces() if found else {}
    ports = {}
    for port, address, users in found:
        for process, pid in users or [("?", 0)]:
            container, server = spaces.get(pid_namespace(pid), (None, None)) if pid else (None, None)
            ports.setdefault(str(port), []).append({
                "pid": pid, "process": process, "address": address,
                "ours": container is not None, "container": container, "server": server or None})
    print(json.dumps({"ports": ports}))


main()
