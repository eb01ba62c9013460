"""The gateway's master key, for `sparkctl chat --gateway` (runs on the gateway's node as root,
`python3 -c`; Python 3.8+, standard library only).

`gateway_key.py CONFIG`: prints the router config's `api_key` alone (nothing when the gateway
has none), so only that key travels to the controller, over SSH's stdout: never the replicas'
keys the same file holds, never on a command line. Exit 1 with the reason on stderr when the
file cannot be read.
"""
import json
import sys


def master_key(path):
    with open(path) as handle:
        return json.load(handle).get("api_key") or ""


if __name__ == "__main__":
    try:
        print(master_key(sys.argv[1]))
    except (OSError, ValueError) as exc:
        sys.stderr.write("%s: %s\n" % (sys.argv[1], exc))
        sys.exit(1)
