"""The fan-out receiver's data path (stdlib only; sent to the nodes with fanout.py, see there).

Where the node's Python has os.splice (3.10+, Linux), a chunk goes socket -> pipe -> file in the
kernel and is then hashed where it landed, in the page cache (mmap): one copy of every byte
fewer than recv into a buffer + write, which matters on a CPU-bound receiver (measured in
docs/performance.md). Elsewhere: recv_into a buffer, hash it, pwrite it.
"""
import contextlib
import fcntl
import hashlib
import mmap
import os
import select
import time

IDLE_SECONDS = 120.0

PIPE_BYTES = 1 << 20


def make_pipe():
    """A pipe for splice(2) (None where the node's Python has no os.splice: recv + write)."""
    if not hasattr(os, "splice"):
        return None
    r, w = os.pipe()
    with contextlib.suppress(OSError):  # a larger pipe: fewer system calls per chunk
        fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    return r, w


def splice_exact(conn, pipe, fd, off, length, receiver):
    """LENGTH bytes from the socket into the file at OFF, through the pipe, in the kernel;
    returns their sha256 (read back from the page cache)."""
    r, w = pipe
    sock = conn.fileno()
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    done = 0
    while done < length:
        try:
            n = os.splice(sock, w, min(PIPE_BYTES, length - done))
        except BlockingIOError:  # the socket has a timeout, so it is non-blocking
            if not poller.poll(IDLE_SECONDS * 1000):
                raise ConnectionError("the sender went silent mid-chunk") from None
            continue
        if not n:
            raise ConnectionError("the sender closed the connection mid-chunk")
        moved = 0
        while moved < n:
            moved += os.splice(r, fd, n - moved, offset_dst=off + done + moved)
        done += n
        receiver.received += n
        receiver.last = time.monotonic()
    return hash_written(fd, off, length)


def receive_buffered(conn, view, fd, off, receiver):
    """len(view) bytes from the socket into the buffer, hashed, written at OFF; their sha256."""
    read_exact(conn, view, receiver)
    got = hashlib.sha256(view).hexdigest()
    written = 0
    while written < len(view):
        written += os.pwrite(fd, view[written:], off + written)
    return got


def hash_written(fd, off, length):
    """sha256 of the file's bytes [off, off+length), read from the page cache (no copy)."""
    with mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ, offset=off) as view:
        return hashlib.sha256(view).hexdigest()


def read_exact(conn, view, receiver=None):
    n = 0
    while n < len(view):
        got = conn.recv_into(view[n:], min(len(view) - n, 4 << 20))
        if not got:
            raise ConnectionError("the sender closed the connection mid-chunk")
        n += got
        if receiver is not None:
            receiver.received += got
            receiver.last = time.monotonic()
