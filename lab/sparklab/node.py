"""Lab node processes: start a node's init in its namespaces, run commands in it, stop it.

A node is `ip netns exec NS unshare --mount --uts --pid --fork --kill-child --mount-proc ...`:
the unshare parent (SIGKILL ends the whole node) and its child, the node's PID 1 (the
`nsenter -t` target). Both host PIDs are recorded with their start times, so a recycled PID is
never mistaken for ours.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from sparklab.identity import LabError, LabIdentity

INIT_TEMPLATE = """#!/bin/sh
# sparklab node init for {node}: private mounts, then PID 1 (supervisor + sshd).
set -eu
N={node_dir}
export LIBMOUNT_UTAB="$N/utab"
mount --make-rprivate /
ov() {{ mount -t overlay "sparklab-$2" -o "lowerdir=$1,upperdir=$N/upper/$2,workdir=$N/work/$2" "/$2"; }}
ov /etc etc
ov {usr_lowers} usr
ov /opt opt
ov /home home
mount --bind "$N/root" /root
mount --bind "$N/tmp" /tmp
mount -t tmpfs -o mode=755,size=256m sparklab-run /run
mkdir -p /run/sshd /run/sparklab /run/lock
chmod 1777 /run/lock
# the node's own /dev/shm, as every machine has: with the host's, processes on two nodes met in
# it, and vLLM takes ranks that see each other's shared memory for ranks of one machine (its
# broadcast queue then waits forever on a local socket the other node cannot reach)
mount -t tmpfs -o mode=1777,nosuid,nodev,size=1g sparklab-shm /dev/shm
# the node's own memory cgroup, read by PID 1 to present /proc/meminfo (sparklab/memory.py)
MEMCG={memcg}
if [ -n "$MEMCG" ]; then
  # `ip netns exec` gave the node a fresh /sys without cgroup mounts: mount the memory
  # hierarchy privately (this mount namespace only), keep the node's own dir, drop the rest
  mkdir -p /run/sparklab/cgroot /run/sparklab/memcg
  mount -t cgroup -o memory sparklab-memcg /run/sparklab/cgroot
  mount --bind "/run/sparklab/cgroot/$MEMCG" /run/sparklab/memcg
  mount -o remount,bind,ro /run/sparklab/memcg
  umount /run/sparklab/cgroot
  rmdir /run/sparklab/cgroot
fi
mount --bind /sys /sys
mount -o remount,bind,ro /sys
# node root is host root: keep the host's kernel knobs out of reach (net.* is per-namespace)
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro /proc/sys
mount --bind /proc/sys/net /proc/sys/net
mount -o remount,bind,rw /proc/sys/net
# as systemd's 50-default.conf does on Ubuntu: unprivileged ping (per network namespace)
echo "0 2147483647" > /proc/sys/net/ipv4/ping_group_range
# the docker shim's containers live on the node's disk (kept across `lab reboot`, as
# /var/lib/docker is): a plain directory of the host's, taken before /var becomes an overlay
# (overlay upper dirs cannot sit on overlayfs), moved into place after
mkdir -p "$N/containers" /run/sparklab/containers
chmod 0700 "$N/containers"
mount --bind "$N/containers" /run/sparklab/containers
# the real vLLM's verdicts on `vllm serve` command lines (image/sparklab_engine/vllm_verdict.py):
# one directory for the whole machine, writable from every node and container, taken before /var
# becomes an overlay and moved to /var/cache (outside /var/lib/sparklab, which containers re-bind)
mkdir -p /var/lib/sparklab/cache/vllm-verdicts /run/sparklab/vllm-verdicts
mount --bind /var/lib/sparklab/cache/vllm-verdicts /run/sparklab/vllm-verdicts
# /var last: the lab's state dir lives under the host's /var
ov /var var
mkdir -p /var/cache/sparklab-vllm-verdicts
mount -n --move /run/sparklab/vllm-verdicts /var/cache/sparklab-vllm-verdicts
rmdir /run/sparklab/vllm-verdicts
mkdir -p /var/lib/sparklab/containers
mount -n --move /run/sparklab/containers /var/lib/sparklab/containers
rmdir /run/sparklab/containers
hostname {node}
ldconfig -X
exec /usr/bin/python3 /usr/local/lib/sparklab/node_supervisor.py
"""


def write_init(ident: LabIdentity, node: str, usr_lowers: Sequence[Path],
               memcg: Path | None = None) -> Path:
    node_dir = ident.node_dir(node)
    script = node_dir / "init.sh"
    script.write_text(INIT_TEMPLATE.format(
        node=node, node_dir=shlex.quote(str(node_dir)),
        memcg=shlex.quote(str(memcg.relative_to("/sys/fs/cgroup/memory"))) if memcg else "''",
        usr_lowers=shlex.quote(":".join(str(p) for p in usr_lowers))))
    script.chmod(0o755)
    return script


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):  # dead, only waiting to be reaped
        return None
    return fields[19]  # field 22: starttime in clock ticks


def record_pid(path: Path, pid: int) -> None:
    path.write_text(f"{pid} {_start_time(pid) or ''}\n")


def recorded_pid(path: Path) -> int | None:
    """The PID in `path` if that process is still the one we started, else None."""
    try:
        fields = path.read_text().split()
    except OSError:
        return None
    if not fields:
        return None
    pid = int(fields[0])
    started = _start_time(pid)
    if started is None or (len(fields) > 1 and fields[1] != started):
        return None
    return pid


def node_memcg(ident: LabIdentity, node: str) -> Path | None:
    """The node's memory cgroup (recorded by `lab up`), None without memory accounting."""
    try:
        path = Path((ident.node_dir(node) / "memcg").read_text().strip())
    except OSError:
        return None
    return path if path.is_dir() else None


NODE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8", "HOME": "/root"}
"""The whole environment a node's init (PID 1) and `lab exec` start with: a real machine boots
with nothing of whoever started it, so no caller's HF_TOKEN or API key is in a node's
/proc/1/environ, and nothing a node does depends on the caller's shell."""


def start_node(ident: LabIdentity, node: str) -> subprocess.Popen[bytes]:
    """Start the node's init; its unshare process joins the node's memory cgroup first, so
    everything in the node is charged to it."""
    from sparklab.memory import joiner

    node_dir = ident.node_dir(node)
    log = open(node_dir / "console.log", "ab")  # noqa: SIM115 - handed to the child
    argv = ["ip", "netns", "exec", ident.netns(node), "unshare", "--mount", "--uts", "--pid",
            "--fork", "--kill-child", "--mount-proc", "--propagation", "private",
            "/bin/sh", str(node_dir / "init.sh")]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            start_new_session=True, close_fds=True, env=dict(NODE_ENV), cwd="/",
                            preexec_fn=joiner(node_memcg(ident, node)))
    log.close()
    record_pid(node_dir / "unshare.pid", proc.pid)
    return proc


def wait_ready(ident: LabIdentity, node: str, proc: subprocess.Popen[bytes],
               timeout: float = 60.0) -> int:
    """Wait for the node's PID 1 to have sshd up; record and return PID 1's host PID."""
    node_dir = ident.node_dir(node)
    deadline = time.monotonic() + timeout
    pid1: int | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log = (node_dir / "console.log").read_text(errors="replace")[-2000:]
            raise LabError(f"node {node} failed to start (exit {proc.returncode}):\n{log}", 1)
        if pid1 is None:
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
            try:
                found = children.read_text().split()
            except OSError:
                found = []
            if found:
                pid1 = int(found[0])
                record_pid(node_dir / "pid", pid1)
        if pid1 is not None and Path(f"/proc/{pid1}/root/run/sparklab/ready").exists():
            return pid1
        time.sleep(0.02)
    raise LabError(f"node {node} did not become ready within {timeout:.0f}s "
                   f"(see {node_dir / 'console.log'})", 1)


def node_pid(ident: LabIdentity, node: str) -> int:
    pid = recorded_pid(ident.node_dir(node) / "pid")
    if pid is None:
        raise LabError(f"node {node} of lab {ident.lab_id} is not running "
                       "(`sparkctl lab status`)", 1)
    return pid


def nsenter_argv(pid: int, argv: Sequence[str], user: str | None = None) -> list[str]:
    inner = list(argv)
    if user is not None:
        inner = ["runuser", "-u", user, "--", *inner]
    # -r/-w: the node's root and cwd, so paths resolve through the node's own mounts.
    return ["nsenter", "-t", str(pid), "-m", "-u", "-i", "-n", "-p", "-r", "-w", "--", *inner]


def node_exec(lab_id: int | LabIdentity, node: str, argv: Sequence[str], *,
              input_text: str | None = None, check: bool = True, timeout: float = 60.0,
              user: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run argv inside a lab node (as root, or as `user`) and capture its output."""
    from sparklab.memory import joiner

    ident = lab_id if isinstance(lab_id, LabIdentity) else LabIdentity(lab_id)
    pid = node_pid(ident, node)
    # what runs in the node is charged to the node's memory cgroup, as if started there
    try:
        result = subprocess.run(nsenter_argv(pid, argv, user), input=input_text,
                                preexec_fn=joiner(node_memcg(ident, node)),
                                capture_output=True, text=True, timeout=timeout, check=False,
                                env=dict(NODE_ENV))
    except subprocess.TimeoutExpired:
        # (never the argv: it may hold what the caller keeps private)
        raise LabError(f"in {node}: the command did not finish within {timeout:g} s and was "
                       "stopped" + (" (`lab exec --timeout SECONDS` allows longer)"
                                    if check is False else ""), 1) from None
    if check and result.returncode != 0:
        raise LabError(f"in {node}: {shlex.join(argv)} exited {result.returncode}:\n"
                       f"{result.stderr.strip()}", 1)
    return result


def node_path(ident: LabIdentity, node: str, path: str) -> Path:
    """A node file as the host sees it, through the node's own mounts."""
    return Path(f"/proc/{node_pid(ident, node)}/root") / path.lstrip("/")


def kill_node(ident: LabIdentity, node: str, timeout: float = 5.0) -> list[int]:
    """SIGKILL the node's unshare parent (its --kill-child takes PID 1 and the whole node)."""
    node_dir = ident.node_dir(node)
    killed = []
    for name in ("unshare.pid", "pid"):
        pid = recorded_pid(node_dir / name)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    deadline = time.monotonic() + timeout
    while killed and time.monotonic() < deadline:
        if all(recorded_pid(node_dir / n) is None for n in ("unshare.pid", "pid")):
            break
        time.sleep(0.02)
    return killed
