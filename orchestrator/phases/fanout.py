"""Model fan-out: the head's files to every peer over the fabric, at link speed, resumable and
verified (the node side is orchestrator/node/fanout.py).

Per peer, for all of a recipe's repositories at once: a receiver starts in a models container
on the peer (phases/model_tools.py; over the controller's SSH connection to that peer, a
one-time token on its stdin), checks what it already has (whole files by sha256, partial
files chunk by chunk), checks free space, and listens on the peer's fabric address only. The
sender starts in one on the head (token on stdin too) and streams the missing chunks over
STREAMS parallel raw TCP connections. Every chunk is verified against the head's manifest
before it is written; files appear under their real names only when complete.
Raw TCP was measured faster than parallel SSH streams on the lab (docs/performance.md).
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.errors import SparkctlError
from orchestrator.node import script
from orchestrator.remote.pipe import RemoteProcess
from orchestrator.remote.transport import Transport

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory
    from orchestrator.phases.model_tools import ModelTools

FANOUT_SCRIPT = "\n".join(script(name) for name in ("stdin_watch.py", "fanout_manifest.py",
                                                     "fanout_io.py", "fanout_receiver.py", "fanout.py"))
STREAMS = int(os.environ.get("SPARKCTL_FANOUT_STREAMS", "4"))
"""Parallel TCP connections per peer (fewer when fewer chunks are missing). On the lab's
2 cores 4 measured 3 % ahead of 2 (docs/performance.md); on a Spark more cores hash at once."""


def gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def node_script_cmd(tools: ModelTools, mode: str, args: dict[str, Any], interactive: bool = False) -> str:
    return tools.cmd(["python3", "-c", FANOUT_SCRIPT, mode, json.dumps(args, sort_keys=True)],
                     interactive=interactive)


@dataclass
class PeerCopy:
    peer: str
    total: int = 0
    """Bytes of the model on the head (what the peer must end up with)."""
    had: int = 0
    """Bytes the peer already had right (whole files and verified chunks of partial ones)."""
    sent: int = 0
    seconds: float = 0.0
    """From handing the (already started) sender its job to the receiver's last verified chunk
    (what the user waits for once the peer's files are checked)."""
    wire: float = 0.0
    """The sender's own seconds, first connection to the last confirmation: the transfer
    without starting the processes (comparable with iperf3)."""
    cpu_busy: float | None = None
    """The peer's CPU busy share while it received (near 1: the copy was CPU-bound there,
    every byte is hashed; see docs/performance.md)."""

    def figures(self) -> dict[str, Any]:
        """The copy in the JSON report (`fanout`, per peer): what `line` says, as numbers."""
        return {"bytes_total": self.total, "bytes_had": self.had, "bytes_copied": self.sent,
                "seconds": round(self.seconds, 3), "wire_seconds": round(self.wire, 3),
                "receiver_cpu_busy": self.cpu_busy,
                "gb_per_s": round(self.sent / self.seconds / 1e9, 3) if self.seconds else None}

    def line(self) -> str:
        rate = self.sent / self.seconds if self.seconds > 0 else 0.0
        if not self.sent:
            return f"{self.peer}: nothing to copy ({gb(self.total)} already there)"
        resumed = f", {gb(self.had)} already there" if self.had else ""
        wire = (f"; on the wire {self.wire:.2f} s ({self.sent / self.wire / 1e9:.2f} GB/s)"
                if self.wire > 0 else "")
        cpu = f", CPU {self.cpu_busy:.0%} busy there" if self.cpu_busy is not None else ""
        return (f"{self.peer}: {gb(self.sent)} in {seconds(self.seconds)} "
                f"({rate / 1e9:.2f} GB/s){resumed}{wire}{cpu}")


def seconds(value: float) -> str:
    """Tenths for a long copy, hundredths below 10 s (a sub-second copy's rate needs them)."""
    return f"{value:.1f} s" if value >= 10 else f"{value:.2f} s"


def copied_line(copies: list[PeerCopy], wall: float) -> str:
    """The distribute step's words: per peer, and in all when several peers got a copy at
    once (their links in parallel: the sum can exceed one link's rate)."""
    lines = "; ".join(copy.line() for copy in copies)
    sent = sum(copy.sent for copy in copies)
    if sum(1 for copy in copies if copy.sent) < 2 or wall <= 0:
        return lines
    return (f"{gb(sent)} to {len(copies)} peers in {seconds(wall)} "
            f"({sent / wall / 1e9:.2f} GB/s in all): {lines}")


class FanoutProgress:
    """One bar per peer (rich, when stderr is a terminal) or a plain line every few seconds."""

    def __init__(self, note: Callable[[str], None], plain_every: float = 5.0,
                 on_update: Callable[[str, int, int, float], None] | None = None) -> None:
        self.note = note
        self.on_update = on_update  # every update, whatever is shown (the dashboard's record)
        self.every = plain_every
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._rich: Any = None
        self._tasks: dict[str, Any] = {}
        if sys.stderr.isatty() and not os.environ.get("SPARKCTL_PLAIN_PROGRESS"):
            try:
                from rich.progress import (
                    BarColumn,
                    DownloadColumn,
                    Progress,
                    TimeRemainingColumn,
                    TransferSpeedColumn,
                )
                self._rich = Progress("        → {task.description}", BarColumn(),
                                      DownloadColumn(), TransferSpeedColumn(),
                                      TimeRemainingColumn(), transient=False)
            except ImportError:
                self._rich = None

    def start(self, peer: str, total: int) -> None:
        if self.on_update is not None:
            self.on_update(peer, 0, total, 0.0)
        with self._lock:
            if self._rich is not None:
                if not self._tasks:
                    self._rich.start()
                self._tasks[peer] = self._rich.add_task(peer, total=total)
            self._last[peer] = time.monotonic()

    def update(self, peer: str, done: int, total: int, rate: float) -> None:
        if self.on_update is not None:
            self.on_update(peer, done, total, rate)
        with self._lock:
            if self._rich is not None and peer in self._tasks:
                self._rich.update(self._tasks[peer], completed=done)
                return
            now = time.monotonic()
            last = self._last.get(peer, 0.0)
            if last < 0 or (now - last < self.every and done < total):
                return  # (-1: its 100% line was printed)
            self._last[peer] = -1.0 if done >= total else now
        eta = (total - done) / rate if rate > 0 else 0.0
        self.note(f"        → {peer}: {gb(done)} / {gb(total)} ({rate / 1e9:.2f} GB/s, "
                  f"ETA {eta:.0f} s)")

    def stop(self) -> None:
        with self._lock:
            if self._rich is not None and self._tasks:
                self._rich.stop()
                self._tasks.clear()



def _interrupted() -> bool:
    """The main thread is gone (Ctrl-C ended the run): stop copying, keep what arrived."""
    return not threading.main_thread().is_alive()


def space_error(node: str, path: str, need: int, free: int, during: str) -> SparkctlError:
    return SparkctlError(
        f"{node}: not enough disk space {during}: need {gb(need)} at {path}, "
        f"{gb(free)} free; free some space on {node} and run launch again")


def copy_plan(token: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The receiver's plan: every repository's files (with their chunk hashes), links and refs,
    each under its own root (the HF cache, or a local model folder's parent)."""
    chunks = {entry["chunk"] for entry in entries}
    if len(chunks) != 1:
        raise SparkctlError(f"the head's manifests disagree on the chunk size: {sorted(chunks)}")
    repos = [{"root": entry["root"], "links": entry["links"], "refs": entry["refs"],
              "files": [{"rel": rel, **info} for rel, info in sorted(entry["blobs"].items())]}
             for entry in entries]
    return {"token": token, "chunk": chunks.pop(), "repos": repos}


def link_of(inventory: Inventory, head: str, peer: str) -> tuple[str, str]:
    """(the peer's address the head copies to, the fabric link as a user finds it: each end's
    interface, `spark-a enp1s0f1np1 -> spark-b enp1s0f1np1`)."""
    node = inventory.node(peer)
    ip = inventory.mpi_address(node)
    theirs = next((name for name, cidr in (node.addresses or {}).items()
                   if cidr.split("/")[0] == ip), "?")
    network = ipaddress.IPv4Interface((node.addresses or {}).get(theirs, ip)).network
    ours = next((name for name, cidr in (inventory.node(head).addresses or {}).items()
                 if ipaddress.IPv4Interface(cidr).network == network), "?")
    return ip, f"{head} {ours} -> {peer} {theirs}"


def link_failure(peer: str, link: str, ip: str, detail: str) -> SparkctlError:
    """A copy that stopped on the wire: the node, the link and what to look at."""
    return SparkctlError(
        f"{peer}: the model copy over the fabric link {link} ({ip}) stopped: {detail}. Is the "
        "cable in and the link up? `sparkctl status` shows each link, `sparkctl netcheck` tests "
        "them; the next launch resumes the copy with only the rest")


def copy_to_peer(*, head: Transport, peer: Transport, tools: ModelTools, peer_ip: str,
                 entries: list[dict[str, Any]], progress: FanoutProgress,
                 streams: int = STREAMS, link: str | None = None) -> PeerCopy:
    """Make the peer's copy of the repositories identical to the head's `entries` (manifest
    entries with chunk hashes): one receiver and one sender for all of them, so the streams
    are shared over every file. Returns what was sent; raises SparkctlError naming the node
    (and LINK, the fabric link as link_of names it, when the copy stops on the wire)."""
    link = link or f"{head.node} -> {peer.node}"
    token = secrets.token_hex(16)
    plan = copy_plan(token, entries)
    files = [[repo["root"], f["rel"]] for repo in plan["repos"] for f in repo["files"]]
    result = PeerCopy(peer.node, total=sum(f["size"] for repo in plan["repos"]
                                           for f in repo["files"]))
    # Both get their one line on stdin and keep it open ("watch"): when this process ends
    # (Ctrl-C) or its SSH connection drops, stdin ends and they stop at once on the nodes.
    receiver = RemoteProcess(
        peer, node_script_cmd(tools, "recv", {"listen": peer_ip, "streams": streams,
                                              "watch": True}, True),
        display=tools.shown("python3 -c <fanout recv>"))
    receiver.feed(json.dumps(plan) + "\n", close=False)
    # the sender starts now and waits for its job on stdin: its start-up overlaps the
    # receiver's check of what the peer has (an empty stdin ends it, when nothing is needed)
    sender = RemoteProcess(head, node_script_cmd(tools, "send", {"host": peer_ip,
                                                                  "watch": True}, True),
                           display=tools.shown("python3 -c <fanout send>"))
    try:
        ready = receiver.first_json()
        if not ready:
            raise SparkctlError(f"{peer.node}: the fan-out receiver did not start: "
                                f"{receiver.stderr_tail()}")
        if ready.get("error") == "space":
            raise space_error(peer.node, ready["path"], ready["need"], ready["free"],
                              "for the copy")
        if ready.get("error") == "listen":  # its fabric address is gone (a cable, netplan)
            raise link_failure(peer.node, link, peer_ip, "the receiver cannot listen on "
                               f"{peer_ip}: {ready.get('message')}")
        if "error" in ready:
            raise SparkctlError(f"{peer.node}: cannot check the model files: {ready.get('message')}")
        if "port" not in ready:
            raise SparkctlError(f"{peer.node}: the fan-out receiver answered {ready}: "
                                f"{receiver.stderr_tail()}")
        result.had = int(ready["have"])
        need = ready["need"]
        if not need:
            final = receiver.first_json()
            if not final.get("done"):
                raise SparkctlError(f"{peer.node}: fan-out receiver failed: "
                                    f"{final or receiver.stderr_tail()}")
            return result
        total_need = int(ready["need_bytes"])
        progress.start(peer.node, total_need)
        started = time.monotonic()
        sender.feed(json.dumps({"token": token, "files": files, "need": need,
                                "port": ready["port"], "streams": ready["streams"]}) + "\n",
                    close=False)
        status: dict[str, Any] = {}
        while not (status.get("done") or status.get("error")):
            if _interrupted():
                raise SparkctlError(f"{peer.node}: copy interrupted "
                                    f"({gb(result.sent)} of {gb(total_need)} sent; the rest "
                                    "resumes on the next launch)")
            line = sender.first_json()
            if not line:
                break  # the sender ended without its last line: judged below
            status = line
            result.sent = int(status.get("sent", result.sent))
            elapsed = time.monotonic() - started
            progress.update(peer.node, result.sent, total_need, result.sent / max(elapsed, 1e-3))
        result.seconds = time.monotonic() - started
        result.wire = float(status.get("seconds") or 0.0)
        final = receiver.first_json()
        if final.get("error") == "space":
            raise space_error(peer.node, final.get("path", plan["repos"][0]["root"]),
                              int(final.get("need", 0)), int(final.get("free", 0)),
                              f"(the disk filled up during the copy: {final.get('message')})")
        sent = f"{gb(result.sent)} of {gb(total_need)} sent"
        if final.get("link"):  # the receiver's connections broke: the wire, not its disk
            raise link_failure(peer.node, link, peer_ip, f"the receiver on {peer.node}: "
                               f"{final.get('message')} ({sent})")
        if final.get("error"):
            raise SparkctlError(f"{peer.node}: copy failed on the receiving side: "
                                f"{final.get('message')}")
        if status.get("link"):
            raise link_failure(peer.node, link, peer_ip, f"the sender on {head.node}: "
                               f"{status.get('message')} ({sent})")
        if status.get("error") or not status.get("done"):
            raise SparkctlError(f"{peer.node}: copy from the head failed: "
                                f"{status.get('message') or sender.stderr_tail()}")
        if not final.get("done"):
            raise SparkctlError(f"{peer.node}: the receiver ended without finishing: "
                                f"{receiver.stderr_tail()}")
        result.cpu_busy = final.get("cpu_busy")
        return result
    finally:
        sender.close()
        receiver.close()
