"""`make demo`: the whole sparkctl flow on a simulated two-Spark lab, then everything removed.

lab up -> up -> netcheck -> launch qwen3-235b -> one chat reply -> down -> lab down.
Each command is shown before it runs, exactly as a user would type it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
SPARKCTL = str(BIN / "sparkctl")


def step(title: str, argv: list[str], env: dict[str, str]) -> None:
    print(f"\n\033[1m==> {title}\033[0m\n$ {shlex.join(['sparkctl', *argv[1:]])}", flush=True)
    started = time.monotonic()
    proc = subprocess.run(argv, env=env, check=False)
    print(f"    ({time.monotonic() - started:.1f}s, exit {proc.returncode})", flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"demo stopped: `{shlex.join(argv[1:])}` failed (exit {proc.returncode})")


def main() -> int:
    if os.geteuid() != 0:
        print("make demo builds a simulated cluster with network namespaces: run it as root.",
              file=sys.stderr)
        return 2
    lab_id = os.environ.get("SPARKLAB_ID", "0")
    state = Path(f"/var/lib/sparklab/{lab_id}")
    inventory = str(state / "inventory.yml")
    env = {
        **os.environ,
        "SPARKLAB_ID": lab_id,
        "SPARKCTL_STATE_DIR": str(state / "controller"),
        # The lab's simulated Hugging Face accepts any token; a real one never belongs in a
        # Makefile. sparkctl sends it to the nodes as a 0600 file only.
        "HF_TOKEN": os.environ.get("HF_TOKEN", "hf_simulated_lab_token"),
    }
    step("Build a simulated 2-Spark lab (network namespaces, real sshd, real netplan, real MPI)",
         [SPARKCTL, "lab", "up", "--nodes", "2", "--topology", "b2b"], env)
    try:
        step("Bring the cluster up", [SPARKCTL, "up", "--inventory", inventory, "--yes"], env)
        step("Check the fabric", [SPARKCTL, "netcheck", "--inventory", inventory], env)
        step("Serve Qwen3-235B-A22B at TP=2 with Eagle3 (simulated engine)",
             [SPARKCTL, "launch", "qwen3-235b", "--inventory", inventory, "--yes"], env)
        step("Ask it something", [SPARKCTL, "chat", "--inventory", inventory,
                                  "Paris is great because"], env)
        step("Tear everything down", [SPARKCTL, "down", "--inventory", inventory, "--yes"], env)
    finally:
        step("Remove the lab", [SPARKCTL, "lab", "down"], env)
    print("\n\033[1mdemo complete\033[0m: nothing left running.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
