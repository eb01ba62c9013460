"""sparkctl's file ledger (node side; runs as root; Python 3.8+, standard library only).

sparkctl never deletes or overwrites a file it did not write. Every file it writes is recorded in
/var/lib/sparkctl/ledger.json with the sha256 of what it wrote and what stood there before
(nothing, or a copy of the user's file kept under /var/lib/sparkctl/originals/). A file is only
replaced, restored or removed when what is on disk is exactly what sparkctl wrote; anything else
is left alone and reported ("left": [{"path", "reason"}]).

Sent as `python3 -c <this file> MODE ...`; answers one JSON object on stdout.
  write            stdin: JSON list of {path, mode, content, original}; original=true keeps a
                   copy of a file of the user's found at the path (netplan), else such a file is
                   left alone
  install SRC DST MODE [ROLLBACK_BACKUP ROLLBACK_MARKER CONFIRMED_SHA]
                   write file SRC's content to DST (original kept); with the rollback arguments,
                   first save what is on disk as the netplan rollback point
  undo             stdin: JSON list of paths: put back what stood there before sparkctl wrote it
  purge DIR [KEEP...]  remove DIR's contents except files sparkctl wrote that were changed since
                   (and the names KEEP directly in DIR); drop the ledger entries under DIR
  check            stdin: JSON list of paths: {path: "ours" | "changed" | "unrecorded" | "absent"}
"""

import hashlib
import json
import os
import shutil
import sys

BASE = "/var/lib/sparkctl"
LEDGER = os.path.join(BASE, "ledger.json")
ORIGINALS = os.path.join(BASE, "originals")


def sha_of(path):
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        return "directory"


def load():
    try:
        with open(LEDGER) as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def save(ledger):
    if not ledger and not os.path.exists(LEDGER):
        return
    os.makedirs(BASE, mode=0o755, exist_ok=True)
    tmp = LEDGER + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(ledger, handle, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.rename(tmp, LEDGER)


def atomic_write(path, data, mode):
    os.makedirs(os.path.dirname(path) or "/", mode=0o755, exist_ok=True)
    tmp = path + ".sparkctl-tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.rename(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def state(ledger, path):
    """ours (on disk is what sparkctl wrote), changed, unrecorded (a file sparkctl never wrote), absent."""
    current = sha_of(path)
    entry = ledger.get(path)
    if current is None:
        return "absent"
    if entry is None:
        return "unrecorded"
    return "ours" if entry.get("sha256") == current else "changed"


def why(status, path):
    if status == "changed":
        return f"{path} was changed since sparkctl wrote it: left alone"
    return f"{path} was not written by sparkctl: left alone"


def write_one(ledger, path, data, mode, keep_original):
    """Write data to path if allowed; return None or the reason it was left alone."""
    status = state(ledger, path)
    if status == "absent":
        # whatever an older entry said stood there before, the truth now is: nothing
        before = {"kind": "absent"}
    elif status == "ours":
        before = (ledger.get(path) or {}).get("before") or {"kind": "absent"}
    elif not keep_original:
        return why(status, path)
    else:
        os.makedirs(ORIGINALS, mode=0o700, exist_ok=True)
        copy = os.path.join(ORIGINALS, hashlib.sha256(path.encode()).hexdigest()[:32])
        shutil.copyfile(path, copy + ".tmp")
        os.chmod(copy + ".tmp", 0o600)
        os.rename(copy + ".tmp", copy)
        before = {"kind": "file", "copy": copy, "sha256": sha_of(copy),
                  "mode": os.stat(path).st_mode & 0o7777}
    atomic_write(path, data, mode)
    ledger[path] = {"sha256": hashlib.sha256(data).hexdigest(), "before": before}
    return None


def undo_one(ledger, path):
    """Put back what stood at path before sparkctl; return (action, reason-left-alone)."""
    status = state(ledger, path)
    entry = ledger.get(path)
    if status == "absent":
        ledger.pop(path, None)
        return "already gone", None
    if status != "ours":
        if status == "changed":
            ledger.pop(path, None)
        return None, why(status, path)
    before = entry.get("before") or {"kind": "absent"}
    if before.get("kind") == "file" and sha_of(before.get("copy", "")) == before.get("sha256"):
        with open(before["copy"], "rb") as handle:
            atomic_write(path, handle.read(), int(before.get("mode", 0o600)))
        os.unlink(before["copy"])
        action = "restored the file that was there before sparkctl"
    else:
        os.unlink(path)
        action = "removed"
    ledger.pop(path, None)
    return action, None


def save_rollback_point(ledger, path, backup, marker, confirmed_path):
    """The netplan rollback point: what is on disk now, unless it is sparkctl's own unconfirmed
    file from an unfinished run (then the point saved by that run stays)."""
    try:
        with open(confirmed_path) as handle:
            confirmed = handle.read().strip()
    except OSError:
        confirmed = ""
    have_point = os.path.exists(backup) or os.path.exists(marker)
    current = sha_of(path)
    if have_point and state(ledger, path) == "ours" and current != confirmed:
        return
    if current is None:
        if os.path.lexists(backup):
            os.unlink(backup)
        open(marker, "w").close()
    else:
        shutil.copyfile(path, backup + ".tmp")
        os.chmod(backup + ".tmp", 0o600)
        os.rename(backup + ".tmp", backup)
        if os.path.lexists(marker):
            os.unlink(marker)


def purge(ledger, directory, keep_names):
    left = []
    kept_paths = set()
    prefix = directory.rstrip("/") + "/"
    for path in sorted(p for p in ledger if p.startswith(prefix)):
        status = state(ledger, path)
        if status == "changed":
            left.append({"path": path, "reason": why(status, path)})
            kept_paths.add(path)
        ledger.pop(path, None)
    if not os.path.isdir(directory):
        return left
    for root, dirs, files in os.walk(directory, topdown=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            full = os.path.join(root, name)
            if full in kept_paths or (root == directory and name in keep_names):
                continue
            os.unlink(full)
        for name in dirs:
            full = os.path.join(root, name)
            spared = root == directory and name in keep_names
            if os.path.isdir(full) and not os.path.islink(full) and not os.listdir(full) and not spared:
                os.rmdir(full)
    if not os.listdir(directory) and not keep_names:
        os.rmdir(directory)
    return left


def main():
    try:
        return run(sys.argv[1])
    except OSError as exc:
        # a full disk or read-only filesystem: say which, where, and how much room is left
        where = exc.filename or BASE
        free = None
        probe = where
        while probe and not os.path.exists(probe):
            probe = os.path.dirname(probe)
        try:
            stat = os.statvfs(probe or "/")
            free = stat.f_bavail * stat.f_frsize
        except OSError:
            pass
        print(json.dumps({"error": exc.strerror or str(exc), "errno": exc.errno, "path": where,
                          "free_bytes": free}))
        return 1


def run(mode):
    ledger = load()
    answer = {"left": []}
    if mode == "write":
        answer["written"] = []
        for entry in json.load(sys.stdin):
            reason = write_one(ledger, entry["path"], entry["content"].encode(),
                               int(entry["mode"], 8), bool(entry.get("original")))
            if reason:
                answer["left"].append({"path": entry["path"], "reason": reason})
            else:
                answer["written"].append(entry["path"])
    elif mode == "install":
        src, dst, file_mode = sys.argv[2], sys.argv[3], int(sys.argv[4], 8)
        if len(sys.argv) > 7:
            save_rollback_point(ledger, dst, sys.argv[5], sys.argv[6], sys.argv[7])
        with open(src, "rb") as handle:
            data = handle.read()
        reason = write_one(ledger, dst, data, file_mode, True)
        answer["written"] = [] if reason else [dst]
        if reason:
            answer["left"].append({"path": dst, "reason": reason})
    elif mode == "undo":
        answer["done"] = []
        for path in json.load(sys.stdin):
            action, reason = undo_one(ledger, path)
            if reason:
                answer["left"].append({"path": path, "reason": reason})
            else:
                answer["done"].append({"path": path, "action": action})
    elif mode == "purge":
        answer["left"] = purge(ledger, sys.argv[2], set(sys.argv[3:]))
    elif mode == "check":
        answer = {path: state(ledger, path) for path in json.load(sys.stdin)}
    else:
        print(f"unknown mode {mode!r}", file=sys.stderr)
        return 2
    if mode != "check":
        save(ledger)
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
