"""Containers on the nodes, by one reusable mechanism: a `ContainerSpec` says what to run.

TensorRT-LLM's `up` container (engines/trtllm/container.py) and the server containers of vLLM
and SGLang are all run by the same steps. The image is pulled where it is missing and its
digest must be the same on every node (phases/container_image.py). A container's whole
configuration (the docker run argv and the extra inputs it reads at start, e.g. the entrypoint
and sshd config) is hashed into a label: a running container with the same hash is left alone,
anything else is replaced. The fabric settings (NCCL/UCX/OMPI) come from the inventory's
interfaces and the node's own ibdev2netdev, nothing is hard-coded. No --rm, so a crashed
container's logs stay.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.commands import env_args, join, quote
from orchestrator.core.step import Change, NodeContext, Outcome, Step, Unchanged
from orchestrator.errors import SparkctlError
from orchestrator.inventory import Inventory, Node
from orchestrator.phases.nccl_env import nccl_environment
from orchestrator.remote.container import ContainerCommands
from orchestrator.remote.gathered import NodeFacts
from orchestrator.remote.node_facts import (
    INFINIBAND,
    ROCE_PORTS,
    ContainerInfo,
    DockerContainer,
    DockerImage,
)

HASH_LABEL = "sparkctl.config-hash"
READY_DEADLINE = 60
RESTART_POLICY = "unless-stopped"
"""What persistent containers run with: docker starts them again when the node (or docker)
restarts, but never one stopped by hand or by sparkctl (`docker stop`)."""


@dataclass(frozen=True)
class ContainerSpec:
    """One container on one node: everything `docker run` gets, and how to tell it is ready.

    Every container sparkctl runs uses the host network, the node's HF cache at
    /root/.cache/huggingface and (for engines) the fabric environment; `flags` carries the rest
    (--ipc, --gpus, ulimits, devices). `hashed` holds what the container reads at start besides
    its argv (file digests): it goes into the config hash. `ready` is a shell condition polled
    after `docker run` until it holds (READY_DEADLINE), `ready_what` names it in errors.
    """

    name: str
    image: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[tuple[str, str, bool]] = field(default_factory=list)
    """(node path, container path, read-only)."""
    labels: dict[str, str] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    hashed: dict[str, str] = field(default_factory=dict)
    ready: str | None = None
    ready_prelude: str = ""
    ready_what: str = "its readiness check"
    ready_deadline: int = READY_DEADLINE
    hint: str = ""
    """Appended to a failed start (what usually causes it)."""
    dirs: list[str] = field(default_factory=list)
    """Node directories to create (root, 0755) before `docker run`."""
    restart: str | None = None
    """docker's restart policy (`--restart`), e.g. RESTART_POLICY for a server that must come
    back after a reboot (`launch --persist`, phases/persist.py); None: docker's default, no."""

    def run_args(self) -> list[str]:
        """`docker run` arguments without the config-hash label (the hash is taken over them)."""
        args = ["run", "-d", "--name", self.name, "--network", "host", *self.flags]
        if self.restart:
            args += ["--restart", self.restart]
        args += env_args("-e", self.env)
        for src, dst, readonly in self.mounts:
            args += ["-v", f"{src}:{dst}" + (":ro" if readonly else "")]
        for key, value in self.labels.items():
            args += ["--label", f"{key}={value}"]
        return [*args, self.image, *self.command]

    def digest(self, args: list[str] | None = None) -> str:
        canonical = json.dumps({"argv": args if args is not None else self.run_args(),
                                **self.hashed}, sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def with_hash(self, args: list[str], digest: str) -> list[str]:
        return with_hash(args, digest, tail=len(self.command) + 1)


def managed_labels(inventory: Inventory, node: Node, **extra: str) -> dict[str, str]:
    """The labels `down` and `status` select sparkctl's containers of this cluster by."""
    labels = {"sparkctl.managed": "true", "sparkctl.cluster": inventory.cluster.name,
              "sparkctl.node": node.name}
    labels.update({f"sparkctl.{key}": value for key, value in extra.items()})
    return labels


def spec_facts(images: list[str], containers: list[str], user: str) -> dict[str, Any]:
    """What the container steps need to know about a node (one facts request)."""
    return {
        "images": images,
        "containers": containers,
        "files": {INFINIBAND: False},
        "ibdev2netdev": True,
        "commands": {"home": f"getent passwd {quote(user)} | cut -d: -f6"},
    }


# ---------------------------------------------------------------- pure pieces
def fabric_env(inventory: Inventory, roce_devices: list[str]) -> dict[str, str]:
    """What every engine's containers need to put NCCL/UCX on the fabric (from the inventory
    and the node's own ibdev2netdev; nothing hard-coded)."""
    return nccl_environment(inventory, roce_devices)


def roce_devices(inventory: Inventory, node_facts: NodeFacts, node: str) -> list[str]:
    """The RoCE device of each fabric interface, from the node's ibdev2netdev."""
    devices = ROCE_PORTS.read(node_facts).ports
    missing = [name for name in inventory.fabric.interfaces if name not in devices]
    if missing:
        raise SparkctlError(
            f"{node}: ibdev2netdev shows no RoCE device for {', '.join(missing)}; NCCL_IB_HCA "
            "cannot be set. Is the interface name in fabric.interfaces right for this node?"
        )
    return [devices[name].device for name in inventory.fabric.interfaces]


def hf_cache_dir(inventory: Inventory, home: str) -> str:
    path = inventory.cluster.hf_cache
    if path == "~" or path.startswith("~/"):
        return home.rstrip("/") + path[1:]
    return path


def with_hash(args: list[str], digest: str, tail: int = 3) -> list[str]:
    image_at = len(args) - tail  # IMAGE and the command close the argv
    return [*args[:image_at], "--label", f"{HASH_LABEL}={digest}", *args[image_at:]]


def run_container_cmd(spec: ContainerSpec, args: list[str], user: str, hf_cache: str,
                      remove_old: bool) -> str:
    """One remote command: dirs, remove the stale container, run, wait until it is ready.

    A container that exits meanwhile fails at once with the tail of its log; so does one whose
    readiness condition does not hold within its deadline.
    """
    name, inside = spec.name, ContainerCommands(spec.name)
    too_slow = f"{spec.ready_what} within {spec.ready_deadline}s; its log:"
    logs = f"{inside.logs_cmd('30')} 2>&1 | sed 's/^/  | /' >&2"
    steps = [f"install -d -m 0755 {quote(d)}" for d in spec.dirs]
    steps.append(f"runuser -u {quote(user)} -- mkdir -p -- {quote(hf_cache)}")
    if remove_old:
        steps.append(f"{inside.remove_cmd()} >/dev/null")
    steps.append(f"{join(['docker', *args])} >/dev/null")
    ready = spec.ready or "true"
    wait = (
        f"{spec.ready_prelude}i=0; "
        f"while :; do "
        f"running=$({inside.running_cmd()} 2>/dev/null); "
        f"if [ \"$running\" != true ]; then "
        f"echo {quote(f'container {name} exited right after start; its log:')} >&2; {logs}; exit 3; fi; "
        f"if {ready}; then exit 0; fi; "
        f"i=$((i+1)); if [ $i -ge {spec.ready_deadline * 2} ]; then "
        f"echo {quote(too_slow)} >&2; "
        f"{logs}; exit 4; fi; sleep 0.5; done")
    return " && ".join(steps) + " && { " + wait + "; }"


def describe(env: list[str], binds: list[str], image: str, labels: dict[str, str]) -> str:
    lines = [f"image {image}"] + [f"env {e}" for e in sorted(env)]
    lines += [f"volume {b}" for b in sorted(binds)]
    lines += [f"label {k}={v}" for k, v in sorted(labels.items()) if k.startswith("sparkctl.")]
    return "\n".join(lines) + "\n"


def container_diff(current: ContainerInfo, args: list[str],
                   spec: ContainerSpec | None = None) -> str:
    """What differs between the running container and the wanted one (for --dry-run)."""
    want_env = [args[i + 1] for i, a in enumerate(args) if a == "-e"]
    want_keys = {e.split("=", 1)[0] for e in want_env}
    have_env = [e for e in current.env
                if e.split("=", 1)[0] in want_keys
                or e.startswith(("NCCL_", "UCX_", "OMPI_", "PRTE_"))]
    want_labels = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--label")
    old = describe(have_env, list(current.binds), current.image, current.labels)
    new = describe(want_env, [args[i + 1] for i, a in enumerate(args) if a == "-v"],
                   spec.image if spec else args[-3], want_labels)
    name = current.name
    return "".join(difflib.unified_diff(old.splitlines(keepends=True),
                                        new.splitlines(keepends=True),
                                        fromfile=f"{name} (running)", tofile=f"{name} (wanted)"))


# ---------------------------------------------------------------- steps
SpecFor = Callable[[NodeContext], "ContainerSpec | None"]


def node_home(ctx: NodeContext) -> str:
    return ctx.facts.output("home").strip()


def node_hf_cache(ctx: NodeContext) -> str:
    """The node's HF cache directory (cluster.hf_cache of the inventory, ~ expanded)."""
    home = node_home(ctx)
    if not home and ctx.inventory.cluster.hf_cache.startswith("~"):
        raise SparkctlError(f"{ctx.node.name}: cannot find the home directory of "
                            f"{ctx.inventory.cluster.user} (getent passwd); needed for the HF cache")
    return hf_cache_dir(ctx.inventory, home)


class Container(Step):
    """A container as its spec says: started, replaced when its config hash changed or it
    stopped, left alone when it runs as wanted."""

    name = "container"

    def __init__(self, spec_for: SpecFor, name: str = "container") -> None:
        self.spec_for = spec_for
        self.name = name

    def check(self, ctx: NodeContext) -> Outcome:
        """`_judge`'s verdict with the command `apply` runs (docker rm, run, ready wait)."""
        outcome = self._judge(ctx)
        spec = self.spec_for(ctx) if isinstance(outcome, Change) else None
        if spec is None or not isinstance(outcome, Change):
            return outcome
        return replace(outcome, commands=(self._command(ctx, spec, outcome.payload),))

    def _command(self, ctx: NodeContext, spec: ContainerSpec, payload: dict[str, Any]) -> str:
        return run_container_cmd(spec, payload["args"], ctx.inventory.cluster.user,
                                 node_hf_cache(ctx), payload["remove_old"])

    def _judge(self, ctx: NodeContext) -> Outcome:
        node = ctx.node
        spec = self.spec_for(ctx)
        if spec is None:
            return Unchanged("no container here")
        name = spec.name
        args, digest = spec.run_args(), spec.digest()
        current = DockerContainer(name).read(ctx.facts)
        payload = {"args": spec.with_hash(args, digest), "remove_old": current is not None}
        if current is None:
            return Change(f"run container {name}", payload=payload)
        labels = current.labels
        if labels.get("sparkctl.managed") != "true":
            raise SparkctlError(
                f"{node.name}: a container named {name} exists but was not created by sparkctl; "
                "remove it (`docker rm -f " + name + "`) or set container.name in the inventory"
            )
        if labels.get(HASH_LABEL) != digest:
            return Change(f"replace container {name} (configuration changed)",
                          diff=container_diff(current, spec.with_hash(args, digest), spec),
                          payload=payload)
        if not current.running:
            return Change(f"replace container {name} ({current.status}, exit "
                          f"code {current.exit_code})", payload=payload)
        image = DockerImage(spec.image).read(ctx.facts, strict=False)
        if image and image.id and current.image_id and current.image_id != image.id:
            return Change(f"replace container {name} (runs an older {spec.image})",
                          payload=payload)
        return Unchanged(f"{name} running since {current.started_at}, config unchanged")

    def wanted(self, ctx: NodeContext) -> tuple[list[str], str]:
        spec = self.spec_for(ctx)
        return (spec.run_args(), spec.digest()) if spec else ([], "")

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        spec = self.spec_for(ctx)
        assert spec is not None
        command = change.commands[0] if change.commands else self._command(ctx, spec, change.payload)
        result = ctx.run(command, sudo=True, timeout=spec.ready_deadline + 120,
                         display=f"docker run {spec.name} + wait until it is ready")
        return self.done(ctx, change, [result])

    def done(self, ctx: NodeContext, change: Change, results: list[Any]) -> str | None:
        spec, result = self.spec_for(ctx), results[-1]
        if not result.ok and spec is not None:
            text = result.stderr.strip()
            if len(text) > 1500:  # keep what failed (the first line), then the log's end
                text = text.splitlines()[0] + "\n  ...\n" + text[-1300:]
            raise SparkctlError(f"{ctx.node.name}: container/{self.name}: starting {spec.name} "
                                f"failed (exit {result.exit_status}):\n{text}\n{spec.hint}")
        return None
