"""A node's own filesystem view, prepared from the host before the node starts.

Each node overlays the host's /etc, /usr, /opt, /home and /var; this module writes the node's
upper layers: users (nvidia + root), sudoers, sshd config and host key, hostname, lab config.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sparklab.identity import NODE_LAB_DIR, LabIdentity

OVERLAID = ("etc", "usr", "opt", "home", "var")
USER = "nvidia"
DOCKERD_SHIM = "dockerd-shim"
TOOLS_DIR = Path(__file__).parent / "node_tools"
IMAGE_DIR = Path(__file__).parent / "image"
SHIMS_DIR = Path(__file__).parent / "node_shims"
SUPERVISOR = Path(__file__).parent / "node_supervisor.py"


@dataclass(frozen=True)
class NodeSpec:
    name: str
    index: int
    mgmt_address: str
    hosts: str  # /etc/hosts lines for every node of the lab
    client_pubkey: str
    sudo_password_hash: str | None
    lab_config: dict[str, object]


def build_usr_layer(ident: LabIdentity) -> Path:
    """One read-only /usr layer per lab: node tools, netplan shims, the node supervisor."""
    layer = ident.state_dir / "usr-layer"
    bin_dir, sbin_dir = layer / "local" / "bin", layer / "local" / "sbin"
    lib_dir = layer / "local" / "lib" / "sparklab"
    for d in (bin_dir, sbin_dir, lib_dir):
        d.mkdir(parents=True, exist_ok=True)
    for src in sorted(TOOLS_DIR.iterdir()) if TOOLS_DIR.is_dir() else []:
        if src.name.startswith(".") or src.name == "__pycache__":
            continue
        executable = src.is_file() and os.access(src, os.X_OK)
        # dockerd-shim runs as root through sudo; support files sit beside it.
        dest_dir = bin_dir if executable and src.name != DOCKERD_SHIM else lib_dir
        if src.is_dir():
            shutil.copytree(src, dest_dir / src.name, dirs_exist_ok=True)
            continue
        shutil.copyfile(src, dest_dir / src.name)
        os.chmod(dest_dir / src.name, 0o755 if executable else 0o644)
    for src in sorted(SHIMS_DIR.iterdir()):
        shutil.copyfile(src, sbin_dir / src.name)
        os.chmod(sbin_dir / src.name, 0o755)
    shutil.copyfile(SUPERVISOR, lib_dir / SUPERVISOR.name)
    # The simulated TensorRT-LLM image: only containers see it (the docker shim mounts it).
    if IMAGE_DIR.is_dir():
        shutil.copytree(IMAGE_DIR, lib_dir / "image", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        copy_option_tables(lib_dir / "image" / "sparklab_engine" / "tables")
    return layer


def copy_option_tables(dest: Path) -> None:
    """The engines' real option tables (sparkctl's, extracted from the pinned sources) and their
    checker, so the simulated engines accept and reject exactly what the real ones do."""
    import orchestrator.engines as engines

    src = Path(engines.__file__).parent
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "optiontable.py", dest / "optiontable.py")
    for table in sorted(src.glob("*/options.json")):
        shutil.copyfile(table, dest / f"{table.parent.name}.json")


def prepare_node(ident: LabIdentity, spec: NodeSpec) -> Path:
    node_dir = ident.node_dir(spec.name)
    for part in OVERLAID:
        (node_dir / "upper" / part).mkdir(parents=True, exist_ok=True)
        (node_dir / "work" / part).mkdir(parents=True, exist_ok=True)
    (node_dir / "root").mkdir(mode=0o700, exist_ok=True)
    (node_dir / "tmp").mkdir(exist_ok=True)
    os.chmod(node_dir / "tmp", 0o1777)
    etc = node_dir / "upper" / "etc"
    uid, gid = _write_accounts(etc, spec.sudo_password_hash)
    _write(etc / "hostname", f"{spec.name}\n")
    _write(etc / "hosts", f"127.0.0.1\tlocalhost\n127.0.1.1\t{spec.name}\n{spec.hosts}")
    sudo_rule = "NOPASSWD: ALL" if spec.sudo_password_hash is None else "ALL"
    _write(etc / "sudoers.d" / "sparklab", f"{USER} ALL=(ALL:ALL) {sudo_rule}\n"
           f"%docker ALL=(root) NOPASSWD: /usr/local/lib/sparklab/{DOCKERD_SHIM}\n", 0o440)
    _write(etc / "ssh" / "sshd_config", _sshd_config(spec.mgmt_address))
    _write(etc / "systemd" / "networkd.conf.d" / "sparklab.conf",
           "[Network]\n# the lab owns eth0's routes; networkd must not remove them\n"
           "ManageForeignRoutes=no\nManageForeignRoutingPolicyRules=no\n")
    (etc / "netplan").mkdir(mode=0o755, exist_ok=True)
    stable_host_key(ident, spec.name, etc / "ssh")
    _authorize(node_dir / "upper" / "home" / USER, spec.client_pubkey, uid, gid)
    _authorize(node_dir / "root", spec.client_pubkey, 0, 0)
    lab_dir = node_dir / "upper" / NODE_LAB_DIR.lstrip("/")
    for sub in ("faults", "config"):
        (lab_dir / sub).mkdir(parents=True, exist_ok=True)
    # Hide the host's /var/lib/sparklab (other labs' state and keys) from inside the node.
    os.setxattr(lab_dir, "trusted.overlay.opaque", b"y")
    _write(lab_dir / "config" / "lab.json", json.dumps(spec.lab_config, indent=2) + "\n")
    return node_dir


def host_key_store(ident: LabIdentity, node: str) -> Path:
    """Where a lab node's sshd host key is kept between `lab up`s: beside the lab's state, not
    in it (lab down removes that). A real Spark keeps its host key for life; a lab that made
    new ones at every up made the next `sparkctl` run after `init --trust-new-hosts` (which
    pins them in the user's ~/.ssh/known_hosts) fail with "HOST KEY CHANGED"."""
    return ident.state_dir.parent / "host-keys" / str(ident.lab_id) / node


def stable_host_key(ident: LabIdentity, node: str, ssh_dir: Path) -> str:
    """The node's host key as at its lab id's first up (made then), copied into the node's
    /etc/ssh; returns the public key line."""
    store = host_key_store(ident, node)
    key = store / "ssh_host_ed25519_key"
    if not (key.is_file() and key.with_suffix(".pub").is_file()):
        store.mkdir(parents=True, exist_ok=True, mode=0o700)
        new_host_key(store)
    ssh_dir.mkdir(parents=True, exist_ok=True)
    for name, mode in (("ssh_host_ed25519_key", 0o600), ("ssh_host_ed25519_key.pub", 0o644)):
        shutil.copyfile(store / name, ssh_dir / name)
        os.chmod(ssh_dir / name, mode)
    return " ".join(key.with_suffix(".pub").read_text().split()[:2])


def new_host_key(ssh_dir: Path) -> str:
    """(Re)generate the node's ed25519 sshd host key; returns the public key line."""
    key = ssh_dir / "ssh_host_ed25519_key"
    ssh_dir.mkdir(parents=True, exist_ok=True)
    for path in (key, key.with_suffix(".pub")):
        path.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sparklab-host",
                    "-f", str(key)], check=True, capture_output=True)
    return " ".join(key.with_suffix(".pub").read_text().split()[:2])


def _sshd_config(address: str) -> str:
    return (
        "# sparklab node sshd: keys only, no PAM (no systemd/logind in a lab node)\n"
        f"ListenAddress {address}\nPort 22\n"
        "HostKey /etc/ssh/ssh_host_ed25519_key\n"
        "UsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PubkeyAuthentication yes\nPermitRootLogin prohibit-password\n"
        "AuthorizedKeysFile .ssh/authorized_keys\nPidFile /run/sshd.pid\n"
        "MaxStartups 200:30:400\nMaxSessions 100\nUseDNS no\nPrintMotd no\n"
        "AcceptEnv LANG LC_*\nSubsystem sftp /usr/lib/openssh/sftp-server\n"
    )


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)


def _authorize(home: Path, pubkey: str, uid: int, gid: int) -> None:
    ssh = home / ".ssh"
    ssh.mkdir(parents=True, exist_ok=True)
    _write(ssh / "authorized_keys", pubkey.strip() + "\n", 0o600)
    for path in (home, ssh, ssh / "authorized_keys"):
        os.chown(path, uid, gid)
    os.chmod(home, 0o750 if uid else 0o700)
    os.chmod(ssh, 0o700)


def _write_accounts(etc: Path, password_hash: str | None) -> tuple[int, int]:
    """Add nvidia (sudo, docker) to copies of the host's account files in the node's /etc."""
    passwd = Path("/etc/passwd").read_text().splitlines()
    group = Path("/etc/group").read_text().splitlines()
    used_uids = {int(line.split(":")[2]) for line in passwd if line.count(":") >= 6}
    used_gids = {int(line.split(":")[2]) for line in group if line.count(":") >= 3}
    uid = next(i for i in range(1000, 60000) if i not in used_uids and i not in used_gids)
    passwd = [line for line in passwd if not line.startswith(f"{USER}:")]
    passwd.append(f"{USER}:x:{uid}:{uid}:NVIDIA DGX Spark user,,,:/home/{USER}:/bin/bash")
    group = [line for line in group if not line.startswith(f"{USER}:")]
    group.append(f"{USER}:x:{uid}:")
    if not any(line.startswith("docker:") for line in group):
        docker_gid = next(i for i in range(999, 100, -1) if i not in used_gids)
        group.append(f"docker:x:{docker_gid}:")
    group = [_add_member(line, ("sudo", "docker", "adm")) for line in group]
    shadow_hash = password_hash or "*"  # '*': no password login, yet not locked for sshd
    shadow = [line for line in _read_lines("/etc/shadow") if not line.startswith(f"{USER}:")]
    shadow.append(f"{USER}:{shadow_hash}:19800:0:99999:7:::")
    gshadow = [line for line in _read_lines("/etc/gshadow") if not line.startswith(f"{USER}:")]
    gshadow.append(f"{USER}:!::")
    if not any(line.startswith("docker:") for line in gshadow):
        gshadow.append("docker:!::")
    gshadow = [_add_member(line, ("sudo", "docker", "adm")) for line in gshadow]
    for name, lines in (("passwd", passwd), ("group", group), ("shadow", shadow),
                        ("gshadow", gshadow)):
        host = Path("/etc") / name
        target = etc / name
        target.write_text("\n".join(lines) + "\n")
        st = host.stat() if host.exists() else None
        if st is not None:
            os.chown(target, st.st_uid, st.st_gid)
            os.chmod(target, stat.S_IMODE(st.st_mode))
    return uid, uid


def _read_lines(path: str) -> list[str]:
    p = Path(path)
    return p.read_text().splitlines() if p.exists() else []


def _add_member(line: str, groups: tuple[str, ...]) -> str:
    fields = line.split(":")
    if fields[0] not in groups or len(fields) < 4:
        return line
    members = [m for m in fields[-1].split(",") if m]
    if USER not in members:
        members.append(USER)
    fields[-1] = ",".join(members)
    return ":".join(fields)
