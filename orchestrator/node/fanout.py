"""Model fan-out between nodes (runs in a container or on a node as `python3 -c`, stdlib only).

    python3 -c SCRIPT manifest '{"hub": ..., "repos": [...], "allow": [...], "deny": [...]}'
    python3 -c SCRIPT recv '{"listen": "FABRIC_IP", "streams": N}'  < plan JSON (token inside)
    python3 -c SCRIPT send '{"host": "PEER_IP"}'  < job JSON (token, port and streams inside)

manifest: per repository, its files (snapshot name -> blob), each blob's size, sha256 and the
    sha256 of every CHUNK bytes; computed once and cached beside the model (`<repo>/.sparkctl/`,
    keyed by size, mtime and inode), so later runs hash only what changed.
recv: takes every repository of a copy at once (the plan lists them, each with its root), so
    one receiver and one sender per peer share the streams over all files; checks what this
    node already has (final files by their cached or fresh hash, partial `*.sparkctl-part`
    files chunk by chunk), checks free space, prints one JSON line (the port it listens on,
    the chunks it needs, how many connections it waits for), then takes chunks over raw TCP
    on the fabric address only, from connections that first present the one-time token it
    was given on stdin. Every chunk is hashed and compared with the head's (fanout_io.py:
    spliced into the partial file, hashed from the page cache); a file is renamed into place
    when its last chunk is in and right; links and refs are made last.
send: streams the chunks the receiver asked for over N parallel connections (sendfile),
    printing `{"sent": bytes}` lines as it goes. It may start before the receiver is ready: it
    waits for the job on stdin (the receiver's port and stream count are in it); an empty
    stdin (nothing to copy) ends it quietly.
"""
import contextlib
import errno
import json
import os
import queue
import socket
import sys
import threading
import time

IDLE_SECONDS = 120.0
LATE_CONNECTION_SECONDS = 10.0
PROGRESS_SECONDS = 0.5
"""How often the sender says how much it has sent (the controller's bar, rate and ETA)."""


LINK_ERRNOS = {errno.EADDRNOTAVAIL, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN,
               errno.ETIMEDOUT, errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED,
               errno.EPIPE}
"""What a fabric link that went away looks like to a socket (a cable pulled, an address gone)."""


def on_the_wire(exc):
    """Whether EXC is the network's doing (the controller then names the link), not a disk's."""
    return isinstance(exc, (ConnectionError, socket.timeout)) or (
        isinstance(exc, OSError) and exc.errno in LINK_ERRNOS)


def said(exc):
    """An OSError as a person reads it ("Cannot assign requested address"), never its repr."""
    if isinstance(exc, socket.timeout):
        return "no data for %d s (timed out)" % int(IDLE_SECONDS)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def connection_count(streams, need):
    """How many connections a copy uses: both sides compute it, so the receiver knows when
    the last one has come."""
    return max(1, min(int(streams), len(need)))


def cpu_ticks():
    """(busy, all) CPU ticks of the whole node so far (/proc/stat), or None where unreadable."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(t) for t in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + ticks[4]  # idle + iowait
    return sum(ticks) - idle, sum(ticks)


def busy_share(before, after=None):
    """The node's CPU busy share since `before` (0..1): near 1, the copy is CPU-bound here.
    None when unknown (no /proc/stat, or a copy shorter than one clock tick)."""
    after = after or cpu_ticks()
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]), 3)


if "manifest" not in globals():  # run as a file or imported (tests); nodes get one script
    try:
        from orchestrator.node.fanout_manifest import free_bytes, manifest, out
    except ImportError:
        from fanout_manifest import free_bytes, manifest, out  # type: ignore
if "Receiver" not in globals():
    try:
        from orchestrator.node.fanout_receiver import END, HEADER, Receiver, safe_join
    except ImportError:
        from fanout_receiver import END, HEADER, Receiver, safe_join  # type: ignore
if "read_line" not in globals():
    try:
        from orchestrator.node.stdin_watch import FINISHED, read_line
    except ImportError:
        from stdin_watch import FINISHED, read_line  # type: ignore


def read_stdin(args):
    """The plan or job: one JSON line on stdin (None: stdin closed without one). With "watch"
    (stdin_watch.py), a copy stops at once when the controller goes away, keeping what
    arrived for the next run."""
    line = read_line(args.get("watch"))
    return json.loads(line) if line.strip() else None


def finish(line):
    FINISHED.set()  # from here on the controller may close stdin: it has what it needs
    out(line)


def recv(args):
    plan = read_stdin(args)
    if plan is None:
        return 0
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
    short = r.space_short()
    if short:
        root, need, free = short
        out({"error": "space", "need": need, "free": free, "path": root})
        return 3
    for i in [i for i, missing in r.need.items() if not missing]:
        f = r.files[i]
        if not os.path.isfile(safe_join(f["root"], f["rel"])):
            r.finish_file(i)  # every chunk of its partial was already right (or it is empty)
    if not need_list:
        r.links()
        for cache in r.caches.values():
            cache.save()
        out({"port": 0, "need": [], "need_bytes": 0, "have": have, "total": total,
             "streams": 0})
        finish({"done": True, "received": 0})
        return 0
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args["listen"], 0))  # the fabric address only, never 0.0.0.0
        sock.listen(16)
    except OSError as exc:  # the address is gone from the node (its link went down)
        out({"error": "listen", "message": said(exc), "link": True})
        return 6
    # the connections it waits for (no more than chunks to send): the sender opens that many
    streams = connection_count(args.get("streams", 4), need_list)
    out({"port": sock.getsockname()[1], "need": need_list, "need_bytes": need_bytes,
         "have": have, "total": total, "streams": streams})
    threads = []

    def serve(conn):
        try:
            r.take(conn)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                root = getattr(exc, "root", r.files[0]["root"])
                r.error = {"error": "space", "message": str(exc), "path": root,
                           "free": free_bytes(root), "need": need_bytes - r.received}
            elif on_the_wire(exc):
                r.error = r.error or {"error": "io", "message": said(exc), "link": True}
            else:
                r.error = r.error or {"error": "io", "message": str(exc)}
        except ValueError as exc:
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
    expected = streams
    accepted, complete_since, ticks = 0, None, None
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
        if accepted == 1:
            ticks = cpu_ticks()
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
    finish({"done": True, "received": r.received, "cpu_busy": busy_share(ticks)})
    return 0


# ---------------------------------------------------------------- sending


def send(args):
    job = read_stdin(args)
    if job is None:
        return 0  # nothing was needed: the controller closed stdin without a job
    args = dict(args, **{k: job[k] for k in ("port", "streams") if k in job})
    files, token = job["files"], job["token"].encode()  # files: [root, rel] in the plan's order
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
                errors.append((f"cannot connect to the receiver at {args['host']}:"
                               f"{args['port']}: {said(exc)}", on_the_wire(exc)))
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
                    handles[i] = stack.enter_context(open(safe_join(*files[i]), "rb"))  # noqa: SIM115
                conn.sendall(HEADER.pack(i, off, length))
                n = conn.sendfile(handles[i], off, length)
                if n != length:
                    raise ConnectionError(f"{files[i][1]}: sent {n} of {length} bytes")
                sent[0] += length
            conn.sendall(HEADER.pack(END, 0, 0))
            if conn.recv(1) != b"K":
                raise ConnectionError("the receiver did not confirm")
            stack.close()
        except Exception as exc:  # reported as a line, then exit 1
            errors.append((said(exc) if on_the_wire(exc) else f"{type(exc).__name__}: {exc}",
                           on_the_wire(exc)))
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, daemon=True)
               for _ in range(connection_count(args.get("streams", 4), job["need"]))]
    started = time.monotonic()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(timeout=PROGRESS_SECONDS)
        try:  # the controller went away (Ctrl-C): a broken pipe ends the copy
            out({"sent": sent[0], "seconds": round(time.monotonic() - started, 3)})
        except (BrokenPipeError, OSError):
            os._exit(9)
    if errors:
        message, link = errors[0]
        out({"error": "send", "message": message, "sent": sent[0], "link": link})
        return 1
    finish({"sent": sent[0], "seconds": round(time.monotonic() - started, 3), "done": True})
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
