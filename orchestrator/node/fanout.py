"""Model fan-out between nodes (runs in a container or on a node as `python3 -c`, stdlib only).

    python3 -c SCRIPT manifest '{"hub": ..., "repos": [...], "allow": [...], "deny": [...]}'
    python3 -c SCRIPT recv '{"listen": "FABRIC_IP", "streams": N, ...}'   < plan JSON (token inside)
    python3 -c SCRIPT send '{"host": "PEER_IP", "port": P, "streams": N}' < job JSON (token inside)

manifest: per repository, its files (snapshot name -> blob), each blob's size, sha256 and the
    sha256 of every CHUNK bytes; computed once and cached beside the model (`<repo>/.sparkctl/`,
    keyed by size, mtime and inode), so later runs hash only what changed.
recv: checks what this node already has (final files by their cached or fresh hash, partial
    `*.sparkctl-part` files chunk by chunk), checks free space, prints one JSON line (the port
    it listens on, the chunks it needs), then takes chunks over raw TCP on the fabric address
    only, from connections that first present the one-time token it was given on stdin. Every
    chunk is hashed and compared with the head's (fanout_io.py: spliced into the partial file,
    hashed from the page cache); a file is renamed into place when its last chunk is in and
    right; links and refs are made last.
send: streams the chunks the receiver asked for over N parallel connections (sendfile),
    printing `{"sent": bytes}` lines as it goes.
"""
import contextlib
import errno
import hashlib
import hmac
import json
import os
import queue
import socket
import struct
import sys
import threading
import time

HEADER = struct.Struct("!IQQ")  # file index, offset, length
END = 0xFFFFFFFF
IDLE_SECONDS = 120.0
LATE_CONNECTION_SECONDS = 10.0
TOKEN_SECONDS = 10.0


def connection_count(streams, need):
    """How many connections a copy uses: both sides compute it, so the receiver knows when
    the last one has come."""
    return max(1, min(int(streams), len(need)))


if "manifest" not in globals():  # run as a file or imported (tests); nodes get one script
    try:
        from orchestrator.node.fanout_manifest import (
            CHUNK,
            PART,
            HashCache,
            cache_path,
            free_bytes,
            manifest,
            out,
        )
    except ImportError:
        from fanout_manifest import CHUNK, PART, HashCache, cache_path, free_bytes, manifest, out  # type: ignore
if "splice_exact" not in globals():
    try:
        from orchestrator.node.fanout_io import make_pipe, read_exact, receive_buffered, splice_exact
    except ImportError:
        from fanout_io import make_pipe, read_exact, receive_buffered, splice_exact  # type: ignore


# ---------------------------------------------------------------- receiving


def safe_join(root, rel):
    path = os.path.normpath(os.path.join(root, rel))
    if os.path.isabs(rel) or not path.startswith(os.path.normpath(root) + os.sep):
        raise ValueError("path outside the model folder: " + rel)
    return path


def chunk_ranges(size, chunk):
    return [(off, min(chunk, size - off)) for off in range(0, size, chunk)] or [(0, 0)]


class Receiver:
    def __init__(self, args, plan):
        self.args, self.plan, self.root = args, plan, plan["root"]
        self.chunk = plan.get("chunk", CHUNK)
        self.files = plan["files"]  # [{"rel", "size", "sha256", "chunks"}] in the sender's order
        self.lock = threading.Lock()
        self.need = {}  # file index -> set of chunk offsets still to come
        self.fds = {}
        self.error = None
        self.received = 0
        self.last = time.monotonic()
        self.caches = {}

    def cache_for(self, rel):
        folder = rel.split(os.sep)[0]
        if folder not in self.caches:
            self.caches[folder] = HashCache(cache_path(self.root, folder))
        return self.caches[folder]

    def inspect(self):
        """Which chunks this node lacks: final files are checked by hash (cached by stat),
        wrong ones become partials; partials keep the chunks whose hashes match."""
        have = 0
        for i, f in enumerate(self.files):
            path = safe_join(self.root, f["rel"])
            part = path + PART
            if os.path.isfile(path) and not os.path.islink(path):
                got = self.cache_for(f["rel"]).compute(f["rel"], path, self.chunk)
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
                path = safe_join(self.root, self.files[i]["rel"]) + PART
                os.makedirs(os.path.dirname(path), exist_ok=True)
                self.fds[i] = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            return self.fds[i]

    def finish_file(self, i):
        f = self.files[i]
        path = safe_join(self.root, f["rel"])
        self.open_part(i)  # (nothing was sent when every chunk of the partial was right)
        with self.lock:
            fd = self.fds.pop(i)
        os.ftruncate(fd, f["size"])
        os.close(fd)
        os.replace(path + PART, path)
        self.cache_for(f["rel"]).put(f["rel"], path, f["sha256"], f["chunks"], self.chunk)

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
            if pipe is not None and length:
                got = splice_exact(conn, pipe, fd, off, length, self)
            else:
                got = receive_buffered(conn, view[:length], fd, off, self)
            if got != f["chunks"][off // self.chunk]:
                raise ValueError(f"{f['rel']}: chunk at {off} arrived corrupted")
            with self.lock:
                self.need[i].discard(off)
                done = not self.need[i]
            if done:
                self.finish_file(i)

    def links(self):
        for rel, target in self.plan.get("links", {}).items():
            path = safe_join(self.root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if os.path.islink(path) and os.readlink(path) == target:
                continue
            if os.path.lexists(path):
                os.unlink(path)
            os.symlink(target, path)
        for rel, content in self.plan.get("refs", {}).items():
            path = safe_join(self.root, rel)
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


def recv(args):
    plan = json.load(sys.stdin)
    r = Receiver(args, plan)
    total = sum(f["size"] for f in r.files)
    try:
        have = r.inspect()
    except OSError as exc:
        out({"error": "inspect", "message": str(exc)})
        return 1
    need_list = [[i, off, min(r.chunk, r.files[i]["size"] - off)]
                 for i in sorted(r.need) for off in sorted(r.need[i])]
    need_bytes = sum(n[2] for n in need_list)
    # what the partials already hold counts as written: only the rest needs new space
    free = free_bytes(r.root)
    if need_bytes > free:
        out({"error": "space", "need": need_bytes, "free": free, "path": r.root})
        return 3
    if not need_list:
        for i in [i for i, missing in r.need.items() if not missing]:
            if not os.path.isfile(safe_join(r.root, r.files[i]["rel"])):
                r.finish_file(i)
        r.links()
        for cache in r.caches.values():
            cache.save()
        out({"port": 0, "need": [], "need_bytes": 0, "have": have, "total": total, "free": free})
        out({"done": True, "received": 0})
        return 0
    for i in [i for i, missing in r.need.items() if not missing]:
        if not os.path.isfile(safe_join(r.root, r.files[i]["rel"])):
            r.finish_file(i)  # every chunk of its partial was already right (or it is empty)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args["listen"], 0))  # the fabric address only, never 0.0.0.0
    sock.listen(16)
    out({"port": sock.getsockname()[1], "need": need_list, "need_bytes": need_bytes,
         "have": have, "total": total, "free": free})
    streams = int(args.get("streams", 4))
    threads = []

    def serve(conn):
        try:
            r.take(conn)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                r.error = {"error": "space", "message": str(exc), "path": r.root,
                           "free": free_bytes(r.root), "need": need_bytes - r.received}
            else:
                r.error = r.error or {"error": "io", "message": str(exc)}
        except (ValueError, ConnectionError) as exc:
            r.error = r.error or {"error": "io", "message": str(exc)}
        finally:
            conn.close()
            if r.error:  # fail fast: the sender sees its connections drop
                out(r.error)
                os._exit(4)

    sock.settimeout(1.0)
    # Accept every connection the sender opens, even once all chunks are in: closing the
    # listener with a late connection still in its backlog resets it, and the sender would
    # report a failed copy that in fact succeeded.
    expected = connection_count(streams, need_list)
    accepted, complete_since = 0, None
    deadline = time.monotonic() + IDLE_SECONDS
    while accepted < expected and time.monotonic() < deadline:
        try:
            conn, _ = sock.accept()
        except socket.timeout:
            if time.monotonic() - r.last > IDLE_SECONDS:
                break
            if all(not missing for missing in r.need.values()):
                complete_since = complete_since or time.monotonic()
                if time.monotonic() - complete_since > LATE_CONNECTION_SECONDS:
                    break  # a sender worker that never came: nothing is missing anyway
            continue
        if not r.authentic(conn):
            conn.close()  # a stranger: it neither writes anything nor takes a sender's place
            continue
        accepted += 1
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        t = threading.Thread(target=serve, args=(conn,), daemon=True)
        t.start()
        threads.append(t)
        deadline = time.monotonic() + IDLE_SECONDS
    sock.close()
    for t in threads:
        t.join()
    left = sum(len(m) for m in r.need.values())
    if left:
        out({"error": "incomplete", "message": f"{left} chunk(s) never arrived"})
        return 5
    r.links()
    for cache in r.caches.values():
        cache.save()
    out({"done": True, "received": r.received})
    return 0


# ---------------------------------------------------------------- sending


def send(args):
    job = json.load(sys.stdin)
    root, files, token = job["root"], job["files"], job["token"].encode()
    work = queue.Queue()
    for item in sorted(job["need"], key=lambda n: -n[2]):
        work.put(item)
    sent = [0]
    errors = []

    def worker():
        try:
            conn = socket.create_connection((args["host"], int(args["port"])), timeout=30)
        except OSError as exc:
            if not work.empty():  # (otherwise the other connections carried everything)
                errors.append(f"cannot connect to the receiver: {type(exc).__name__}: {exc}")
            return
        try:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            conn.sendall(token)
            handles = {}
            stack = contextlib.ExitStack()
            while not errors:
                try:
                    i, off, length = work.get_nowait()
                except queue.Empty:
                    break
                if i not in handles:
                    handles[i] = stack.enter_context(open(safe_join(root, files[i]), "rb"))  # noqa: SIM115
                conn.sendall(HEADER.pack(i, off, length))
                n = conn.sendfile(handles[i], off, length)
                if n != length:
                    raise ConnectionError(f"{files[i]}: sent {n} of {length} bytes")
                sent[0] += length
            conn.sendall(HEADER.pack(END, 0, 0))
            if conn.recv(1) != b"K":
                raise ConnectionError("the receiver did not confirm")
            stack.close()
        except Exception as exc:  # reported as a line, then exit 1
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, daemon=True)
               for _ in range(connection_count(args.get("streams", 4), job["need"]))]
    started = time.monotonic()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(timeout=0.5)
        try:  # the controller went away (Ctrl-C): a broken pipe ends the copy
            out({"sent": sent[0], "seconds": round(time.monotonic() - started, 3)})
        except (BrokenPipeError, OSError):
            os._exit(9)
    if errors:
        out({"error": "send", "message": errors[0], "sent": sent[0]})
        return 1
    out({"sent": sent[0], "seconds": round(time.monotonic() - started, 3), "done": True})
    return 0


def main(argv):
    mode, args = argv[1], json.loads(argv[2]) if len(argv) > 2 else {}
    if mode == "manifest":
        out(manifest(args))
        return 0
    if mode == "recv":
        return recv(args)
    if mode == "send":
        return send(args)
    sys.stderr.write("usage: fanout.py manifest|recv|send JSON\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
