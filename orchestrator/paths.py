"""Where sparkctl keeps what it owns on a node (docs/architecture.md, "Node-side layout").

One place, so up, launch, netcheck, status and down always agree on what is sparkctl's.
"""

from __future__ import annotations

NETPLAN_FILE = "/etc/netplan/40-sparkctl-fabric.yaml"
"""The fabric netplan file up writes (0600); no other netplan file is ever touched."""
CONFIG_DIR = "/etc/sparkctl"
"""Cluster SSH material, container sshd config, hostfile, entrypoint (mounted read-only)."""
STATE_DIR = "/var/lib/sparkctl"
"""The lock (head), the network rollback guard and its backup."""
RUN_DIR = f"{STATE_DIR}/run"
"""The server's state and logs (mounted read-write into the container)."""
SSH_CONFIG = f"{CONFIG_DIR}/ssh_config"
HOSTFILE = f"{CONFIG_DIR}/hostfile"
TOKEN_PATH = f"{CONFIG_DIR}/secrets/hf_token"
NETPLAN_BACKUP = f"{STATE_DIR}/netplan-backup.yaml"
SERVER_JSON = f"{RUN_DIR}/server.json"
LEDGER = f"{STATE_DIR}/ledger.json"
"""What sparkctl wrote on the node (sha256 per path) and what stood there before: nothing is
overwritten, restored or removed unless it is exactly what sparkctl wrote (node/ledger.py)."""
