"""The gateway as data: which LiteLLM, its routing table, its container, the relays (pure).

One OpenAI-compatible address for the cluster is LiteLLM's proxy (the router Spark users
already run), in a container on one node (the head by default), pinned by digest. Its
`model_list` comes from the servers sparkctl runs: every served model name maps to each live
server serving it (replicas are deployments of one model name). Engines keep binding their
node's loopback; the gateway reaches each one at its node's fabric address through a relay
(orchestrator/node/relay.py), which is also how a rolling relaunch takes a replica out.

The master key lives only in the config file (0600, in a 0700 folder mounted read-only):
never on argv, in the container's environment (`docker inspect` shows it), or in a log.
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

LITELLM_VERSION = "1.80.11"
IMAGE_TAG = f"ghcr.io/berriai/litellm:v{LITELLM_VERSION}-stable.1"
IMAGE_DIGEST = "sha256:311eba8a74364c1303ddbaf1752395bd9b43b83290cb9a506e36ecd020466ab7"
"""The linux/arm64 manifest of IMAGE_TAG (a DGX Spark is arm64), as GitHub's package page for
berriai/litellm lists it (github.com/berriai/litellm/pkgs/container/litellm). The lab serves
the same reference (lab/sparklab/image/catalog.json) with the real proxy from PyPI inside."""
IMAGE = f"ghcr.io/berriai/litellm@{IMAGE_DIGEST}"
CONTAINER = "sparkctl-gateway"
GATEWAY_RUN = f"{RUN_DIR}/gateway"
"""gateway.json (the gateway's record, no secret) and relay-<server>.{json,pid,log}."""
GATEWAY_CONFIG_DIR = f"{CONFIG_DIR}/gateway"
CONFIG_FILE = f"{GATEWAY_CONFIG_DIR}/config.yaml"
RECORD_MODE = 0o600
"""gateway.json: private (its fingerprint is derived from the config, which holds the key)."""
FINGERPRINT_ROUNDS = 200_000
"""PBKDF2-SHA256 rounds over the config and a random salt: the record's fingerprint is no
offline oracle for guessing the master key (about 0.1 s per guess, a new salt per record)."""
LOG_CONFIG_FILE = f"{GATEWAY_CONFIG_DIR}/logging.json"
LOG_CONFIG = {
    "version": 1, "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain",
                            "stream": "ext://sys.stderr"}},
    "loggers": {"uvicorn": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
                "uvicorn.access": {"handlers": [], "level": "CRITICAL", "propagate": False}},
}
"""LiteLLM's `--log_config` (uvicorn's logging, at the pinned version): everything as before
but the access log, whose request lines hold the query string, and a client may put its key
there (`?api_key=...`): a key must never sit in clear in `docker logs`."""
COOLDOWN_SECONDS = 5
"""How long LiteLLM keeps a replica out after a failed call: retried on another one meanwhile,
then tried again (put back when it answers)."""
ENVIRONMENT = {
    # no outbound calls: the model price map is the one inside the package, no telemetry
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_TELEMETRY": "False",
    "LITELLM_LOG": "INFO",
}


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
    """The server's API key (`launch --api-key-file`), read from its node's file: LiteLLM sends
    it to this replica (it is in the 0600 config file only)."""

    @property
    def api_base(self) -> str:
        return f"http://{self.address}:{self.port}/v1"


@dataclass(frozen=True)
class GatewaySpec:
    node: str
    host: str
    port: int
    replicas: tuple[Replica, ...]
    key: Secret | None = field(default=None, compare=False)
    image: str = IMAGE
    client: str = ""
    """The gateway node's fabric address: the only peer a replica's relay lets in, so nothing
    the gateway fronts answers another host without the gateway's key (issue 41.2)."""

    def models(self) -> dict[str, list[Replica]]:
        out: dict[str, list[Replica]] = {}
        for replica in self.replicas:
            out.setdefault(replica.model, []).append(replica)
        return out

    def config(self) -> dict[str, Any]:
        """LiteLLM's config (JSON is YAML): one deployment per replica, least-busy routing,
        retries on another replica, a short cooldown for one that fails."""
        deployments = [{
            "model_name": r.model,
            "litellm_params": {"model": f"openai/{r.model}", "api_base": r.api_base,
                               "api_key": r.key.reveal() if r.key else "none",
                               "timeout": 600, "stream_timeout": 600},
            "model_info": {"id": r.server},
        } for r in self.replicas]
        general: dict[str, Any] = {}
        if self.key is not None:
            general["master_key"] = self.key.reveal()
        return {
            "model_list": deployments,
            "router_settings": {"routing_strategy": "least-busy", "num_retries": 3,
                                "retry_after": 0, "allowed_fails": 0,
                                "cooldown_time": COOLDOWN_SECONDS},
            "litellm_settings": {"telemetry": False, "drop_params": True,
                                 "request_timeout": 600},
            "general_settings": general,
        }

    def config_text(self) -> str:
        return json.dumps(self.config(), indent=1, sort_keys=True) + "\n"

    def fingerprinted(self) -> list[Any]:
        """What the fingerprint covers besides the config (the node's gateway_config.py gets
        the same list as "extra"): the log config too, so a gateway running with an access
        log is restarted into the one without."""
        return [self.host, self.port, self.image, self.node, LOG_CONFIG]

    def fingerprint(self, salt: str) -> str:
        """Changes when anything the running gateway was started with changes (the key too):
        a salted slow hash (config_fingerprint), never the key."""
        return config_fingerprint(self.config_text(), self.fingerprinted(), salt)

    def record(self, salt: str | None = None) -> dict[str, Any]:
        """gateway.json (0600): what `status` shows; no secret, a fingerprint under a new salt."""
        salt = salt or new_salt()
        return {"node": self.node, "host": self.host, "port": self.port, "image": self.image,
                "key": self.key is not None, "salt": salt, "fingerprint": self.fingerprint(salt),
                "litellm": LITELLM_VERSION, "client": self.client,
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


def run_cmd(spec: GatewaySpec, cluster: str) -> str:
    """The container: host network (it binds HOST:PORT itself), the config folder read-only,
    LiteLLM's CLI as entrypoint (the image's own entrypoint script takes the same arguments)."""
    env = [f"--env={k}={v}" for k, v in sorted(ENVIRONMENT.items())]
    return docker_cmd(
        "run", "-d", "--name", CONTAINER, "--network", "host", "--restart", "unless-stopped",
        "--label", "sparkctl.managed=true", "--label", f"sparkctl.cluster={cluster}",
        "--label", "sparkctl.gateway=true", *env,
        "-v", f"{GATEWAY_CONFIG_DIR}:{GATEWAY_CONFIG_DIR}:ro", "--entrypoint", "litellm",
        spec.image, "--config", CONFIG_FILE, "--host", spec.host, "--port", spec.port,
        "--num_workers", 1, "--log_config", LOG_CONFIG_FILE)


def remove_container_cmd() -> str:
    return docker_cmd("rm", "-f", CONTAINER) + " >/dev/null 2>&1 || true"


def relay_paths(server: str) -> dict[str, str]:
    base = f"{GATEWAY_RUN}/relay-{server}"
    return {"state": f"{base}.json", "pidfile": f"{base}.pid", "log": f"{base}.log"}


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
    # a live pid that is a relay's (after a reboot the pid file's number may be another's)
    return (f"mkdir -p {quote(GATEWAY_RUN)} && if [ -f {pid} ] && grep -qsa -- "
            f"{quote(RELAY_PATTERN)} /proc/$(cat {pid})/cmdline; then echo running; "
            f"else rm -f {quote(paths['state'])}; "
            f"{start} >{quote(paths['log'])} 2>&1 </dev/null & echo started; fi")


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

    args = {"dir": GATEWAY_RUN, "host": host, "port": port, "liveliness": liveliness}
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
            f"grep -qsa -- {quote(RELAY_PATTERN)} /proc/$p/cmdline && echo $p; done; true")


def stop_relays_cmd() -> str:
    """TERM every relay, wait for them to end (KILL after 3 s), remove their files."""
    pids = f"$({relay_pids_cmd()})"
    return (f"p={pids}; [ -z \"$p\" ] || kill -TERM $p 2>/dev/null; for i in $(seq 30); do "
            f"p={pids}; [ -z \"$p\" ] && break; sleep 0.1; done; "
            f"[ -z \"$p\" ] || kill -KILL $p 2>/dev/null; "
            # relay[-]*, not the plain name: this very command must not match RELAY_PATTERN
            f"rm -f {quote(GATEWAY_RUN)}/relay[-]*; true")
