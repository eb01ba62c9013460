"""`sparkctl lab fault KIND --node NAME ...`: break a lab node on purpose, and undo it.

Every fault is recorded in the lab state with what `restore` needs, and restored in reverse.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sparklab import lab as lab_core
from sparklab.identity import MGMT_INTERFACE, NODE_LAB_DIR, ROCE_NAMES, LabError, LabIdentity
from sparklab.network import cable_end_names, run, switch_port_name
from sparklab.node import node_exec, node_path
from sparklab.node_fs import new_host_key

Record = dict[str, Any]
DISK_FULL_SIZE = "32m"
SSHD_START = ["/usr/sbin/sshd", "-f", "/etc/ssh/sshd_config", "-E", "/var/log/sparklab-sshd.log"]


def describe(fault: Record) -> str:
    extra = {k: v for k, v in fault.items() if k in ("interface", "port", "ms", "loss",
                                                     "address", "mtu", "size", "device")}
    args = " ".join(f"{k}={v}" for k, v in extra.items())
    return f"#{fault['id']} {fault['kind']}@{fault['node']}" + (f" ({args})" if args else "")


def _sh(ident: LabIdentity, node: str, script: str, check: bool = True) -> str:
    return node_exec(ident, node, ["sh", "-c", script], check=check).stdout


def _node_state(state: dict[str, Any], node: str) -> dict[str, Any]:
    for entry in state["nodes"]:
        if entry["name"] == node:
            return entry
    names = ", ".join(n["name"] for n in state["nodes"])
    raise LabError(f"no node {node!r} in this lab (nodes: {names})", 2)


def _require_interface(ident: LabIdentity, node: str, iface: str) -> None:
    result = node_exec(ident, node, ["ip", "link", "show", "dev", iface], check=False)
    if result.returncode != 0:
        raise LabError(f"{node} has no interface {iface!r}", 2)


# --- each fault: apply(ident, state, record) fills the record; undo(ident, record) ---

def _cable_ends(state: dict[str, Any], node: str, iface: str) -> list[tuple[str, str]]:
    """(netns, ifname) of the fabric-side ports of the cable plugged into node:iface: downing
    them takes the carrier away from the node ends, as pulling a real cable does."""
    ident = LabIdentity(state["lab_id"])
    for index, cable in enumerate(state["cables"]):
        if (node, iface) in ((cable["a"], cable["a_if"]), (cable["b"], cable["b_if"])):
            return [(ident.fabric_netns, end) for end in cable_end_names(ident, index)]
    for port in state["switch_ports"]:
        if port["node"] == node and port["interface"] == iface:
            index = _node_state(state, node)["index"]
            return [(ident.fabric_netns, switch_port_name(ident, index, port["bridge_index"]))]
    raise LabError(f"{node}:{iface} has no cable (cabled: "
                   f"{', '.join(_node_state(state, node)['cabled'])})", 2)


def _cut_cable(ident: LabIdentity, state: dict[str, Any], rec: Record) -> None:
    rec["ends"] = _cable_ends(state, rec["node"], rec["interface"])
    for netns, ifname in rec["ends"]:
        run(["ip", "-n", netns, "link", "set", ifname, "down"])


def _undo_cut_cable(ident: LabIdentity, rec: Record) -> None:
    for netns, ifname in rec["ends"]:
        run(["ip", "-n", netns, "link", "set", ifname, "up"], check=False)
    # carrier reaches operstate asynchronously: return once the node's end works again
    deadline = time.monotonic() + 10
    node_ns = ident.netns(rec["node"])
    while time.monotonic() < deadline and "state UP" not in run(
            ["ip", "-n", node_ns, "link", "show", rec["interface"]], check=False):
        time.sleep(0.05)


def _stop_sshd(ident: LabIdentity, state: dict[str, Any], rec: Record) -> None:
    _sh(ident, rec["node"], "kill $(cat /run/sshd.pid) && rm -f /run/sshd.pid")


def _undo_stop_sshd(ident: LabIdentity, rec: Record) -> None:
    if _sh(ident, rec["node"], "test -f /run/sshd.pid && kill -0 $(cat /run/sshd.pid) "
           "&& echo running", check=False).strip() != "running":
        node_exec(ident, rec["node"], SSHD_START)


def _rotate_hostkey(ident: LabIdentity, state: dict[str, Any], rec: Record) -> None:
    ssh_dir = node_path(ident, rec["node"], "/etc/ssh")
    key = ssh_dir / "ssh_host_ed25519_key"
    rec["old_key"] = key.read_text()
    rec["old_pub"] = key.with_suffix(".pub").read_text()
    rec["new_pub"] = new_host_key(ssh_dir)
    _sh(ident, rec["node"], "kill -HUP $(cat /run/sshd.pid)")  # sshd re-execs, reads the key


def _undo_rotate_hostkey(ident: LabIdentity, rec: Record) -> None:
    ssh_dir = node_path(ident, rec["node"], "/etc/ssh")
    key = ssh_dir / "ssh_host_ed25519_key"
    key.write_text(rec["old_key"])
    key.chmod(0o600)
    key.with_suffix(".pub").write_text(rec["old_pub"])
    _sh(ident, rec["node"], "kill -HUP $(cat /run/sshd.pid)", check=False)


LISTENER = ("import socket,time\ns=socket.socket()\n"
            "s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
            "s.bind(('0.0.0.0',{port}))\ns.listen(16)\nwhile True: time.sleep(3600)\n")


def _listeners(ident: LabIdentity, node: str, port: int) -> str:
    return _sh(ident, node, f"ss -Hltnp 'sport = :{port}'", check=False).strip()


def _occupy_port(ident: LabIdentity, state: dict[str, Any], rec: Record) -> None:
    """A listener of ours on the port, proven by its PID in `ss -p`: a port someone else
    already holds is refused (the fault would not be ours to restore, and would not take)."""
    port = int(rec["port"])
    taken = _listeners(ident, rec["node"], port)
    if taken:
        raise LabError(f"occupy-port: port {port} in {rec['node']} is already in use "
                       f"({taken.split()[-1]}): nothing injected", 1)
    code = LISTENER.format(port=port)
    pid = _sh(ident, rec["node"], f"setsid /usr/bin/python3 -c \"{code}\" </dev/null "
              ">/dev/null 2>&1 & echo $!").strip()
    rec["pid"] = int(pid)  # PID inside the node's PID namespace
    for _ in range(100):
        if f"pid={rec['pid']}," in _listeners(ident, rec["node"], port):
            return
        alive = _sh(ident, rec["node"], f"kill -0 {rec['pid']} 2>/dev/null && echo yes",
                    check=False).strip()
        if not alive:
            break
        time.sleep(0.05)
    _undo_occupy_port(ident, rec)
    raise LabError(f"occupy-port: the listener could not bind port {port} in {rec['node']} "
                   f"(now: {_listeners(ident, rec['node'], port) or 'nothing listens'}): "
                   "nothing injected", 1)


def _undo_occupy_port(ident: LabIdentity, rec: Record) -> None:
    _sh(ident, rec["node"], f"kill {int(rec['pid'])}", check=False)


def _disk_full(ident: LabIdentity, state: dict[str, Any], rec: Record) -> None:
    # A small tmpfs over the node's /var (its real contents stay reachable for the lab's own
    # flags and logs), filled to the last block: `df /var` shows 100% and writes get ENOSPC.
    _sh(ident, rec["node"], f"""set -e
mkdir -p /run/sparklab/var-real
mount --bind /var /run/sparklab/var-real
mount -t tmpfs -o size={DISK_FULL_SIZE},mode=755 sparklab-diskfull /var
for d in lib/sparklab log tmp; do mkdir -p /var/$d; mount --bind /run/sparklab/var-real/$d /var/$d; done
chmod 1777 /var/tmp
dd if=/dev/zero of=/var/sparklab-disk-full bs=1M 2>/dev/null || true
""")


def _undo_disk_full(ident: LabIdentity, rec: Record) -> None:
    # lazily: a process that lived through the fault (an SSH session kept open across runs,
    # orchestrator/remote/keeper.py) may still hold the full tmpfs; it must not keep the node's
    # /var full for everything that comes after (as a real disk freed up is free for all)
    _sh(ident, rec["node"], "umount -R -l /var; umount -l /run/sparklab/var-real", check=False)


def _delay(ident: LabIdentity, state: dict[str, Any], rec: Record) -> None:
    iface, node = rec["interface"], rec["node"]
    _require_interface(ident, node, iface)
    tap = f"sparklabdly{len(state['faults'])}"
    rec["tap"] = tap
    out = f"/run/sparklab/{tap}.out"
    pid = _sh(ident, node, f"setsid sparklab-netdelay {iface} {tap} {float(rec['ms'])} "
              f"{float(rec.get('loss') or 0)} </dev/null >{out} 2>&1 & echo $!").strip()
    rec["pid"] = int(pid)
    for _ in range(100):
        if "ready" in _sh(ident, node, f"cat {out}", check=False):
            break
        time.sleep(0.05)
    else:
        raise LabError(f"delay relay did not start in {node}", 1)
    _sh(ident, node, f"tc qdisc add dev {iface} clsact && tc filter add dev {iface} egress "
        f"protocol all u32 match u32 0 0 action mirred egress redirect dev {tap}")


def _undo_delay(ident: LabIdentity, rec: Record) -> None:
    _sh(ident, rec["node"], f"tc qdisc del dev {rec['interface']} clsact; "
        f"kill {int(rec['pid'])}", check=False)


SQUEEZER = ("import time\nheld=[bytearray(1<<20) for _ in range({mib})]\n"
            "open('/run/sparklab/squeeze-{fid}.ready','w').close()\n"
            "while True: time.sleep(3600)\n")


def _squeeze_memory(ident: LabIdentity, state: dict[str, Any], rec: Record) -> None:
    """Hold SIZE of the node's memory (in the node's /proc/meminfo units, i.e. scaled: real
    bytes = SIZE / memory scale) in a process of the node, charged to its memory cgroup."""
    from sparklab.memory import parse_size

    scale = int((state.get("memory") or {}).get("scale") or 0)
    if not scale:
        raise LabError("squeeze-memory needs the lab's memory cgroups (none on this host)", 1)
    rec["real_bytes"] = parse_size(str(rec["size"])) // scale
    mib = max(1, rec["real_bytes"] // 2**20)
    # unique per squeeze: a ready file left by an earlier one (a restore, then a new squeeze
    # with the same count) must never pass for this one's
    fid = f"{len(state['faults']) + 1}-{time.time_ns()}"
    rec["ready"] = f"/run/sparklab/squeeze-{fid}.ready"
    code = SQUEEZER.format(mib=mib, fid=fid)
    pid = _sh(ident, rec["node"], f"rm -f /run/sparklab/squeeze-*.ready; setsid /usr/bin/python3 "
              f"-c \"{code}\" </dev/null >/dev/null 2>&1 & echo $!").strip()
    rec["pid"] = int(pid)  # PID inside the node's PID namespace
    for _ in range(200):
        if _sh(ident, rec["node"], f"test -e /run/sparklab/squeeze-{fid}.ready && echo y",
               check=False).strip() == "y":
            return
        if not _sh(ident, rec["node"], f"kill -0 {int(pid)} 2>/dev/null && echo y",
                   check=False).strip():
            raise LabError(f"squeeze-memory: the allocating process in {rec['node']} died "
                           "(killed by the cgroup's OOM killer?)", 1)
        time.sleep(0.05)
    raise LabError(f"squeeze-memory: {rec['node']} did not finish allocating", 1)


def _undo_squeeze_memory(ident: LabIdentity, rec: Record) -> None:
    ready = str(rec.get("ready") or "")
    remove = f"; rm -f {ready}" if ready.startswith("/run/sparklab/squeeze-") else ""
    _sh(ident, rec["node"], f"kill {int(rec['pid'])}{remove}", check=False)


def _flag(ident: LabIdentity, state: dict[str, Any], rec: Record) -> None:
    _sh(ident, rec["node"], f"touch {NODE_LAB_DIR}/faults/{rec['kind']}")


def _undo_flag(ident: LabIdentity, rec: Record) -> None:
    _sh(ident, rec["node"], f"rm -f {NODE_LAB_DIR}/faults/{rec['kind']}", check=False)


def _change_address(ident: LabIdentity, state: dict[str, Any], rec: Record) -> None:
    iface, node = rec["interface"], rec["node"]
    _require_interface(ident, node, iface)
    rec["old"] = _sh(ident, node, f"ip -o -4 addr show dev {iface} scope global | "
                     "awk '{print $4}'").split()
    _sh(ident, node, f"ip addr flush dev {iface} scope global && "
        f"ip addr add {rec['address']} dev {iface}")


def _undo_change_address(ident: LabIdentity, rec: Record) -> None:
    adds = "".join(f" && ip addr add {a} dev {rec['interface']}" for a in rec["old"])
    _sh(ident, rec["node"], f"ip addr flush dev {rec['interface']} scope global{adds}",
        check=False)


def _set_mtu(ident: LabIdentity, state: dict[str, Any], rec: Record) -> None:
    iface, node = rec["interface"], rec["node"]
    _require_interface(ident, node, iface)
    rec["old_mtu"] = int(_sh(ident, node, f"cat /sys/class/net/{iface}/mtu").strip())
    _sh(ident, node, f"ip link set dev {iface} mtu {int(rec['mtu'])}")


def _undo_set_mtu(ident: LabIdentity, rec: Record) -> None:
    _sh(ident, rec["node"], f"ip link set dev {rec['interface']} mtu {rec['old_mtu']}",
        check=False)


def _roce_mtu(ident: LabIdentity, state: dict[str, Any], rec: Record) -> None:
    """The RoCE device behind an interface runs RDMA at a smaller active MTU than its link
    allows (what `ibv_devinfo` shows; the lab's tool reads the pinned value from a fault file)."""
    iface, node = rec["interface"], rec["node"]
    _require_interface(ident, node, iface)
    if iface not in ROCE_NAMES:
        raise LabError(f"roce-mtu: {iface} is not a fabric interface ({', '.join(ROCE_NAMES)})", 2)
    rec["device"] = ROCE_NAMES[iface]
    _sh(ident, node, f"mkdir -p {NODE_LAB_DIR}/faults && "
        f"echo {int(rec['mtu'])} > {NODE_LAB_DIR}/faults/roce-mtu-{rec['device']}")


def _undo_roce_mtu(ident: LabIdentity, rec: Record) -> None:
    _sh(ident, rec["node"], f"rm -f {NODE_LAB_DIR}/faults/roce-mtu-{rec['device']}", check=False)


SWITCH = "switch"  # the node name a switch-wide fault is recorded under


def _switch_devices(state: dict[str, Any]) -> list[str]:
    """The fabric switch's bridges and every node-facing port, in the fabric namespace."""
    if not state.get("switch_ports"):
        raise LabError("switch-mtu needs a switch lab (`lab up --topology switch`)", 2)
    ident = LabIdentity(state["lab_id"])
    index = {n["name"]: n["index"] for n in state["nodes"]}
    ports = [switch_port_name(ident, index[p["node"]], p["bridge_index"])
             for p in state["switch_ports"]]
    bridges = sorted({f"{ident.prefix}f{p['bridge_index']}" for p in state["switch_ports"]})
    return ports + bridges


def _switch_mtu(ident: LabIdentity, state: dict[str, Any], rec: Record) -> None:
    """A switch whose ports are not set for jumbo frames: frames above MTU are dropped on
    ingress (veth drops what exceeds the receiving end's MTU), silently, as a switch does."""
    devices = _switch_devices(state)
    ns = ident.fabric_netns
    rec["old_mtu"] = {d: int(run(["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{d}/mtu"])
                             .strip()) for d in devices}
    for device in devices:
        run(["ip", "-n", ns, "link", "set", "dev", device, "mtu", str(int(rec["mtu"]))])


def _undo_switch_mtu(ident: LabIdentity, rec: Record) -> None:
    for device, mtu in rec["old_mtu"].items():
        run(["ip", "-n", ident.fabric_netns, "link", "set", "dev", device, "mtu", str(mtu)],
            check=False)


Apply = Callable[[LabIdentity, dict[str, Any], Record], None]
Undo = Callable[[LabIdentity, Record], None]
FAULTS: dict[str, tuple[Apply, Undo]] = {
    "cut-cable": (_cut_cable, _undo_cut_cable),
    "stop-sshd": (_stop_sshd, _undo_stop_sshd),
    "rotate-hostkey": (_rotate_hostkey, _undo_rotate_hostkey),
    "occupy-port": (_occupy_port, _undo_occupy_port),
    "disk-full": (_disk_full, _undo_disk_full),
    "delay": (_delay, _undo_delay),
    "engine-hang": (_flag, _undo_flag),
    "rank-die": (_flag, _undo_flag),
    "block-registry": (_flag, _undo_flag),
    "gpu-throttle": (_flag, _undo_flag),  # read by the node's simulated nvidia-smi
    "gpu-hot": (_flag, _undo_flag),
    "change-address": (_change_address, _undo_change_address),
    "set-mtu": (_set_mtu, _undo_set_mtu),
    "switch-mtu": (_switch_mtu, _undo_switch_mtu),
    "roce-mtu": (_roce_mtu, _undo_roce_mtu),
    "squeeze-memory": (_squeeze_memory, _undo_squeeze_memory),
}


def inject(ident: LabIdentity, kind: str, node: str, **params: Any) -> Record:
    state = lab_core.load_state(ident)
    if state is None:
        raise LabError(f"lab {ident.lab_id} is not up (`sparkctl lab up`)", 1)
    if node != SWITCH:
        _node_state(state, node)
    apply, _ = FAULTS[kind]
    next_id = max((f["id"] for f in state["faults"]), default=0) + 1
    rec: Record = {"id": next_id, "kind": kind, "node": node,
                   **{k: v for k, v in params.items() if v is not None}}
    apply(ident, state, rec)
    state["faults"].append(rec)
    lab_core.save_state(ident, state)
    return rec


def restore(ident: LabIdentity, node: str | None = None) -> list[Record]:
    state = lab_core.load_state(ident)
    if state is None:
        raise LabError(f"lab {ident.lab_id} is not up", 1)
    undone = []
    for rec in reversed(list(state["faults"])):
        if node is not None and rec["node"] != node:
            continue
        FAULTS[rec["kind"]][1](ident, rec)
        state["faults"].remove(rec)
        undone.append(rec)
    lab_core.save_state(ident, state)
    return undone


__all__ = ["FAULTS", "MGMT_INTERFACE", "describe", "inject", "restore"]
