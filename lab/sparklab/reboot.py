"""`sparkctl lab reboot`: a node restarted with its disk state kept, as a power cycle would.

What a reboot loses: every process of the node (its unshare parent is SIGKILLed by recorded PID,
which ends its PID namespace: sshd, containers, engines, Ray, guards), its tmpfs state (/run is
a new tmpfs), /tmp (emptied, as Ubuntu's tmpfiles does at boot), the addresses and MTU the
running system gave its fabric interfaces (flushed, MTU 1500: a NIC comes up unconfigured).
What it keeps: the node's disk (the /etc, /var, /opt, /home overlays' upper dirs, the docker
runtime's containers and images, the memory cgroup's limit). Then the node boots: the init
(node.py), PID 1 starts sshd, then the systemctl shim's boot: netplan's config re-applied by
networkd, containers whose restart policy says so, enabled units (docs/lab.md).
"""

from __future__ import annotations

import shutil
import subprocess
import time

from sparklab.identity import ALL_FABRIC_INTERFACES, LabError, LabIdentity
from sparklab.node import kill_node, start_node, wait_ready


def reboot(ident: LabIdentity, nodes: list[str], state: dict) -> list[str]:
    """Reboot `nodes` (all of them at once, like a power cut of those nodes); one line each."""
    known = {n["name"]: n for n in state.get("nodes", [])}
    unknown = [n for n in nodes if n not in known]
    if unknown:
        raise LabError(f"no node {', '.join(unknown)} in lab {ident.lab_id} "
                       f"(nodes: {', '.join(known)})", 2)
    lines = []
    started = time.monotonic()
    for name in nodes:
        killed = kill_node(ident, name)
        _reset_links(known[name]["netns"])
        tmp = ident.node_dir(name) / "tmp"
        for entry in list(tmp.iterdir()) if tmp.is_dir() else []:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        lines.append(f"{name}: killed {len(killed)} recorded process(es) "
                     f"({', '.join(map(str, killed)) or 'none running'}); /run, /tmp and the "
                     "fabric addresses are gone, the disk is kept")
    procs = {name: start_node(ident, name) for name in nodes}
    for name, proc in procs.items():
        pid1 = wait_ready(ident, name, proc)
        lines.append(f"{name}: booted (PID 1 = host pid {pid1}, sshd up); networkd, docker "
                     "and enabled units start in the background (/var/log/sparklab-boot.log)")
    lines.append(f"rebooted {len(nodes)} node(s) in {time.monotonic() - started:.1f}s")
    return lines


def _reset_links(netns: str) -> None:
    out = subprocess.run(["ip", "-n", netns, "-o", "link", "show"], capture_output=True,
                         text=True, check=False).stdout
    present = {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()
               if line.count(":") >= 2}
    for name in ALL_FABRIC_INTERFACES:
        if name in present:
            subprocess.run(["ip", "-n", netns, "addr", "flush", "dev", name, "scope", "global"],
                           check=False, capture_output=True)
            subprocess.run(["ip", "-n", netns, "link", "set", "dev", name, "mtu", "1500"],
                           check=False, capture_output=True)
