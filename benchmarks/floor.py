"""The floor: the same remote commands, pre-rendered as one script per node, sent over one
plain OpenSSH connection per node, all nodes in parallel.

The commands come from a capture (benchmarks/capture.py) of a sparkctl run. Two adjustments
keep the replay doing the same work without a controller in the loop:
- the container host key sparkctl generates on each node is replaced by writing the key the
  captured run generated (known_hosts in the replayed files pins those keys);
- before `mpirun`, the head waits on the node for every peer's container sshd port: a
  node-side wait that costs no controller round trip (sparkctl gets this order from its
  lock-step phases).
"""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HOST_KEY = "/etc/sparkctl/ssh_host_ed25519_key"
KEYGEN_MARK = "ssh-keygen -q -t ed25519"


@dataclass
class FloorResult:
    seconds: float
    failed: list[str]  # "node: command (exit N)"
    commands: int  # the most any node ran


def seed_host_key_cmd() -> str:
    key, pub = HOST_KEY, HOST_KEY + ".pub"
    inner = (f"install -d -m 0755 /etc/sparkctl && umask 077 && cat > {key} && "
             f"ssh-keygen -y -f {key} > {pub} && chmod 644 {pub} && cat {pub}")
    return f"sudo -n -- sh -c {shlex.quote(inner)}"


def peer_wait_cmd(peers: list[str], port: int, seconds: float = 30.0) -> str:
    """Node-side: wait until every peer's container sshd accepts TCP (bounded)."""
    tries = int(seconds / 0.05)
    checks = " ".join(shlex.quote(p) for p in peers)
    return (f"for ip in {checks}; do i=0; until (exec 3<>/dev/tcp/$ip/{port}) 2>/dev/null; "
            f"do i=$((i+1)); [ $i -ge {tries} ] && break; sleep 0.05; done; done")


def render_script(commands: list[dict[str, Any]], host_key: str | None = None,
                  peers: list[str] | None = None, container_port: int = 2233) -> str:
    """One bash script running the captured commands in order; each exit code on stderr."""
    lines = ["#!/bin/bash", "set +e"]
    for index, record in enumerate(commands):
        command, stdin = record["command"], base64.b64decode(record["stdin"])
        if host_key is not None and KEYGEN_MARK in command:
            command, stdin = seed_host_key_cmd(), host_key.encode()
        if peers and "mpirun" in command:
            lines.append(peer_wait_cmd(peers, container_port))
        marker = f"SPARKCTL_FLOOR_STDIN_{index}"
        if stdin:
            encoded = base64.encodebytes(stdin).decode()
            lines.append(f"base64 -d <<'{marker}' | bash -c {shlex.quote(command)}\n"
                         f"{encoded}{marker}")
        else:
            lines.append(f"bash -c {shlex.quote(command)} </dev/null")
        lines.append(f"echo \"floor-rc {index} $?\" >&2")
    return "\n".join(lines) + "\n"


def ssh_argv(host: str, user: str, key: Path, known_hosts: Path, port: int = 22) -> list[str]:
    return ["ssh", "-F", "/dev/null", "-i", str(key), "-p", str(port),
            "-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "ControlMaster=no",
            "-o", "ControlPath=none", f"{user}@{host}", "bash -s"]


def run_floor(scripts: dict[str, str], inventory: dict[str, Any]) -> FloorResult:
    """Send each node its script over one ssh connection, all in parallel; time the slowest."""
    cluster = inventory["cluster"]
    hosts = {n["name"]: n["host"] for n in inventory["nodes"]}

    def one(node: str) -> list[str]:
        argv = ssh_argv(hosts[node], cluster["user"], Path(cluster["ssh_key"]),
                        Path(cluster["known_hosts"]), int(cluster.get("ssh_port", 22)))
        proc = subprocess.run(argv, input=scripts[node].encode(), capture_output=True,
                              check=False, timeout=600)
        if proc.returncode == 255:
            return [f"{node}: ssh failed: {proc.stderr.decode(errors='replace')[-300:]}"]
        return [f"{node}: command {line.split()[1]} (exit {line.split()[2]})"
                for line in proc.stderr.decode(errors="replace").splitlines()
                if line.startswith("floor-rc ") and line.split()[2] != "0"]

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(scripts)) as pool:
        failures = [f for result in pool.map(one, list(scripts)) for f in result]
    seconds = time.perf_counter() - started
    return FloorResult(seconds, failures, max((s.count("floor-rc ") for s in scripts.values()),
                                              default=0))


def load_capture(path: Path) -> dict[str, list[dict[str, Any]]]:
    return dict(json.loads(path.read_text()))


def scripts_from_capture(capture: dict[str, list[dict[str, Any]]], inventory: dict[str, Any],
                         host_keys: dict[str, str] | None = None) -> dict[str, str]:
    """Per node: its script; the head (first node) waits for its peers before mpirun."""
    nodes = inventory["nodes"]
    head = next((n["name"] for n in nodes if n.get("head")), nodes[0]["name"])
    interfaces = inventory["fabric"]["interfaces"]
    port = int(inventory.get("container", {}).get("ssh_port", 2233))
    scripts = {}
    for node in nodes:
        peers = None
        if node["name"] == head:
            peers = [str(n["addresses"][interfaces[0]]).split("/")[0] for n in nodes
                     if n["name"] != head]
        scripts[node["name"]] = render_script(capture.get(node["name"], []),
                                              (host_keys or {}).get(node["name"]), peers, port)
    return scripts
