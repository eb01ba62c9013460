"""The fan-out receiver's state (stdlib only; sent to the nodes with fanout.py, see there).

One Receiver per copy: the files of every repository in the plan, in the sender's order (a
frame names a file by its index in that list); which chunks are still missing; the open
partial files; the hash caches beside the models.
"""
import hashlib
import hmac
import os
import struct
import threading
import time

HEADER = struct.Struct("!IQQ")  # file index, offset, length
END = 0xFFFFFFFF
TOKEN_SECONDS = 10.0

if "HashCache" not in globals():  # run as a file or imported (tests); nodes get one script
    try:
        from orchestrator.node.fanout_manifest import CHUNK, PART, HashCache, cache_path, existing, free_bytes
    except ImportError:
        from fanout_manifest import CHUNK, PART, HashCache, cache_path, existing, free_bytes  # type: ignore
if "splice_exact" not in globals():
    try:
        from orchestrator.node.fanout_io import (
            IDLE_SECONDS,
            make_pipe,
            read_exact,
            receive_buffered,
            splice_exact,
        )
    except ImportError:
        from fanout_io import IDLE_SECONDS, make_pipe, read_exact, receive_buffered, splice_exact  # type: ignore


def safe_join(root, rel):
    path = os.path.normpath(os.path.join(root, rel))
    if os.path.isabs(rel) or not path.startswith(os.path.normpath(root) + os.sep):
        raise ValueError("path outside the model folder: " + rel)
    return path


def chunk_ranges(size, chunk):
    return [(off, min(chunk, size - off)) for off in range(0, size, chunk)] or [(0, 0)]


class Receiver:
    def __init__(self, args, plan):
        self.args, self.plan = args, plan
        self.chunk = plan.get("chunk", CHUNK)
        # every repository's files in one list, in the sender's order (frames carry the index)
        self.files = [dict(f, root=repo["root"]) for repo in plan["repos"] for f in repo["files"]]
        self.lock = threading.Lock()
        self.need = {}  # file index -> set of chunk offsets still to come
        self.fds = {}
        self.error = None
        self.received = 0
        self.last = time.monotonic()
        self.caches = {}

    def cache_for(self, f):
        key = (f["root"], f["rel"].split(os.sep)[0])
        if key not in self.caches:
            self.caches[key] = HashCache(cache_path(*key))
        return self.caches[key]

    def inspect(self):
        """Which chunks this node lacks: final files are checked by hash (cached by stat),
        wrong ones become partials; partials keep the chunks whose hashes match."""
        have = 0
        for i, f in enumerate(self.files):
            path = safe_join(f["root"], f["rel"])
            part = path + PART
            if os.path.isfile(path) and not os.path.islink(path):
                got = self.cache_for(f).compute(f["rel"], path, self.chunk)
                if got["sha256"] == f["sha256"] and os.path.getsize(path) == f["size"]:
                    have += f["size"]
                    continue
                os.replace(path, part)  # wrong: keep what is right in it, resend the rest
            missing = set()
            ranges = chunk_ranges(f["size"], self.chunk)
            size = os.path.getsize(part) if os.path.isfile(part) else 0
            with open(part, "rb") if size else open(os.devnull, "rb") as fp:
                for n, (off, length) in enumerate(ranges):
                    if off + length <= size:
                        fp.seek(off)
                        if hashlib.sha256(fp.read(length)).hexdigest() == f["chunks"][n]:
                            have += length
                            continue
                    missing.add(off)
            self.need[i] = missing
        for cache in self.caches.values():
            cache.save()
        return have

    def open_part(self, i):
        with self.lock:
            if i not in self.fds:
                path = safe_join(self.files[i]["root"], self.files[i]["rel"]) + PART
                os.makedirs(os.path.dirname(path), exist_ok=True)
                self.fds[i] = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            return self.fds[i]

    def finish_file(self, i):
        f = self.files[i]
        path = safe_join(f["root"], f["rel"])
        self.open_part(i)  # (nothing was sent when every chunk of the partial was right)
        with self.lock:
            fd = self.fds.pop(i)
        os.ftruncate(fd, f["size"])
        os.close(fd)
        os.replace(path + PART, path)
        self.cache_for(f).put(f["rel"], path, f["sha256"], f["chunks"], self.chunk)

    def authentic(self, conn):
        """Whether the connection presents the one-time token first (within a few seconds)."""
        token = self.plan["token"].encode()
        got = b""
        conn.settimeout(TOKEN_SECONDS)
        try:
            while len(got) < len(token):
                piece = conn.recv(len(token) - len(got))
                if not piece:
                    return False
                got += piece
        except OSError:
            return False
        return hmac.compare_digest(got, token)

    def take(self, conn):
        """One authenticated connection: frames until END; each chunk verified before written."""
        conn.settimeout(IDLE_SECONDS)
        pipe = make_pipe()
        buf = bytearray(0 if pipe else self.chunk)
        view = memoryview(buf)
        header = bytearray(HEADER.size)
        try:
            self._take(conn, pipe, view, header)
        finally:
            for end in pipe or ():
                os.close(end)

    def _take(self, conn, pipe, view, header):
        while True:
            read_exact(conn, memoryview(header))
            i, off, length = HEADER.unpack(header)
            if i == END:
                conn.sendall(b"K")
                return
            f = self.files[i]
            if length > self.chunk or off % self.chunk or off + length > f["size"]:
                raise ValueError(f"bad frame for {f['rel']}: offset {off}, length {length}")
            fd = self.open_part(i)
            try:
                if pipe is not None and length:
                    got = splice_exact(conn, pipe, fd, off, length, self)
                else:
                    got = receive_buffered(conn, view[:length], fd, off, self)
            except OSError as exc:
                exc.root = f["root"]  # which disk filled up, for the error line
                raise
            if got != f["chunks"][off // self.chunk]:
                raise ValueError(f"{f['rel']}: chunk at {off} arrived corrupted")
            with self.lock:
                self.need[i].discard(off)
                done = not self.need[i]
            if done:
                self.finish_file(i)

    def space_short(self):
        """(root, need, free) of a filesystem that cannot take its share of the copy, or None.
        Partials already hold their good chunks: only what is missing needs new space."""
        need = {}
        for i, missing in self.need.items():
            f = self.files[i]
            dev = os.stat(existing(f["root"])).st_dev
            root, n = need.get(dev, (f["root"], 0))
            need[dev] = (root, n + sum(min(self.chunk, f["size"] - off) for off in missing))
        for root, n in need.values():
            free = free_bytes(root)
            if n > free:
                return root, n, free
        return None

    def links(self):
        """The snapshot links and refs of every repository (made last: the files are in)."""
        for repo in self.plan["repos"]:
            root = repo["root"]
            for rel, target in repo.get("links", {}).items():
                path = safe_join(root, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                if os.path.islink(path) and os.readlink(path) == target:
                    continue
                if os.path.lexists(path):
                    os.unlink(path)
                os.symlink(target, path)
            for rel, content in repo.get("refs", {}).items():
                path = safe_join(root, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                try:
                    with open(path) as f:
                        if f.read() == content:
                            continue
                except OSError:
                    pass
                with open(path + PART, "w") as f:
                    f.write(content)
                os.replace(path + PART, path)
