"""A container image from one node to another over the fabric (stdlib only, run on the node
with python3 as the cluster user, who may use docker).

    python3 -c SCRIPT recv '{"listen": "FABRIC_IP", "image": IMAGE, "watch": bool}'  < token
    python3 -c SCRIPT send '{"host": "PEER_IP", "port": P, "image": IMAGE, "watch": bool}' < token

recv: listens on the fabric address only (never 0.0.0.0), prints {"port": P}, takes ONE
    connection that presents the one-time token first, and pipes what follows into
    `docker load`; the stream's sha256 must match the one the sender sends last. Then it
    prints the loaded image's ID and registry digests ({"done": true, "id": ..., "digests": ...}).
send: `docker save IMAGE` straight into the connection (frames: 4-byte length + data, a zero
    length ends it, then the stream's sha256), and prints {"done": true, "bytes": N, "id": ...}.
Nothing is written to disk on either side besides what docker itself stores. The token is the
first line on stdin; with "watch" the controller keeps stdin open and its end (Ctrl-C, a lost
SSH connection) kills `docker save`/`docker load` and ends the copy (stdin_watch.py, sent in
front of this script).
"""
import hashlib
import hmac
import json
import socket
import struct
import subprocess
import sys
import time

FRAME = struct.Struct("!I")

if "read_line" not in globals():  # run as a file or imported (tests); nodes get one script
    try:
        from orchestrator.node.stdin_watch import CHILDREN, FINISHED, read_line
    except ImportError:
        from stdin_watch import CHILDREN, FINISHED, read_line  # type: ignore
PIECE = 4 << 20
ACCEPT_SECONDS = 60.0
IDLE_SECONDS = 300.0


def out(obj):
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def inspect(image):
    proc = subprocess.run(["docker", "image", "inspect", image], capture_output=True, text=True)
    if proc.returncode != 0:
        return None, proc.stderr.strip()[-300:]
    record = json.loads(proc.stdout)[0]
    return {"id": record.get("Id"), "digests": record.get("RepoDigests") or []}, ""


def read_exact(conn, n):
    data = bytearray()
    while len(data) < n:
        piece = conn.recv(min(n - len(data), PIECE))
        if not piece:
            raise ConnectionError("the sender closed the connection mid-stream")
        data += piece
    return bytes(data)


def accept(sock, token):
    """The first connection that presents the token (strangers are dropped)."""
    deadline = time.monotonic() + ACCEPT_SECONDS
    while time.monotonic() < deadline:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            conn, _ = sock.accept()
        except socket.timeout:
            break
        conn.settimeout(10.0)
        try:
            if hmac.compare_digest(read_exact(conn, len(token)), token):
                conn.settimeout(IDLE_SECONDS)
                return conn
        except (OSError, ConnectionError):
            pass
        conn.close()
    return None


def token_of(args):
    return read_line(args.get("watch")).strip().encode()


def finish(obj):
    FINISHED.set()  # the controller has what it needs: closing stdin now is no interruption
    out(obj)


def recv(args):
    token = token_of(args)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((args["listen"], 0))
    sock.listen(4)
    out({"port": sock.getsockname()[1]})
    conn = accept(sock, token)
    sock.close()
    if conn is None:
        out({"error": "connect", "message": "the sender never connected"})
        return 4
    load = subprocess.Popen(["docker", "load"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    CHILDREN.append(load)
    digest, total = hashlib.sha256(), 0
    try:
        while True:
            (length,) = FRAME.unpack(read_exact(conn, FRAME.size))
            if not length:
                break
            data = read_exact(conn, length)
            digest.update(data)
            total += length
            load.stdin.write(data)
        theirs = read_exact(conn, 32)
    except (OSError, ConnectionError) as exc:
        load.kill()
        load.wait()
        out({"error": "io", "message": str(exc), "bytes": total})
        return 4
    if not hmac.compare_digest(theirs, digest.digest()):
        load.kill()
        load.wait()
        out({"error": "corrupt", "message": "the image stream arrived altered (sha256 differs)",
             "bytes": total})
        return 4
    load.stdin.close()
    stdout, stderr = load.stdout.read(), load.stderr.read()
    if load.wait() != 0:
        out({"error": "load", "message": (stderr or stdout).decode(errors="replace")[-400:]})
        return 4
    conn.sendall(b"K")
    conn.close()
    got, error = inspect(args["image"])
    if got is None:
        out({"error": "load", "message": "loaded, but `docker image inspect` fails: " + error})
        return 4
    finish(dict(got, done=True, bytes=total, sha256=digest.hexdigest()))
    return 0


def send(args):
    token = token_of(args)
    mine, error = inspect(args["image"])
    if mine is None:
        out({"error": "inspect", "message": error})
        return 4
    try:
        conn = socket.create_connection((args["host"], int(args["port"])), timeout=30)
    except OSError as exc:  # said as a line: the receiver would only know nobody came
        out({"error": "connect", "message": f"{type(exc).__name__}: {exc}"})
        return 4
    conn.settimeout(IDLE_SECONDS)
    conn.sendall(token)
    save = subprocess.Popen(["docker", "save", args["image"]], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    CHILDREN.append(save)
    digest, total, started = hashlib.sha256(), 0, time.monotonic()
    try:
        while True:
            data = save.stdout.read1(PIECE)
            if not data:
                break
            digest.update(data)
            total += len(data)
            conn.sendall(FRAME.pack(len(data)) + data)
        if save.wait() != 0:
            out({"error": "save", "message": save.stderr.read().decode(errors="replace")[-400:]})
            return 4
        conn.sendall(FRAME.pack(0) + digest.digest())
        # the receiver confirms once `docker load` is done: for a large image much of that
        # work comes after the stream ends, so no idle timeout here (its exit closes the socket)
        conn.settimeout(None)
        confirmed = conn.recv(1) == b"K"
    except OSError as exc:
        save.kill()
        save.wait()
        out({"error": "io", "message": f"{type(exc).__name__}: {exc}", "bytes": total})
        return 4
    finally:
        conn.close()
    if not confirmed:
        out({"error": "load", "message": "the receiver did not confirm the load", "bytes": total})
        return 4
    finish(dict(mine, done=True, bytes=total, seconds=round(time.monotonic() - started, 3)))
    return 0


def main(argv):
    mode, args = argv[1], json.loads(argv[2])
    if mode == "recv":
        return recv(args)
    if mode == "send":
        return send(args)
    sys.stderr.write("usage: imagecopy.py recv|send JSON\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
