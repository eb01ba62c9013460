"""Model fan-out head -> peer on the fabric, next to iperf3 on the same link in the same run.

Three measurements, interleaved run by run on one 2-node lab (the model from `--model-mib`):
- sparkctl's fan-out (raw TCP, a connection per receiving core up to STREAMS, every chunk
  verified), as in a first launch: the server stopped (`down --server`, so no server holds the
  nodes' memory), the peer's copy removed, the head's files in its page cache (as just
  downloaded), then `sparkctl launch`; the rate is the one its distribute step reports (bytes
  sent / seconds from the sender's start to the receiver's last verified chunk), with the
  sender's own seconds and the receiver's CPU busy share beside it;
- the SSH alternative: one `ssh -c aes128-gcm@openssh.com` stream per file, all in parallel,
  from the head's container to the peer's (the cluster key and config sparkctl sets up), into the
  peer's HF cache folder (bytes / wall time of the whole parallel copy);
- iperf3, one TCP stream memory to memory, 3 s;
- the head's disk read past the page cache (dd O_DIRECT): the limit of a copy whose files are
  not in the head's page cache.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from benchmarks.labctl import BenchError, Lab, Timed
from benchmarks.staging import fabric_ip

CONTAINER = "trtllm-multinode"
HF = "/root/.cache/huggingface"


@dataclass
class Copied:
    """The distribute step's copy to one peer, from the launch's JSON report (`fanout`)."""

    mb: float
    seconds: float
    """Wall: from starting the sender to the receiver's last verified chunk."""
    wire: float | None
    """The sender's own seconds, without starting the processes."""
    cpu_busy: float | None
    """The receiver's CPU busy share (%) while it received."""

    @property
    def mb_per_s(self) -> float:
        return self.mb / self.seconds


def fanout_rate(launch: Timed, peer: str) -> Copied | None:
    """None when the launch copied nothing to the peer (its model was already there)."""
    figures: dict[str, Any] = (launch.report.get("fanout") or {}).get(peer) or {}
    if not figures.get("bytes_copied") or not figures.get("seconds"):
        return None
    busy = figures.get("receiver_cpu_busy")
    return Copied(figures["bytes_copied"] / 1e6, figures["seconds"],
                  figures.get("wire_seconds") or None, 100 * busy if busy is not None else None)


def warm_head(lab: Lab, head: str) -> None:
    """Read the head's model files once, so they are in its page cache (as after a download)."""
    lab.exec(head, f"docker exec {CONTAINER} sh -c 'cat {HF}/hub/models--*/blobs/* "
                   f"$(find {HF}/drafts -type f) > /dev/null'")


def disk_read(lab: Lab, head: str) -> float:
    """MB/s reading the head's largest model file from the disk, past the page cache."""
    out = lab.exec(head, f"docker exec {CONTAINER} sh -c 'f=$(ls -S {HF}/hub/models--*/blobs/* "
                         "| head -n1); dd if=$f of=/dev/null bs=8M iflag=direct 2>&1 | tail -n1'")
    found = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", out)
    if not found:
        raise BenchError(f"dd gave no rate: {out[-200:]}")
    return int(found.group(1)) / float(found.group(2)) / 1e6


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
