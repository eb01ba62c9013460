"""Whether something accepts TCP connections at HOST PORT (runs on the node as `python3 -c`,
a shell condition of a boot plan, node/boot.py). Standard library only.

`tcp_open.py HOST PORT`: exit 0 when a connection is accepted within 3 seconds, else the
connect's errno (non-zero).
"""
import socket
import sys


def connect_errno(host, port):
    with socket.socket() as sock:
        sock.settimeout(3)
        try:
            return sock.connect_ex((host, port))
        except OSError as exc:  # a name that does not resolve, a timeout
            return exc.errno or 1


if __name__ == "__main__":
    sys.exit(connect_errno(sys.argv[1], int(sys.argv[2])))
