"""Model fan-out head -> peer on the fabric, next to iperf3 on the same link in the same run.

Three measurements, interleaved run by run on one 2-node lab (the model from `--model-mib`):
- sparkctl's fan-out (raw TCP, STREAMS parallel connections, every chunk verified): the peer's
  copy removed, then `sparkctl launch --replace`; the rate is the one its distribute step reports
  (bytes sent / seconds from the sender's start to the receiver's last verified chunk);
- the SSH alternative: one `ssh -c aes128-gcm@openssh.com` stream per file, all in parallel,
  from the head's container to the peer's (the cluster key and config sparkctl sets up), into the
  peer's HF cache folder (bytes / wall time of the whole parallel copy);
- iperf3, one TCP stream memory to memory, 3 s.
"""

from __future__ import annotations

import re

from benchmarks.labctl import Lab, Timed
from benchmarks.staging import fabric_ip

CONTAINER = "trtllm-multinode"
HF = "/root/.cache/huggingface"
RATE = re.compile(r"(spark-[a-z]+): ([\d.]+) (GB|MB) in ([\d.]+) s")
WIRE = re.compile(r"on the wire ([\d.]+) s")


def fanout_rate(launch: Timed) -> tuple[float, float, float, float | None] | None:
    """(MB/s, MB, seconds, seconds on the wire) of the distribute step's copy, from the launch
    report (on the wire: the sender's own seconds, without starting the processes)."""
    for host in launch.report.get("hosts", {}).values():
        for step in host.get("steps", []):
            if step.get("step") == "distribute":
                found = RATE.search(step.get("message", ""))
                if found:
                    size = float(found.group(2)) * (1000 if found.group(3) == "GB" else 1)
                    seconds = float(found.group(4))
                    wire = WIRE.search(step.get("message", ""))
                    return size / seconds, size, seconds, float(wire.group(1)) if wire else None
    return None


def clear_peer(lab: Lab, peer: str) -> None:
    lab.exec(peer, f"docker exec {CONTAINER} sh -c 'rm -rf {HF}/hub/models--* {HF}/drafts'")


def ssh_parallel(lab: Lab, head: str, peer: str) -> tuple[float, int, float]:
    """(MB/s, bytes, seconds): every blob of the main model, one SSH stream each, in parallel."""
    ip = fabric_ip(lab, peer)
    blobs = f"{HF}/hub/models--nvidia--Qwen3-235B-A22B-FP4/blobs"
    script = (
        f"cd {blobs} && total=$(cat * | wc -c) && s=$(date +%s.%N) && "
        f"for f in *; do ssh -F /etc/sparkctl/ssh_config -c aes128-gcm@openssh.com "
        f"-o Compression=no {ip} \"cat > {HF}/sshbench.$f\" < $f & done; wait; "
        f"e=$(date +%s.%N); echo $total $s $e")
    total, start, end = lab.exec(head, f"docker exec {CONTAINER} bash -c '{script}'").split()[-3:]
    lab.exec(peer, f"docker exec {CONTAINER} sh -c 'rm -f {HF}/sshbench.*'")
    seconds = float(end) - float(start)
    return int(total) / seconds / 1e6, int(total), seconds
