"""Whether every node given is alive in the Ray cluster (runs on the node as `python3 -c`;
arguments: the nodes' fabric addresses; stdin: ray_nodes.py's output). Exits 0 when all are,
1 otherwise: a boot unit's ready condition for a vLLM server over Ray."""
import json
import sys

lines = [line for line in sys.stdin.read().splitlines() if line.startswith("{")]
nodes = (json.loads(lines[-1]).get("nodes") or []) if lines else []
alive = {n.get("ip") for n in nodes if n.get("alive")}
sys.exit(0 if set(sys.argv[1:]) <= alive else 1)
