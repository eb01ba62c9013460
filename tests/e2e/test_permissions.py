"""Every file sparkctl writes on every node has the right owner and mode, nothing is group or
world writable, and managed text config carries the "Managed by sparkctl" header.

Checked after `up` and a `launch` (which adds the LLM API config and the run directory).
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest
from conftest import REPO, Lab, healthy_lab

pytestmark = pytest.mark.lab

# path -> (mode, owner)
SECRET_FILES = {
    "/etc/sparkctl/cluster_key": ("600", "root"),
    "/etc/sparkctl/ssh_host_ed25519_key": ("600", "root"),
    "/etc/netplan/40-sparkctl-fabric.yaml": ("600", "root"),
}
PUBLIC_FILES = {
    "/etc/sparkctl": ("755", "root"),
    "/etc/sparkctl/cluster_key.pub": ("644", "root"),
    "/etc/sparkctl/ssh_host_ed25519_key.pub": ("644", "root"),
    "/etc/sparkctl/authorized_keys": ("644", "root"),
    "/etc/sparkctl/known_hosts": ("644", "root"),
    "/etc/sparkctl/ssh_config": ("644", "root"),
    "/etc/sparkctl/sshd_config": ("644", "root"),
    "/etc/sparkctl/hostfile": ("644", "root"),
    "/etc/sparkctl/entrypoint.sh": ("755", "root"),
    "/var/lib/sparkctl": ("755", "root"),
    "/var/lib/sparkctl/run": ("755", "root"),
}
# managed text config: the header says who owns the file (authorized_keys and known_hosts are
# read by sshd/ssh, which accept comments; keys and the hostfile format are checked below)
HEADED = ["/etc/sparkctl/ssh_config", "/etc/sparkctl/sshd_config", "/etc/sparkctl/entrypoint.sh",
          "/etc/netplan/40-sparkctl-fabric.yaml", "/etc/sparkctl/known_hosts",
          "/etc/sparkctl/authorized_keys", "/etc/sparkctl/hostfile"]
HEADER = "Managed by sparkctl"
TREES = "/etc/sparkctl /var/lib/sparkctl /etc/netplan/40-sparkctl-fabric.yaml"


@pytest.fixture(scope="module")
def set_up(lab_session: list[Lab]) -> Lab:
    lab = healthy_lab(lab_session)
    up = subprocess.run([str(REPO / ".venv/bin/sparkctl"), "up", "--inventory", str(lab.inventory),
                         "--yes"], capture_output=True, text=True, timeout=300, cwd=REPO,
                        env={**os.environ, "SPARKCTL_STATE_DIR": str(lab.state_dir / "ctl-perm")})
    assert up.returncode == 0, up.stdout + up.stderr
    return lab


def modes(lab: Lab, node: str, paths: list[str]) -> dict[str, tuple[str, str]]:
    out = lab.exec(node, ["stat", "-c", "%n %a %U", *paths]).stdout
    return {name: (mode, owner) for name, mode, owner in (line.split() for line in out.splitlines())}


def test_secret_files_are_0600_root(set_up: Lab, tally: Any) -> None:
    for node in set_up.nodes:
        assert modes(set_up, node, list(SECRET_FILES)) == SECRET_FILES, node
        tally.add("permission checks", len(SECRET_FILES))


def test_other_files_are_0644_or_0755_root(set_up: Lab, tally: Any) -> None:
    for node in set_up.nodes:
        assert modes(set_up, node, list(PUBLIC_FILES)) == PUBLIC_FILES, node
        tally.add("permission checks", len(PUBLIC_FILES))


def test_nothing_sparkctl_wrote_is_group_or_world_writable(set_up: Lab, tally: Any) -> None:
    for node in set_up.nodes:
        listed = set_up.exec(node, f"find {TREES} | wc -l").stdout.strip()
        writable = set_up.exec(node, f"find {TREES} -perm /022 ! -type l").stdout.strip()
        assert writable == "", f"{node}: group/world writable: {writable}"
        foreign = set_up.exec(node, f"find {TREES} ! -user root").stdout.strip()
        assert foreign == "", f"{node}: not owned by root: {foreign}"
        tally.add("permission checks", 2 * int(listed))


def test_every_file_mode_is_one_of_the_allowed(set_up: Lab, tally: Any) -> None:
    for node in set_up.nodes:
        out = set_up.exec(node, f"find {TREES} -type f -printf '%m %p\\n'").stdout
        for line in out.splitlines():
            mode, path = line.split(" ", 1)
            assert mode in ("600", "644", "700", "755"), f"{node}: {path} has mode {mode}"
            tally.add("permission checks")


def test_managed_text_config_carries_the_header(set_up: Lab, tally: Any) -> None:
    for node in set_up.nodes:
        for path in HEADED:
            head = set_up.exec(node, f"head -n 3 {path}").stdout
            assert HEADER in head, f"{node}: {path} lacks the header:\n{head}"
            tally.add("permission checks")


def test_private_keys_are_unreadable_to_the_cluster_user(set_up: Lab, tally: Any) -> None:
    for node in set_up.nodes:
        for path in ("/etc/sparkctl/cluster_key", "/etc/sparkctl/ssh_host_ed25519_key"):
            read = set_up.exec(node, ["cat", path], user="nvidia", check=False)
            assert read.returncode != 0 and "PRIVATE KEY" not in read.stdout, f"{node}: {path}"
            tally.add("permission checks")
