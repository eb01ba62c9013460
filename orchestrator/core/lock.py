"""The cluster lock: one mutating sparkctl run per cluster at a time.

It lives on the head (`mkdir /var/lib/sparkctl/lock` is atomic) and names its holder. A run
that changes nothing needs no lock: the executor's first facts gathering only looks at it (a
lock held by another run is refused as before, at no round trip of its own), and the run takes
it just before its first change, on condition that nobody took it since the look (a counter
on the head, `lock-generation`): otherwise the facts it judged may be stale, and it stops with
nothing changed. So a no-change `up` costs one command per node, and its release none. A lock
older than two hours, or left by a dead process of this very controller, is stale and taken
over; --break-lock takes it from a run that is gone elsewhere.
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
import uuid
from datetime import UTC, datetime
from typing import Any

from orchestrator.errors import LockError, SparkctlError
from orchestrator.remote.facts import gather_facts
from orchestrator.remote.transport import Transport

log = logging.getLogger("sparkctl.lock")

LOCK_DIR = "/var/lib/sparkctl/lock"
LOCK_STALE_SECONDS = 2 * 3600


class ClusterLock:
    def __init__(self, head: str, transport: Transport, command: str, break_lock: bool = False) -> None:
        self.head = head
        self.transport = transport
        self.break_lock = break_lock
        self.held = False
        self.generation: int | None = None
        """The counter seen by peek: the lazy take succeeds only if it has not moved."""
        self.owner = {
            "token": uuid.uuid4().hex,
            "user": getpass.getuser(),
            "controller": socket.gethostname(),
            "pid": os.getpid(),
            "command": command,
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
        }

    def request(self, force: bool = False) -> dict[str, Any]:
        """The facts request that takes the lock (merged into the head's first gathering)."""
        owner = {**self.owner, "break": force or self.break_lock}
        if self.generation is not None:
            owner["generation"] = self.generation
        return {"lock": owner, "lock_stale_seconds": LOCK_STALE_SECONDS}

    @staticmethod
    def peek_request() -> dict[str, Any]:
        """The facts request that only looks at the lock (merged into the first gathering)."""
        return {"lock_peek": True}

    def judge_peek(self, answer: dict[str, Any]) -> None:
        """Refuse now when another live run holds the lock (as taking it would); remember the
        counter the later take is conditioned on."""
        self.generation = int(answer.get("generation") or 0)
        if answer.get("free", True):
            return
        holder = answer.get("holder") or {}
        if (_holder_is_gone(holder) or self.break_lock
                or float(answer.get("age") or 0) > LOCK_STALE_SECONDS):
            return  # taken over when the run takes it
        raise LockError(_locked_message(holder))

    def accept(self, answer: dict[str, Any]) -> None:
        """Judge the gatherer's answer to request(); raise LockError when another run holds it."""
        if not answer.get("held") and _holder_is_gone(answer.get("holder") or {}):
            answer = gather_facts(self.transport, self.request(force=True)).lock or {}
        if answer.get("moved"):
            raise LockError(
                f"another sparkctl run took the cluster lock on {self.head} after this one "
                "looked at the cluster (what it judged may have changed since); nothing was "
                "changed: run the command again")
        if not answer.get("held") and answer.get("error"):
            from orchestrator.core.disks import describe_os_error

            raise SparkctlError(f"{self.head}: cannot take the cluster lock: "
                                + describe_os_error(answer["error"]))
        if not answer.get("held"):
            raise LockError(_locked_message(answer.get("holder") or {}))
        self.held = True

    def ensure(self) -> None:
        """Take the lock now, with its own round trip, unless a gathering already took it."""
        if not self.held:
            self.accept(gather_facts(self.transport, self.request()).lock or {})

    def release(self) -> None:
        if not self.held:
            return
        release = (f"grep -q {self.owner['token']} {LOCK_DIR}/owner 2>/dev/null && "
                   f"rm -rf {LOCK_DIR} || true")
        try:
            self.transport.run(release, sudo=True, timeout=30)
            self.held = False
        except SparkctlError as exc:
            log.warning("could not release the lock on %s: %s", self.head, exc)


def _locked_message(holder: dict[str, Any]) -> str:
    return (f"the cluster is locked by another sparkctl run: {holder.get('command', '?')} by "
            f"{holder.get('user', '?')}@{holder.get('controller', '?')} "
            f"(pid {holder.get('pid', '?')}), since {holder.get('started', '?')}. Wait for it "
            "to finish; if that run is gone, run again with --break-lock")


def _holder_is_gone(holder: dict[str, Any]) -> bool:
    """A lock left by a run on this very controller whose process has died is stale."""
    if holder.get("controller") != socket.gethostname():
        return False
    pid = holder.get("pid")
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
