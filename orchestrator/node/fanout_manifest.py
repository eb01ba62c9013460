"""Model manifests for the fan-out (stdlib only): each model's files, sizes, sha256 and chunk
hashes, cached beside the model. Sent to the nodes in one script with fanout.py (see there)."""
import fnmatch
import hashlib
import json
import os
import sys

CHUNK = 32 << 20
PART = ".sparkctl-part"


def out(obj):
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def matches(name, allow, deny):
    """huggingface_hub's filter: fnmatch on the path in the repo; "dir/" means "dir/*"."""
    def fix(p):
        return p + "*" if p.endswith("/") else p
    if allow and not any(fnmatch.fnmatch(name, fix(p)) for p in allow):
        return False
    return not any(fnmatch.fnmatch(name, fix(p)) for p in deny or ())


def hash_file(path, chunk=CHUNK):
    whole, chunks = hashlib.sha256(), []
    with open(path, "rb") as f:
        while True:
            data = f.read(chunk)
            if not data:
                break
            whole.update(data)
            chunks.append(hashlib.sha256(data).hexdigest())
    return whole.hexdigest(), chunks or [hashlib.sha256(b"").hexdigest()]


class HashCache:
    """sha256 + chunk hashes of files under one folder, valid while size/mtime/inode hold."""

    def __init__(self, path):
        self.path, self.dirty = path, False
        try:
            with open(path) as f:
                self.data = json.load(f)
        except (OSError, ValueError):
            self.data = {}

    @staticmethod
    def key(path):
        st = os.stat(path)
        return [st.st_size, st.st_mtime_ns, st.st_ino]

    def get(self, rel, path, chunk=CHUNK):
        entry = self.data.get(rel)
        if entry and entry["key"] == self.key(path) and entry.get("chunk", CHUNK) == chunk:
            return entry
        return None

    def compute(self, rel, path, chunk=CHUNK, rehash=False):
        """The file's hashes: cached while size/mtime/inode hold, unless `rehash` (a blob changed
        in place with its mtime kept looks unchanged to the cache: launch --verify-models)."""
        entry = None if rehash else self.get(rel, path, chunk)
        if entry is None:
            sha, chunks = hash_file(path, chunk)
            entry = {"key": self.key(path), "sha256": sha, "chunks": chunks, "chunk": chunk}
            self.data[rel], self.dirty = entry, True
        return entry

    def put(self, rel, path, sha, chunks, chunk):
        self.data[rel] = {"key": self.key(path), "sha256": sha, "chunks": chunks, "chunk": chunk}
        self.dirty = True

    def save(self):
        if not self.dirty:
            return
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.data, f)
            os.replace(tmp, self.path)
        except OSError:
            pass  # a cache only: a full or read-only disk costs a re-hash next time


def existing(path):
    """The path itself, or its nearest ancestor that exists (a model folder not made yet)."""
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    return path or "/"


def free_bytes(path):
    st = os.statvfs(existing(path))
    return st.f_bavail * st.f_frsize


def cache_path(root, folder):
    """Where a repo's hash cache lives: beside its blobs/refs/snapshots, or in a local dir's .cache."""
    if folder.startswith("models--"):
        return os.path.join(root, folder, ".sparkctl", "hashes.json")
    return os.path.join(root, folder, ".cache", "sparkctl-hashes.json")


def manifest(args):
    want_chunks, chunk = args.get("chunks"), int(args.get("chunk") or CHUNK)
    result = {}
    for repo in args["repos"]:
        allow, deny = repo.get("allow") or [], repo.get("deny") or []
        key, rev, local = repo["repo"], repo["revision"], repo.get("dir")
        entry = {"present": False, "commit": None, "root": None, "folder": None, "files": {},
                 "blobs": {}, "links": {}, "refs": {}, "partial": [], "bytes": 0}
        try:
            if local:
                scan_local(entry, local, allow, deny)
            else:
                scan_hub(entry, os.path.expanduser(args["hub"]), key, rev, allow, deny)
            cache = HashCache(cache_path(entry["root"], entry["folder"]))
            for rel in list(entry["blobs"]):
                path = os.path.join(entry["root"], rel)
                got = cache.compute(rel, path, chunk, rehash=bool(args.get("rehash")))
                entry["chunk"] = chunk
                entry["blobs"][rel] = {"size": os.path.getsize(path), "sha256": got["sha256"]}
                if want_chunks:
                    entry["blobs"][rel]["chunks"] = got["chunks"]
                name = os.path.basename(rel)  # the hub names an LFS blob by its sha256
                if "/blobs/" in rel and len(name) == 64 and name != got["sha256"]:
                    entry.setdefault("misnamed", []).append(rel)
            if args.get("save", True):
                cache.save()
            entry["free"] = free_bytes(entry["root"])
        except OSError as exc:
            entry["error"] = str(exc)
            entry["free"] = free_bytes(entry["root"] or os.path.expanduser(args["hub"]))
        entry["bytes"] = sum(b["size"] for b in entry["blobs"].values() if b)  # (None: not hashed)
        entry["present"] = "config.json" in entry["files"] and not entry["partial"] and "error" not in entry
        result[key] = entry
    return result


def scan_local(entry, local, allow, deny):
    root, folder = os.path.dirname(local.rstrip("/")), os.path.basename(local.rstrip("/"))
    entry["root"], entry["folder"] = root, folder
    if not os.path.isdir(local):
        return
    meta = os.path.join(local, ".cache", "huggingface", "download")
    for base, dirs, names in os.walk(local):
        if base == local:
            dirs[:] = [d for d in dirs if d != ".cache"]
        for name in names:
            rel_in_repo = os.path.relpath(os.path.join(base, name), local)
            if name.endswith(PART):
                entry["partial"].append(rel_in_repo)
                continue
            if not matches(rel_in_repo, allow, deny):
                continue
            rel = os.path.join(folder, rel_in_repo)
            entry["files"][rel_in_repo] = rel
            entry["blobs"][rel] = None
    hf_meta = os.path.join(local, ".cache", "huggingface")
    for base, _, names in os.walk(hf_meta):  # hf's own bookkeeping of a local dir: copied too
        for name in names:
            if not name.endswith((".lock", ".incomplete", PART)):
                entry["blobs"][os.path.join(folder, os.path.relpath(os.path.join(base, name), local))] = None
    for base, _, names in os.walk(meta):
        for name in names:
            if name.endswith(".metadata"):
                with open(os.path.join(base, name)) as f:
                    entry["commit"] = f.readline().strip() or None
                return


def scan_hub(entry, hub, key, rev, allow, deny):
    folder = "models--" + key.replace("/", "--")
    full = os.path.join(hub, folder)
    entry["root"], entry["folder"] = hub, folder
    commit, ref = rev, os.path.join(full, "refs", rev)
    if os.path.isfile(ref):
        with open(ref) as f:
            commit = f.read().strip()
        entry["refs"][os.path.join(folder, "refs", rev)] = commit
    blobs = os.path.join(full, "blobs")
    if os.path.isdir(blobs):
        entry["partial"] = [n for n in os.listdir(blobs) if n.endswith((".incomplete", PART))]
    snap = os.path.join(full, "snapshots", commit)
    if not os.path.isdir(snap):
        return
    entry["commit"] = commit
    for base, _, names in os.walk(snap):
        for name in names:
            path = os.path.join(base, name)
            rel_in_repo = os.path.relpath(path, snap)
            if not matches(rel_in_repo, allow, deny):
                continue
            link_rel = os.path.relpath(path, hub)
            if os.path.islink(path):
                target = os.path.realpath(path)
                if not os.path.exists(target):  # a dangling link: the blob is missing
                    entry["error"] = "blob missing for " + link_rel  # not present: downloaded again
                    continue
                entry["links"][link_rel] = os.readlink(path)
                rel = os.path.relpath(target, hub)
            else:
                rel = link_rel
            entry["files"][rel_in_repo] = rel
            entry["blobs"][rel] = None
