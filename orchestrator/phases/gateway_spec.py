"""The gateway as data: which router, its routing table, its process, the relays (pure).

One OpenAI-compatible address for the cluster is the SGLang Model Gateway (PyPI
`sglang-router`, pinned ROUTER_VERSION: a Rust router behind a small Python package), run as a
plain process on one node (the head by default) by orchestrator/node/gateway_router.py. It
adds and removes backends at runtime through its own API (`POST /workers`, `DELETE
/workers/ID`): a replica joins or leaves with no restart (issue 40). Its workers come from the
servers sparkctl runs: every live replica is one worker. Engines keep binding their node's
loopback; the router reaches each one at its node's fabric address through a relay
(orchestrator/node/relay.py), which lets in only the gateway's node.

The master key and the replicas' keys live only in the router's config file (0600, in a 0700
folder): the launcher reads it and builds the router's arguments itself, so no key is on a
command line, in `ps`, or in a log.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from orchestrator.commands import Secret, docker_cmd, join, quote
from orchestrator.paths import CONFIG_DIR, RUN_DIR
from orchestrator.records import Server

ROUTER_VERSION = "0.3.2"
ROUTER_DIST = "sglang-router"
"""The router's PyPI distribution: its one pin (name and version) for the whole gateway (the
launcher, the boot unit and the installer get the import name from here)."""
ROUTER = f"{ROUTER_DIST} {ROUTER_VERSION}"
"""What `status` shows."""
ROUTER_MODULE = ROUTER_DIST.replace("-", "_")
WHEEL = ROUTER_MODULE + "-" + ROUTER_VERSION + "-cp38-abi3-manylinux_2_17_{0}.manylinux2014_{0}.whl"
WHEELS = {
    # a DGX Spark is aarch64; x86_64 for the lab and other machines. The sha256 of each
    # wheel as PyPI lists it for the release: the installer refuses any other bytes
    "aarch64": (WHEEL.format("aarch64"),
                "40a10f3817b80377c2ceb326b625f24bd06eb97426e5044de722295ec7fa79c0"),
    "x86_64": (WHEEL.format("x86_64"),
               "ba5a24951e5e0357fe390782fcd1abd861448a87216832dbf2e501a1dd1548eb"),
}
INSTALL_DIR = "/opt/sparkctl"
"""What sparkctl installs on a node besides its config and state: the router's trees."""
ROUTER_TREE = f"{INSTALL_DIR}/{ROUTER_DIST}-{ROUTER_VERSION}"
"""The wheel unpacked on the gateway's node (its Rust router needs none of the package's
Python dependencies: the launcher imports only its router and its arguments). `gateway down`
keeps it (the next `gateway up` needs no download); `sparkctl down` removes it."""
WHEELHOUSE = "/usr/local/share/sparkctl/wheels"
"""Where the installer looks for the pinned wheel before asking pip's index: a Spark without
internet access (and the lab, whose nodes have none) puts the file there."""
GATEWAY_RUN = f"{RUN_DIR}/gateway"
"""gateway.json (the gateway's record, no secret), router.{pid,log}, relay-<server>.{json,pid,log}."""
GATEWAY_CONFIG_DIR = f"{CONFIG_DIR}/gateway"
CONFIG_FILE = f"{GATEWAY_CONFIG_DIR}/router.json"
ROUTER_PID = f"{GATEWAY_RUN}/router.pid"
ROUTER_LOG = f"{GATEWAY_RUN}/router.log"
RECORD_MODE = 0o600
"""gateway.json: private (its fingerprint is derived from the config, which holds the key)."""
FINGERPRINT_ROUNDS = 200_000
"""PBKDF2-SHA256 rounds over the config and a random salt: the record's fingerprint is no
offline oracle for guessing the master key (about 0.1 s per guess, a new salt per record)."""
NO_KEY = "sparkctl-replica-without-key"
"""The key the router sends a replica launched without one. Without a key of its own per
worker, the router 0.3.2 sends its MASTER key to the worker (measured): the master key must
never leave the gateway's node, and an engine without --api-key ignores the header."""
POLICY = {
    # least busy: cache_aware with both balance thresholds at their floor picks the replica
    # with the fewest requests in flight whenever the loads differ (and, between equally busy
    # ones, the one whose prefix cache matches): power_of_two needs two workers at start
    "policy": "cache_aware", "balance_abs_threshold": 0, "balance_rel_threshold": 1.0,
    # a request that fails on one replica (refused, reset, 5xx) is retried, on another one
    "retry_max_retries": 3, "retry_initial_backoff_ms": 50, "retry_max_backoff_ms": 1000,
    # a replica whose /health fails twice (5 s apart) is out of the rotation until it answers
    "health_check_interval_secs": 5, "health_check_timeout_secs": 3,
    "health_failure_threshold": 2, "health_success_threshold": 1,
    "request_timeout_secs": 600, "log_level": "warn",
}
"""The router's settings (its RouterArgs fields at ROUTER_VERSION), besides host, port, key."""


@dataclass(frozen=True)
class Replica:
    """One live server behind the gateway."""

    server: str
    model: str
    node: str
    address: str   # the node's fabric address, as the gateway's node reaches it
    port: int      # the engine's port on 127.0.0.1 of its node; the relay's on `address`
    recipe: str = ""
    key: Secret | None = field(default=None, compare=False)
    """The server's API key (`launch --api-key-file`), read from its node's file: the router
    sends it to this replica (it is in the 0600 config file only)."""

    @property
    def url(self) -> str:
        """The router's worker URL: the replica's relay."""
        return f"http://{self.address}:{self.port}"

    def worker(self) -> dict[str, Any]:
        """The router's worker entry (`POST /workers` body; holds the replica's key)."""
        return {"url": self.url, "model_id": self.model,
                "api_key": self.key.reveal() if self.key else NO_KEY}


@dataclass(frozen=True)
class GatewaySpec:
    node: str
    host: str
    port: int
    replicas: tuple[Replica, ...]
    key: Secret | None = field(default=None, compare=False)
    client: str = ""
    """The gateway node's fabric address: the only peer a replica's relay lets in, so nothing
    the gateway fronts answers another host without the gateway's key (issue 41.2)."""

    def models(self) -> dict[str, list[Replica]]:
        out: dict[str, list[Replica]] = {}
        for replica in self.replicas:
            out.setdefault(replica.model, []).append(replica)
        return out

    def config(self) -> dict[str, Any]:
        """The router's config (router.json, read by orchestrator/node/gateway_router.py):
        its address, its master key, its policy and one worker per replica."""
        return {"host": self.host, "port": self.port,
                "api_key": self.key.reveal() if self.key is not None else None,
                "settings": POLICY, "workers": [r.worker() for r in self.replicas]}

    def config_text(self) -> str:
        return json.dumps(self.config(), indent=1, sort_keys=True) + "\n"

    def fingerprinted(self) -> list[Any]:
        """What the fingerprint covers besides the config (the node's gateway_workers.py gets
        the same list as "extra")."""
        return [self.host, self.port, ROUTER, self.node]

    def fingerprint(self, salt: str) -> str:
        """Changes when anything the running gateway was started with changes (the key too):
        a salted slow hash (config_fingerprint), never the key."""
        return config_fingerprint(self.config_text(), self.fingerprinted(), salt)

    def record(self, salt: str | None = None) -> dict[str, Any]:
        """gateway.json (0600): what `status` shows; no secret, a fingerprint under a new salt."""
        salt = salt or new_salt()
        return {"node": self.node, "host": self.host, "port": self.port, "router": ROUTER,
                "key": self.key is not None, "salt": salt, "fingerprint": self.fingerprint(salt),
                "client": self.client,
                "replicas": [{"server": r.server, "model": r.model, "node": r.node,
                              "address": r.address, "port": r.port, "recipe": r.recipe}
                             for r in self.replicas]}


def new_salt() -> str:
    return secrets.token_hex(16)


def config_fingerprint(config_text: str, extra: list[Any], salt: str) -> str:
    """PBKDF2-SHA256 over the config text (the key is in it) and what else the gateway was
    started with; orchestrator/node/gateway_config.py computes the same on the node."""
    text = config_text + json.dumps(extra)
    return hashlib.pbkdf2_hmac("sha256", text.encode(), salt.encode(),
                               FINGERPRINT_ROUNDS).hex()


def matches(record: dict[str, Any], spec: GatewaySpec) -> bool:
    """Whether the record was written for SPEC (a record without a salt, from before the
    salted fingerprint, never matches: the next `up` rewrites it)."""
    salt = record.get("salt")
    return isinstance(salt, str) and bool(salt) and record.get("fingerprint") == spec.fingerprint(salt)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def install_cmd() -> str:
    """Unpack the pinned wheel into ROUTER_TREE unless it is there (orchestrator/node/
    router_install.py: the sha256 checked before a byte is unpacked)."""
    from orchestrator.node import script

    args = {"tree": ROUTER_TREE, "module": ROUTER_MODULE, "version": ROUTER_VERSION,
            "requirement": f"{ROUTER_DIST}=={ROUTER_VERSION}", "wheels": WHEELS,
            "wheelhouse": WHEELHOUSE}
    return "python3 -c " + quote(script("router_install.py")) + " " + quote(
        json.dumps(args, sort_keys=True))


def start_cmd() -> str:
    """Start the router detached (setsid) through its launcher; its argument names files,
    never a key: the launcher reads the keys from CONFIG_FILE (0600) itself."""
    from orchestrator.node import script

    args = json.dumps({"config": CONFIG_FILE, "tree": ROUTER_TREE, "module": ROUTER_MODULE,
                       "pidfile": ROUTER_PID}, sort_keys=True)
    start = join(["setsid", "python3", "-c", script("gateway_router.py"), args])
    return (f"mkdir -p {quote(GATEWAY_RUN)} && rm -f {quote(ROUTER_PID)} && "
            f"{{ {start} >{quote(ROUTER_LOG)} 2>&1 </dev/null & }}")


def stop_router_cmd() -> str:
    """TERM the router (found by its pid file, kept only while that pid is still the
    router's), KILL it after 5 s, remove its pid file."""
    pid = quote(ROUTER_PID)
    alive = (f"[ -f {pid} ] && grep -qsa -- {quote(ROUTER_PATTERN)} /proc/$(cat {pid})/cmdline")
    return (f"if {alive}; then kill -TERM $(cat {pid}) 2>/dev/null; for i in $(seq 50); do "
            f"{alive} || break; sleep 0.1; done; {alive} && kill -KILL $(cat {pid}); fi; "
            f"rm -f {pid}; true")


LEGACY_CONTAINER = "sparkctl-gateway"
"""The LiteLLM container an sparkctl before issue 40 ran the gateway in: removed when the router
takes its place (it would hold the port)."""


def remove_legacy_cmd() -> str:
    return docker_cmd("rm", "-f", LEGACY_CONTAINER) + " >/dev/null 2>&1 || true"


def workers_cmd() -> str:
    """The node script that reads and changes the router's workers (stdin: its request)."""
    from orchestrator.node import script

    return "python3 -c " + quote(script("gateway_workers.py"))


def relay_paths(server: str) -> dict[str, str]:
    base = f"{GATEWAY_RUN}/relay-{server}"
    return {"state": f"{base}.json", "pidfile": f"{base}.pid", "log": f"{base}.log",
            "args": f"{base}.args"}


def relay_start_cmd(replica: Replica, client: str) -> str:
    """Start the replica's relay, detached, unless one for it already runs. It lets in only
    CLIENT (the gateway node's fabric address): a replica bound to loopback without a key must
    not answer other hosts through it."""
    from orchestrator.node import script

    paths = relay_paths(replica.server)
    args = json.dumps({"listen": replica.address, "port": replica.port,
                       "target": replica.port, "state": paths["state"],
                       "pidfile": paths["pidfile"], "allow": [client]}, sort_keys=True)
    start = join(["setsid", "python3", "-c", script("relay.py"), args])
    pid = quote(paths["pidfile"])
    # its arguments kept beside it: BOOT_UNIT starts it again from them after a reboot
    keep = f"printf '%s\\n' {quote(args)} >{quote(paths['args'])}"
    # a live pid that is a relay's (after a reboot the pid file's number may be another's)
    return (f"mkdir -p {quote(GATEWAY_RUN)} && {keep} && if [ -f {pid} ] && grep -qsa -- "
            f"{quote(RELAY_PATTERN)} /proc/$(cat {pid})/cmdline; then echo running; "
            f"else rm -f {quote(paths['state'])}; "
            f"{start} >{quote(paths['log'])} 2>&1 </dev/null & echo started; fi")


BOOT_UNIT = "sparkctl-gateway.service"
"""On every node that holds a piece of the gateway (its router, a relay): at boot it starts
them again (orchestrator/node/gateway_boot.py), as `launch --persist`'s units bring servers
back. `gateway down` disables and removes it."""
BOOT_UNIT_PATH = f"/etc/systemd/system/{BOOT_UNIT}"
GATEWAY_BOOT_DIR = f"{CONFIG_DIR}/boot/gateway"
"""The boot script, the relay and the router's launcher as files, and the boot plan."""
ADDRESS_WAIT = 300
"""Seconds a relay waits at boot for its fabric address to be on the node."""


def boot_files() -> list[tuple[str, int, str]]:
    """(path, mode, text) of BOOT_UNIT and what it runs; no key is in any of them (the
    router's keys stay in CONFIG_FILE, the relays' arguments in GATEWAY_RUN hold none)."""
    from orchestrator.node import script

    d = GATEWAY_BOOT_DIR
    plan = {"run": GATEWAY_RUN, "config": CONFIG_FILE, "tree": ROUTER_TREE, "module": ROUTER_MODULE,
            "relay": f"{d}/relay.py", "router": f"{d}/gateway_router.py",
            "address_wait": ADDRESS_WAIT}
    unit = ("# Written by sparkctl (`gateway up`); `sparkctl gateway down` removes it.\n"
            "[Unit]\n"
            "Description=sparkctl: the gateway's router and relays on this node after a reboot\n"
            "Wants=network-online.target\nAfter=network-online.target\n\n"
            "[Service]\n"
            # it starts them detached and ends; they stay (KillMode=process) as `gateway up`'s do
            "Type=oneshot\nRemainAfterExit=yes\nKillMode=process\n"
            f"ExecStart=/usr/bin/python3 {d}/gateway_boot.py {d}/plan.json\n\n"
            "[Install]\nWantedBy=multi-user.target\n")
    return [(f"{d}/gateway_boot.py", 0o755, script("gateway_boot.py")),
            (f"{d}/relay.py", 0o644, script("relay.py")),
            (f"{d}/gateway_router.py", 0o644, script("gateway_router.py")),
            (f"{d}/plan.json", 0o644, json.dumps(plan, indent=1, sort_keys=True) + "\n"),
            (BOOT_UNIT_PATH, 0o644, unit)]


def boot_install_cmd() -> tuple[str, str]:
    """(command, stdin) that puts BOOT_UNIT and its files on a node and enables it."""
    from orchestrator.node import script

    request = {"files": boot_files(), "unit": BOOT_UNIT}
    return "python3 -c " + quote(script("gateway_boot.py")) + " install", json.dumps(request)


def boot_remove_cmd() -> str:
    """BOOT_UNIT disabled and its files removed (nothing when the node has none)."""
    return (f"if [ -e {quote(BOOT_UNIT_PATH)} ]; then systemctl disable {BOOT_UNIT} "
            f">/dev/null 2>&1; rm -rf -- {quote(BOOT_UNIT_PATH)} {quote(GATEWAY_BOOT_DIR)}; "
            "systemctl daemon-reload >/dev/null 2>&1; fi; true")


def relay_signal_cmd(server: str, signal: str) -> str:
    """USR1: out of the gateway (drain), USR2: back in, TERM: stop."""
    paths = relay_paths(server)
    pid = quote(paths["pidfile"])
    cmd = f"[ ! -f {pid} ] || kill -{signal} $(cat {pid}) 2>/dev/null || true"
    if signal == "TERM":  # gone first, so it cannot write its state file after the rm
        cmd += (f"; for i in $(seq 30); do [ -f {pid} ] && kill -0 $(cat {pid}) 2>/dev/null "
                "|| break; sleep 0.1; done; rm -f " + " ".join(quote(p) for p in paths.values()))
    return cmd


def probe_cmd(host: str | None = None, port: int | None = None, liveliness: bool = False) -> str:
    from orchestrator.node import script

    args = {"dir": GATEWAY_RUN, "host": host, "port": port, "liveliness": liveliness,
            "config": CONFIG_FILE}
    return "python3 -c " + quote(script("gateway_probe.py")) + " " + quote(
        json.dumps(args, sort_keys=True))


def replicas_from(servers: list[Server], address_of: Any,
                  key_of: Any = None) -> tuple[Replica, ...]:
    """Live servers as replicas, sorted; `address_of(node)` gives the fabric address and
    `key_of(server)` the API key of a server that has one. A server bound beyond its node's
    loopback (`launch --host`) is no replica: its relay would need the address it holds."""
    out = []
    for s in servers:
        record = s.record
        if not s.alive or not record.model or not record.port:
            continue
        if not is_loopback(record.host or "127.0.0.1"):
            continue
        key = key_of(s) if key_of is not None and record.api_key_file else None
        out.append(Replica(s.name, record.model, s.node, address_of(s.node), record.port,
                           record.recipe, key))
    return tuple(sorted(out, key=lambda r: (r.model, r.server)))


ROUTER_PATTERN = "/run/gateway/router[.]pid"
"""Matches the router's command line (its pid file's path is in its argument)."""
RELAY_PATTERN = "/run/gateway/relay[-]"
"""Matches a relay's command line (its state path) in /proc/PID/cmdline; the bracket keeps the
pattern from matching the grep (or sh -c) that carries it."""


def relay_pids_cmd(run_dir: str = GATEWAY_RUN) -> str:
    """The pids of the relays sparkctl started on the node, one a line (nothing when none runs):
    read from their pid files, each kept only while its process is still a relay (after a
    reboot the number may be another process's). Never a search of every process: on a host
    that runs several nodes (the lab) or other people's work, that would find what is not
    this node's."""
    return (f"for f in {quote(run_dir)}/relay-*.pid; do [ -f \"$f\" ] || continue; "
            "p=$(cat \"$f\"); case $p in ''|*[!0-9]*) continue;; esac; "
            f"grep -qsa -- {quote(RELAY_PATTERN)} /proc/$p/cmdline && echo $p; done; "
            # the router too: `sparkctl down` stops it with the relays, verify names it
            f"f={quote(run_dir)}/router.pid; [ -f \"$f\" ] && p=$(cat \"$f\") && "
            f"grep -qsa -- {quote(ROUTER_PATTERN)} /proc/$p/cmdline 2>/dev/null && echo $p; true")


def stop_relays_cmd() -> str:
    """TERM every relay and the router, wait for them to end (KILL after 3 s), remove their
    files."""
    pids = f"$({relay_pids_cmd()})"
    return (f"p={pids}; [ -z \"$p\" ] || kill -TERM $p 2>/dev/null; for i in $(seq 30); do "
            f"p={pids}; [ -z \"$p\" ] && break; sleep 0.1; done; "
            f"[ -z \"$p\" ] || kill -KILL $p 2>/dev/null; "
            # relay[-]*, not the plain name: this very command must not match RELAY_PATTERN
            f"rm -f {quote(GATEWAY_RUN)}/relay[-]* {quote(ROUTER_PID)}; true")
