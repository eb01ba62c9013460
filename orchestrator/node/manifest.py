"""What each model's files are on this node (runs in a container as `python3 -c`, one JSON
argument): per repository, present or not, its commit, its files with sizes and checksums of
the small ones, and the paths a copy must carry (snapshot, refs, blobs). Standard library only.
"""
import hashlib
import json
import os
import sys

args = json.loads(sys.argv[1])
def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()
def walk(top, skip_cache):
    files = {}
    for base, dirs, names in os.walk(top):
        if skip_cache:
            dirs[:] = [d for d in dirs if not (base == top and d == ".cache")]
        for name in names:
            path = os.path.join(base, name)
            size = os.stat(path).st_size
            files[os.path.relpath(path, top)] = [size, digest(path) if size <= 1048576 else None]
    return files
out = {}
for repo in args["repos"]:
    key, rev, local = repo["repo"], repo["revision"], repo.get("dir")
    entry: dict = {"present": False, "commit": None, "files": {}, "root": None, "paths": [], "blobs": {}}
    try:
        if local:
            if os.path.isdir(local):
                entry["files"] = walk(local, True)
                meta = os.path.join(local, ".cache", "huggingface", "download")
                for base, _, names in os.walk(meta):
                    for name in names:
                        if name.endswith(".metadata"):
                            with open(os.path.join(base, name)) as f:
                                entry["commit"] = f.readline().strip() or None
                            break
            entry["root"], entry["paths"] = os.path.dirname(local), [os.path.basename(local)]
            entry["present"] = "config.json" in entry["files"]
        else:
            folder = "models--" + key.replace("/", "--")
            full = os.path.join(args["hub"], folder)
            commit = rev
            ref = os.path.join(full, "refs", rev)
            if os.path.isfile(ref):
                with open(ref) as f:
                    commit = f.read().strip()
            snap = os.path.join(full, "snapshots", commit)
            entry["root"] = args["hub"]
            if os.path.isdir(snap):
                entry["commit"] = commit
                entry["files"] = walk(snap, False)
                paths = [os.path.join(folder, "snapshots", commit)]
                if os.path.isfile(ref):
                    paths.append(os.path.join(folder, "refs", rev))
                for base, _, names in os.walk(snap):
                    for name in names:
                        target = os.path.realpath(os.path.join(base, name))
                        if target.startswith(os.path.join(full, "blobs") + os.sep):
                            rel = os.path.relpath(target, args["hub"])
                            entry["blobs"][rel] = os.stat(target).st_size
                entry["paths"] = paths
            partial = [n for n in os.listdir(os.path.join(full, "blobs"))
                       if n.endswith(".incomplete")] if os.path.isdir(os.path.join(full, "blobs")) else []
            entry["present"] = "config.json" in entry["files"] and not partial
    except OSError as exc:
        entry["error"] = str(exc)
    entry["bytes"] = sum(size for size, _ in entry["files"].values())
    out[key] = entry
json.dump(out, sys.stdout)
