"""PID 1 of a lab node (runs with the node's /usr/bin/python3, stdlib only).

Starts the node's sshd, then boots the rest in the background (systemctl shim: networkd,
docker's restart policies, enabled units; log /var/log/sparklab-boot.log), then reaps every
orphan forever, so daemons started over SSH never pile up as zombies and the node stays a
stable `nsenter -t` target. When the node has a memory
cgroup (bound at /run/sparklab/memcg by the init), a thread keeps /run/sparklab/meminfo (bound
over /proc/meminfo) in step with it, scaled (sparklab/memory.py explains the figures).
"""

import contextlib
import json
import os
import signal
import subprocess
import threading
import time

MEMCG = "/run/sparklab/memcg"
MEMINFO = "/run/sparklab/meminfo"
LAB_CONFIG = "/var/lib/sparklab/config/lab.json"
DOCKERD = "/usr/local/lib/sparklab/dockerd-shim"
BOOT_LOG = "/var/log/sparklab-boot.log"


def meminfo_text(limit: int, usage: int, cache: int, file_pages: int, scale: int) -> str:
    """A /proc/meminfo in the kernel's layout, fixed width (the length never changes)."""
    kb = 1024
    total = limit * scale // kb
    free = max(0, limit - usage) * scale // kb
    cached = min(cache, usage) * scale // kb
    # what is in use minus its reclaimable file pages, against the node's memory: usage may
    # pass `limit` (the cgroup's headroom, sparklab/memory.py) and must then count in full
    avail = min(total, max(0, limit - usage + min(file_pages, usage)) * scale // kb)
    rows = [("MemTotal", total), ("MemFree", free), ("MemAvailable", avail), ("Buffers", 0),
            ("Cached", cached), ("SwapCached", 0), ("Shmem", 0), ("SwapTotal", 0),
            ("SwapFree", 0)]
    return "".join(f"{name + ':':<16}{value:14d} kB\n" for name, value in rows)


def read_int(path: str) -> int:
    with open(path) as f:
        return int(f.read().split()[0])


def cgroup_meminfo(scale: int, node_bytes: int = 0) -> str:
    """The node's memory is `node_bytes` (lab.json's node_memory_bytes): the cgroup's hard
    limit is that plus the headroom for the lab's unscaled processes (sparklab/memory.py)."""
    stat = {}
    with open(MEMCG + "/memory.stat") as f:
        for line in f:
            key, _, value = line.partition(" ")
            stat[key] = int(value)
    limit = read_int(MEMCG + "/memory.limit_in_bytes")
    return meminfo_text(min(limit, node_bytes) if node_bytes else limit,
                        read_int(MEMCG + "/memory.usage_in_bytes"),
                        stat.get("total_cache", 0),
                        stat.get("total_active_file", 0) + stat.get("total_inactive_file", 0),
                        scale)


def keep_meminfo(scale: int, node_bytes: int) -> None:
    fd = os.open(MEMINFO, os.O_RDWR | os.O_CREAT, 0o444)
    os.pwrite(fd, cgroup_meminfo(scale, node_bytes).encode(), 0)
    subprocess.run(["mount", "--bind", MEMINFO, "/proc/meminfo"], check=True)

    def loop() -> None:
        while True:
            time.sleep(0.5)
            with contextlib.suppress(OSError, ValueError):
                os.pwrite(fd, cgroup_meminfo(scale, node_bytes).encode(), 0)

    threading.Thread(target=loop, daemon=True).start()


def main() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only `lab down` (SIGKILL) ends a node
    if os.path.exists(MEMCG + "/memory.limit_in_bytes"):
        try:
            with open(LAB_CONFIG) as f:
                config = json.load(f)
            scale = int(config.get("memory_scale") or 1)
            node_bytes = int(config.get("node_memory_bytes") or 0)
        except (OSError, ValueError):
            scale, node_bytes = 1, 0
        keep_meminfo(scale, node_bytes)
    # containers recorded as running died with the node's last life (lab reboot): say so first
    with open(BOOT_LOG, "ab") as log:
        log.write(f"-- boot {time.strftime('%Y-%m-%d %H:%M:%S')} --\n".encode())
        log.flush()
        subprocess.run(["/usr/bin/python3", DOCKERD, "__boot", "reset"], check=False,
                       stdout=log, stderr=log)
    subprocess.run(["/usr/sbin/sshd", "-f", "/etc/ssh/sshd_config",
                    "-E", "/var/log/sparklab-sshd.log"], check=True)
    with open("/run/sparklab/ready", "w") as ready:
        ready.write(f"{time.time()}\n")
    # then what systemd would do: networkd, docker's restart policies, enabled units
    with open(BOOT_LOG, "ab") as log:
        subprocess.Popen(["/usr/bin/python3", "/usr/local/sbin/systemctl", "__sparklab_boot"],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(1)


if __name__ == "__main__":
    main()
