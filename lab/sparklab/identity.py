"""Who a lab is: its id, its names, its addresses and where its state lives.

Everything a lab creates on the host carries the `sparklab<ID>` prefix so several labs can run
side by side and `lab down` can prove it only removes what it made.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import SparkctlError as _BaseError


class LabError(_BaseError):
    """A lab operation failed in a way the user can act on (no traceback)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message, exit_code)
        self.message = message
        self.exit_code = exit_code


SPARKLAB_ROOT = Path("/var/lib/sparklab")
CACHE_DIR = SPARKLAB_ROOT / "cache"
MGMT_INTERFACE = "eth0"
NODE_LAB_DIR = "/var/lib/sparklab"  # inside each node: faults/ and config/

# Spark CX7 twin interfaces and their RoCE device names, per QSFP port.
PORT_TWINS: dict[int, tuple[str, str]] = {
    0: ("enp1s0f0np0", "enP2p1s0f0np0"),
    1: ("enp1s0f1np1", "enP2p1s0f1np1"),
}
ALL_FABRIC_INTERFACES: tuple[str, ...] = PORT_TWINS[0] + PORT_TWINS[1]
ROCE_NAMES: dict[str, str] = {
    "enp1s0f0np0": "rocep1s0f0",
    "enp1s0f1np1": "rocep1s0f1",
    "enP2p1s0f0np0": "roceP2p1s0f0",
    "enP2p1s0f1np1": "roceP2p1s0f1",
}
DEFAULT_PORTS: tuple[str, str] = PORT_TWINS[1]


MAX_LAB_ID = 39
"""Four sets of ten: each full e2e run takes ten labs (tests/e2e/conftest.py), so up to four
runs can share the machine. Interface names stay within Linux's 15 characters at 39."""


def node_name(index: int) -> str:
    """spark-a, spark-b, ... spark-z, then spark-aa ... (16+ node labs stay readable)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    if index < 26:
        return f"spark-{letters[index]}"
    return f"spark-{letters[index // 26 - 1]}{letters[index % 26]}"


@dataclass(frozen=True)
class LabIdentity:
    lab_id: int

    @classmethod
    def from_env(cls) -> LabIdentity:
        raw = os.environ.get("SPARKLAB_ID", "0").strip() or "0"
        if not raw.isdigit() or not 0 <= int(raw) <= MAX_LAB_ID:
            raise LabError(f"SPARKLAB_ID must be an integer 0-{MAX_LAB_ID}, got {raw!r}", 2)
        return cls(int(raw))

    @property
    def prefix(self) -> str:
        return f"sparklab{self.lab_id}"

    @property
    def state_dir(self) -> Path:
        return SPARKLAB_ROOT / str(self.lab_id)

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def fabric_netns(self) -> str:
        return f"{self.prefix}-fabric"

    @property
    def subnet_prefix(self) -> str:
        return f"10.213.{self.lab_id}"

    @property
    def host_address(self) -> str:
        return f"{self.subnet_prefix}.1"

    def netns(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    def host_veth(self, index: int) -> str:
        return f"{self.prefix}m{index}"

    def mgmt_address(self, index: int) -> str:
        return f"{self.subnet_prefix}.{11 + index}"

    # --jump-host: the jump node sits on the management bridge; the Sparks sit behind it on
    # 10.213.<ID>.128/25, a bridge inside the jump node's namespace. The host's own route for
    # the /24 points at the management bridge, where nobody answers for .128-.255: a direct
    # connection fails on the lab bridge (no route leaves the machine), only the jump's sshd
    # (direct-tcpip, as a real jump host) reaches them. The jump node does not forward packets.
    JUMP_NODE = "jump"
    JUMP_HOST_INDEX = 99  # its host-side veth: sparklab<ID>m99

    @property
    def jump_address(self) -> str:
        return f"{self.subnet_prefix}.10"

    @property
    def jump_inner_address(self) -> str:
        return f"{self.subnet_prefix}.129"

    def inner_address(self, index: int) -> str:
        return f"{self.subnet_prefix}.{140 + index}"

    def node_dir(self, node: str) -> Path:
        return self.state_dir / "nodes" / node


def require_root_linux() -> None:
    """The lab needs Linux namespaces and root; say so plainly instead of failing later."""
    if platform.system() != "Linux":
        raise LabError(f"the sparkctl lab needs Linux (network namespaces); this is "
                       f"{platform.system()}", 2)
    if os.geteuid() != 0:
        raise LabError("the sparkctl lab needs root (network namespaces, mounts): "
                       "run it with sudo", 2)
