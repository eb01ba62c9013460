"""Can this node open a TCP connection to each HOST:PORT? (runs on the node as `python3 -c`;
arguments: the timeout in seconds, then HOST:PORT words). Prints {"HOST:PORT": "ok" or the
error}. A real connection, closed at once: what a client of that server would do first.
Standard library only."""
import json
import socket
import sys

timeout = float(sys.argv[1])
out = {}
for endpoint in sys.argv[2:]:
    host, _, port = endpoint.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
        out[endpoint] = "ok"
    except (OSError, ValueError) as exc:
        out[endpoint] = str(exc) or type(exc).__name__
print(json.dumps(out))
