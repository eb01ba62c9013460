"""The cluster lock's node side, sent to the node in one script with gather.py (in front of it,
remote/facts.gather_script): a run that may change nothing only peeks at the lock; the first
change takes it, on condition that nobody took it since the peek (docs/architecture.md).
Standard library only; Python 3.8.
"""

import json
import os
import subprocess
import time


def os_error(exc, where):
    """A write that failed (full disk, read-only filesystem), with the free space where it failed."""
    path = exc.filename or where
    probe = path
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    try:
        st = os.statvfs(probe or "/")
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = None
    return {"error": exc.strerror or str(exc), "errno": exc.errno, "path": path, "free_bytes": free}


LOCK_BASE = "/var/lib/sparkctl"


def _generation(base):
    """How many times the lock was taken on this head (0 before the first): a run that looked
    at the cluster without the lock takes it only if this did not move since (nobody changed
    anything in between)."""
    try:
        with open(os.path.join(base, "lock-generation")) as handle:
            return int(handle.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def peek_lock():
    """Who holds the lock, without taking it (a run that may change nothing needs no lock)."""
    lock = os.path.join(LOCK_BASE, "lock")
    answer = {"free": not os.path.isdir(lock), "generation": _generation(LOCK_BASE)}
    if not answer["free"]:
        try:
            with open(os.path.join(lock, "owner")) as handle:
                answer["holder"] = json.load(handle)
        except (OSError, ValueError):
            answer["holder"] = {}
        try:
            answer["age"] = time.time() - os.stat(lock).st_mtime
        except OSError:
            answer["age"] = 0
    return answer


def take_lock(owner, stale_seconds):
    """mkdir is atomic: the first run to create the directory holds the lock."""
    lock = os.path.join(LOCK_BASE, "lock")
    try:
        return _take_lock(LOCK_BASE, lock, owner, stale_seconds)
    except OSError as exc:
        return {"held": False, "error": os_error(exc, lock)}


def _take_lock(base, lock, owner, stale_seconds):
    os.makedirs(base, exist_ok=True)
    for _ in range(2):
        try:
            os.mkdir(lock, 0o700)
        except FileExistsError:
            try:
                with open(os.path.join(lock, "owner")) as handle:
                    holder = json.load(handle)
            except (OSError, ValueError):
                holder = {}
            age = time.time() - os.stat(lock).st_mtime
            if holder.get("token") == owner.get("token"):
                return {"held": True}
            # no owner: a run that could not write it (full disk) or died right after mkdir
            half_made = not holder.get("token") and age > 30
            if age > stale_seconds or owner.get("break") or half_made:
                subprocess.run(["rm", "-rf", lock])
                continue
            return {"held": False, "holder": holder, "age": age}
        generation = _generation(base)
        expected = owner.get("generation")
        if expected is not None and generation != expected:
            os.rmdir(lock)  # another run took it (and changed things) since this one looked
            return {"held": False, "moved": True, "generation": generation}
        try:
            with open(os.path.join(lock, "owner"), "w") as handle:
                json.dump(owner, handle)
                handle.flush()
                os.fsync(handle.fileno())
            with open(os.path.join(base, "lock-generation.new"), "w") as handle:
                handle.write(str(generation + 1))
            os.replace(os.path.join(base, "lock-generation.new"),
                       os.path.join(base, "lock-generation"))
        except OSError:
            subprocess.run(["rm", "-rf", lock])  # never leave a lock without its owner
            raise
        return {"held": True}
    return {"held": False, "holder": {}, "age": 0}
