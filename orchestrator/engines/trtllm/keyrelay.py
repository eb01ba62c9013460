"""An API key for trtllm-serve, which has none (its serve flags, options.json `serve_flags`,
extracted from the pinned source: no --api-key, no key variable): sparkctl's key-checking relay
(orchestrator/node/keyrelay.py) takes the server's --host:--port and trtllm-serve binds
127.0.0.1 on an inner port behind it. The relay starts in the `up` container with the server
(the same `docker exec` wrapper, before mpirun), reads the key from the node's file (the run
dir is mounted there), writes keyrelay.pid next to mpirun.pid so `down` and a relaunch stop it
with the server, and leaves /health open (what the status probe asks without a key).
"""

from __future__ import annotations

import json

from orchestrator.commands import quote
from orchestrator.engines.apikey import KeyWay, relay_inner_port
from orchestrator.paths import RUN_DIR

WAY = KeyWay("none of its own (trtllm-serve takes no key): sparkctl's key-checking relay binds "
             "--host:--port, trtllm-serve 127.0.0.1:<port+10000> behind it", ("/health",),
             relay=True)
PIDFILE = f"{RUN_DIR}/keyrelay.pid"


def inner_port(port: int) -> int:
    """The engine's own port behind the relay (launch proves it free first)."""
    return relay_inner_port(port)


def behind_relay(argv: list[str], port: int) -> list[str]:
    """trtllm-serve's words with --host 127.0.0.1 and the inner port."""
    out = list(argv)
    for flag, value in (("--host", "127.0.0.1"), ("--port", str(inner_port(port)))):
        at = len(out) - 1 - out[::-1].index(flag)  # the serve flag (mpirun has none of these)
        out[at + 1] = value
    return out


def relay_prefix(host: str, port: int, key_file: str) -> str:
    """Shell words that start the relay, detached, before the wrapper execs mpirun ("trtllm"
    in its argument marks it as this engine's process for serverctl's stop)."""
    from orchestrator.node import script

    args = json.dumps({"listen": host, "port": port, "target": inner_port(port),
                       "key_file": key_file, "open": list(WAY.open_paths), "pidfile": PIDFILE,
                       "role": "sparkctl key relay of trtllm-serve"}, sort_keys=True)
    return (f"rm -f {PIDFILE}; setsid python3 -c {quote(script('keyrelay.py'))} {quote(args)} "
            f"> {RUN_DIR}/keyrelay.log 2>&1 < /dev/null & ")
