"""up phase 4: the TensorRT-LLM container on every node.

The image is pulled where it is missing and its digest must be the same on every node. The
container's whole configuration (the docker run argv, the entrypoint and the sshd config it
starts) is hashed into a label: a running container with the same hash is left alone, anything
else is replaced. The fabric settings (NCCL/UCX/OMPI) come from the inventory's interfaces and
the node's own ibdev2netdev, nothing is hard-coded. No --rm, so a crashed container's logs stay.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from typing import Any

from orchestrator.commands import docker_cmd, env_args, join, quote
from orchestrator.core.step import Change, NodeContext, Outcome, Phase, Step, Unchanged
from orchestrator.engines.trtllm.mpi_env import (
    detect_and_record_cmd,
    guess_major_from_tag,
    mpi_environment,
    record_fact,
    recorded,
)
from orchestrator.engines.trtllm.nccl_env import nccl_environment
from orchestrator.errors import SparkctlError
from orchestrator.inventory import Inventory, Node
from orchestrator.paths import CONFIG_DIR, RUN_DIR
from orchestrator.phases.ssh_keys import (
    HOST_PUB,
    entrypoint_content,
    fabric_addresses,
    sshd_config_content,
)
from orchestrator.render import sha256

INFINIBAND = "/dev/infiniband"
HASH_LABEL = "sparkctl.config-hash"
READY_DEADLINE = 60
PULL_TIMEOUT = 3 * 3600


def facts(inventory: Inventory, node: Node) -> dict[str, Any]:
    user = inventory.cluster.user
    return {
        "images": [inventory.container.image],
        "containers": [inventory.container.name],
        "files": {INFINIBAND: False},
        "ibdev2netdev": True,
        "commands": {"home": f"getent passwd {quote(user)} | cut -d: -f6",
                     **record_fact(inventory.container.image)},
    }


# ---------------------------------------------------------------- pure pieces
def fabric_env(inventory: Inventory, roce_devices: list[str], mpi_major: int = 4) -> dict[str, str]:
    """NCCL/UCX from the inventory, the launcher's MPI names for the image's Open MPI."""
    return {
        **nccl_environment(inventory, roce_devices),
        **mpi_environment(mpi_major, list(inventory.fabric.interfaces), inventory.topology),
        "CPATH": "/usr/local/cuda/include",
        "TRITON_PTXAS_PATH": "/usr/local/cuda/bin/ptxas",
    }


def roce_devices(inventory: Inventory, node_facts: dict[str, Any], node: str) -> list[str]:
    """The RoCE device of each fabric interface, from the node's ibdev2netdev."""
    devices = ((node_facts.get("ibdev2netdev") or {}).get("devices")) or {}
    missing = [name for name in inventory.fabric.interfaces if name not in devices]
    if missing:
        raise SparkctlError(
            f"{node}: ibdev2netdev shows no RoCE device for {', '.join(missing)}; NCCL_IB_HCA "
            "cannot be set. Is the interface name in fabric.interfaces right for this node?"
        )
    return [devices[name]["device"] for name in inventory.fabric.interfaces]


def hf_cache_dir(inventory: Inventory, home: str) -> str:
    path = inventory.container.hf_cache
    if path == "~" or path.startswith("~/"):
        return home.rstrip("/") + path[1:]
    return path


def run_args(inventory: Inventory, node: Node, roce: list[str], hf_cache: str,
             infiniband: bool, mpi_major: int = 4) -> list[str]:
    """`docker run` arguments without the config-hash label (the hash is taken over them)."""
    container = inventory.container
    args = ["run", "-d", "--name", container.name, "--network", "host", "--ipc", "host",
            "--gpus", "all", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864"]
    if infiniband:
        args += ["--device", f"{INFINIBAND}:{INFINIBAND}"]
    args += env_args("-e", fabric_env(inventory, roce, mpi_major))
    args += ["-v", f"{CONFIG_DIR}:{CONFIG_DIR}:ro", "-v", f"{RUN_DIR}:{RUN_DIR}",
             "-v", f"{hf_cache}:/root/.cache/huggingface"]
    for key, value in (("managed", "true"), ("cluster", inventory.cluster.name),
                       ("node", node.name)):
        args += ["--label", f"sparkctl.{key}={value}"]
    return [*args, container.image, "bash", f"{CONFIG_DIR}/entrypoint.sh"]


def config_hash(args: list[str], entrypoint: str, sshd_config: str) -> str:
    """Everything the running container depends on: its argv and the files read at start."""
    canonical = json.dumps({"argv": args, "entrypoint": sha256(entrypoint),
                            "sshd_config": sha256(sshd_config)}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def with_hash(args: list[str], digest: str) -> list[str]:
    image_at = len(args) - 3  # IMAGE bash ENTRYPOINT close the argv
    return [*args[:image_at], "--label", f"{HASH_LABEL}={digest}", *args[image_at:]]


def replace_container_cmd(inventory: Inventory, node: Node, args: list[str], user: str,
                          hf_cache: str, remove_old: bool) -> str:
    """One remote command: dirs, remove the stale container, run, wait for our sshd to answer.

    Readiness is proven by the container's sshd presenting OUR pinned host key on the first
    fabric address (another process holding the port would not); a container that exits
    meanwhile fails at once with the tail of its log.
    """
    name, port = inventory.container.name, inventory.container.ssh_port
    address = fabric_addresses(inventory, node)[0]
    too_slow = (f"sshd in {name} did not answer on {address}:{port} with the pinned host key "
                f"within {READY_DEADLINE}s; its log:")
    logs = f"{docker_cmd('logs', '--tail', '30', name)} 2>&1 | sed 's/^/  | /' >&2"
    steps = [
        f"install -d -m 0755 {quote(RUN_DIR)}",
        f"runuser -u {quote(user)} -- mkdir -p -- {quote(hf_cache)}",
    ]
    if remove_old:
        steps.append(f"{docker_cmd('rm', '-f', name)} >/dev/null")
    steps.append(f"{join(['docker', *args])} >/dev/null")
    wait = (
        f"key=$(cut -d' ' -f2 {quote(HOST_PUB)}); i=0; "
        f"while :; do "
        f"running=$({docker_cmd('inspect', '-f', '{{.State.Running}}', name)} 2>/dev/null); "
        f"if [ \"$running\" != true ]; then "
        f"echo {quote(f'container {name} exited right after start; its log:')} >&2; {logs}; exit 3; fi; "
        f"if ssh-keyscan -T 2 -t ed25519 -p {port} {quote(address)} 2>/dev/null "
        f"| grep -qF \"$key\"; then exit 0; fi; "
        f"i=$((i+1)); if [ $i -ge {READY_DEADLINE * 2} ]; then "
        f"echo {quote(too_slow)} >&2; "
        f"{logs}; exit 4; fi; sleep 0.5; done"
    )
    return " && ".join(steps) + " && { " + wait + "; }"


def image_digest(image_facts: dict[str, Any] | None, image: str) -> str | None:
    """The registry digest of the image on a node (RepoDigests), else its local ID."""
    if not image_facts or "error" in image_facts:
        return None
    repo = image.split("@")[0].rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    for entry in image_facts.get("RepoDigests") or []:
        if entry.split("@")[0] == repo:
            return entry.split("@", 1)[1]
    return image_facts.get("Id")


def describe(env: list[str], binds: list[str], image: str, labels: dict[str, str]) -> str:
    lines = [f"image {image}"] + [f"env {e}" for e in sorted(env)]
    lines += [f"volume {b}" for b in sorted(binds)]
    lines += [f"label {k}={v}" for k, v in sorted(labels.items()) if k.startswith("sparkctl.")]
    return "\n".join(lines) + "\n"


def container_diff(current: dict[str, Any], args: list[str]) -> str:
    """What differs between the running container and the wanted one (for --dry-run)."""
    want_env = [args[i + 1] for i, a in enumerate(args) if a == "-e"]
    want_keys = {e.split("=", 1)[0] for e in want_env}
    config = current.get("Config") or {}
    have_env = [e for e in config.get("Env") or []
                if e.split("=", 1)[0] in want_keys
                or e.startswith(("NCCL_", "UCX_", "OMPI_", "PRTE_"))]
    have_labels = config.get("Labels") or {}
    want_labels = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--label")
    old = describe(have_env, (current.get("HostConfig") or {}).get("Binds") or [],
                   str(config.get("Image")), have_labels)
    new = describe(want_env, [args[i + 1] for i, a in enumerate(args) if a == "-v"],
                   args[-3], want_labels)
    name = str(current.get("Name", "container")).lstrip("/")
    return "".join(difflib.unified_diff(old.splitlines(keepends=True),
                                        new.splitlines(keepends=True),
                                        fromfile=f"{name} (running)", tofile=f"{name} (wanted)"))


# ---------------------------------------------------------------- steps
class Image(Step):
    """The image on the node: pulled only when missing."""

    name = "image"

    def check(self, ctx: NodeContext) -> Outcome:
        image = ctx.inventory.container.image
        fact = (ctx.facts.get("images") or {}).get(image)
        if isinstance(fact, dict) and "error" in fact:
            raise SparkctlError(f"{ctx.node.name}: `docker image inspect {image}` failed: "
                                f"{fact['error'].strip()}")
        if fact:
            return Unchanged(f"{image} present")
        return Change(f"docker pull {image}")

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        image = ctx.inventory.container.image
        command = f"{docker_cmd('pull', image)} >&2 && {docker_cmd('image', 'inspect', image)}"
        result = ctx.run(command, sudo=True, timeout=PULL_TIMEOUT)
        if not result.ok:
            raise SparkctlError(
                f"{ctx.node.name}: container/image: `docker pull {image}` exited "
                f"{result.exit_status}: {result.stderr.strip()[-400:]}\n"
                "Hint: a 'Root CA' / x509 error usually means the node's clock is wrong."
            )
        try:
            pulled = json.loads(result.stdout)[0]
        except (ValueError, IndexError):
            pulled = None
        ctx.shared.setdefault("image_facts", {})[ctx.node.name] = pulled
        return None


class ImageDigest(Step):
    """The same image digest on every node (drifting images break multi-node runs)."""

    name = "image-digest"

    def check(self, ctx: NodeContext) -> Outcome:
        image = ctx.inventory.container.image
        digests: dict[str, str | None] = {}
        for name, node_facts in sorted(ctx.cluster_facts.items()):
            fact = (ctx.shared.get("image_facts") or {}).get(name) or \
                (node_facts.get("images") or {}).get(image)
            digests[name] = image_digest(fact, image)
        mine = digests.get(ctx.node.name)
        if mine is None:
            return Unchanged("digest known after the pull")
        known = {d for d in digests.values() if d}
        if len(known) > 1:
            listing = "; ".join(f"{n} -> {d or 'not pulled'}" for n, d in digests.items())
            raise SparkctlError(
                f"{ctx.node.name}: {image} differs between nodes ({listing}). Pull the same "
                f"image everywhere (`docker pull {image}` on each node, or pin it with "
                "@sha256:... in container.image)"
            )
        return Unchanged(f"{image} {mine}")


MPI_KEY = "mpi"  # ctx.shared: node -> {"version": "5.0.11", "major": 5, ...}


def _image_id(ctx: NodeContext) -> str | None:
    image = ctx.inventory.container.image
    fact = (ctx.shared.get("image_facts") or {}).get(ctx.node.name) or \
        (ctx.facts.get("images") or {}).get(image)
    return fact.get("Id") if isinstance(fact, dict) and "error" not in fact else None


class MpiVersion(Step):
    """Which Open MPI the image ships (4: ORTE names, 5: PRRTE names), detected once per image
    ID with `mpirun --version` in a throw-away container and recorded on the node."""

    name = "mpi-version"

    def check(self, ctx: NodeContext) -> Outcome:
        image_id = _image_id(ctx)
        record = recorded(ctx.facts, image_id) if image_id else None
        if record:
            ctx.shared.setdefault(MPI_KEY, {})[ctx.node.name] = record
            return Unchanged(f"Open MPI {record['version']} in the image (recorded)")
        return Change(f"detect the image's MPI: docker run --rm {ctx.inventory.container.image} "
                      "mpirun --version")

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        image = ctx.inventory.container.image
        image_id = _image_id(ctx)
        if not image_id:
            raise SparkctlError(f"{ctx.node.name}: container/mpi-version: {image} has no image "
                                "ID on the node (pull failed?)")
        result = ctx.run(detect_and_record_cmd(image, image_id), sudo=True, timeout=180,
                         display=f"docker run --rm {image} mpirun --version")
        try:
            record = json.loads(result.stdout.strip().splitlines()[-1]) if result.ok else None
        except (ValueError, IndexError):
            record = None
        if not record:
            raise SparkctlError(
                f"{ctx.node.name}: container/mpi-version: `mpirun --version` in {image} failed "
                f"(exit {result.exit_status}):\n{result.stderr.strip()[-800:]}\n"
                "Hint: sparkctl launches TensorRT-LLM with Open MPI's mpirun; the image must "
                "have it on its PATH.")
        ctx.shared.setdefault(MPI_KEY, {})[ctx.node.name] = record
        return f"Open MPI {record['version']} (recorded in the node's /var/lib/sparkctl/images)"


def mpi_major(ctx: NodeContext) -> int:
    """The image's Open MPI major version: detected, else (preview only) from the tag."""
    record = (ctx.shared.get(MPI_KEY) or {}).get(ctx.node.name)
    if record:
        return int(record["major"])
    return guess_major_from_tag(ctx.inventory.container.image)


class Container(Step):
    name = "container"

    def check(self, ctx: NodeContext) -> Outcome:
        inventory, node = ctx.inventory, ctx.node
        name = inventory.container.name
        args, digest = self.wanted(ctx)
        current = (ctx.facts.get("containers") or {}).get(name)
        if isinstance(current, dict) and "error" in current:
            raise SparkctlError(f"{node.name}: `docker inspect {name}` failed: {current['error']}")
        payload = {"args": with_hash(args, digest), "remove_old": current is not None}
        if current is None:
            return Change(f"run container {name}", payload=payload)
        labels = (current.get("Config") or {}).get("Labels") or {}
        if labels.get("sparkctl.managed") != "true":
            raise SparkctlError(
                f"{node.name}: a container named {name} exists but was not created by sparkctl; "
                "remove it (`docker rm -f " + name + "`) or set container.name in the inventory"
            )
        state = current.get("State") or {}
        if labels.get(HASH_LABEL) != digest:
            return Change(f"replace container {name} (configuration changed)",
                          diff=container_diff(current, with_hash(args, digest)), payload=payload)
        if not state.get("Running"):
            return Change(
                f"replace container {name} ({state.get('Status', 'stopped')}, exit code "
                f"{state.get('ExitCode')})", payload=payload)
        image_id = ((ctx.facts.get("images") or {}).get(inventory.container.image) or {}).get("Id")
        if image_id and current.get("Image") and current["Image"] != image_id:
            return Change(f"replace container {name} (runs an older {inventory.container.image})",
                          payload=payload)
        return Unchanged(f"{name} running since {state.get('StartedAt', '?')}, config unchanged")

    def wanted(self, ctx: NodeContext) -> tuple[list[str], str]:
        inventory, node = ctx.inventory, ctx.node
        home = (((ctx.facts.get("commands") or {}).get("home") or {}).get("out") or "").strip()
        if not home and inventory.container.hf_cache.startswith("~"):
            raise SparkctlError(f"{node.name}: cannot find the home directory of "
                                f"{inventory.cluster.user} (getent passwd); needed for the HF cache")
        infiniband = bool(((ctx.facts.get("files") or {}).get(INFINIBAND) or {}).get("exists"))
        args = run_args(inventory, node, roce_devices(inventory, ctx.facts, node.name),
                        hf_cache_dir(inventory, home), infiniband, mpi_major(ctx))
        return args, config_hash(args, entrypoint_content(), sshd_config_content(inventory, node))

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        inventory = ctx.inventory
        home = ctx.facts["commands"]["home"]["out"].strip()
        command = replace_container_cmd(
            inventory, ctx.node, change.payload["args"], inventory.cluster.user,
            hf_cache_dir(inventory, home), change.payload["remove_old"],
        )
        result = ctx.run(command, sudo=True, timeout=READY_DEADLINE + 120,
                         display=f"docker run {inventory.container.name} + wait for its sshd")
        if not result.ok:
            raise SparkctlError(
                f"{ctx.node.name}: container/container: starting {inventory.container.name} "
                f"failed (exit {result.exit_status}):\n{result.stderr.strip()[-1500:]}\n"
                f"Hint: a container that exits at once usually means its entrypoint failed or "
                f"port {inventory.container.ssh_port} is taken on the node."
            )
        return None


def phase(inventory: Inventory) -> Phase:
    return Phase("container", [Image(), ImageDigest(), MpiVersion(), Container()], facts)
