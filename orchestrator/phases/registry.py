"""Can each node pull the image? Asked before anything is pulled, in the facts round trip.

Per node that lacks the image, the facts gatherer runs `docker manifest inspect IMAGE` (Docker's
CLI asks the image's registry for its manifest: DNS, route, TLS, credentials and the tag itself,
without downloading a layer), with the Docker daemon's own HTTPS proxy (`docker info`) and a
short deadline. A node that has the image is not probed (no network call on a no-change run).

From every node's answer, `supply()` decides who pulls and who gets the image over the fabric
from a node that has it (phases/image_share.py), or says, before anything changed, that no node
has the image and none can pull it, naming node, registry and the fix. `RegistryCheck` is that
judgement as a step: in `up`'s preflight, and in launch's `image-check` phase (vLLM, SGLang).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.commands import quote
from orchestrator.core.step import Change, NodeContext, Outcome, Step, Unchanged
from orchestrator.errors import SparkctlError
from orchestrator.remote.facts import Command, ImageGate, Request, merge_requests
from orchestrator.remote.gathered import NodeFacts
from orchestrator.remote.node_facts import DockerImage

PROBE_SECONDS = 10
NETWORK_WORDS = ("no such host", "dial tcp", "i/o timeout", "connection refused", "unreachable",
                 "tls handshake", "x509", "proxyconnect", "no route to host", "no answer")
UNSUPPORTED = ("is not a docker command", "unknown command", "experimental")


def registry_of(image: str) -> str:
    """The registry an image reference names, as Docker reads it (docker.io when none)."""
    first, slash, _ = image.split("@", 1)[0].partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def repo_digest(repo_digests: Iterable[str], image: str) -> str | None:
    """The registry digest `docker image inspect` lists (RepoDigests) for the image's
    repository, if any."""
    repo = image.split("@")[0].rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    for entry in repo_digests:
        if entry.split("@")[0] == repo:
            return str(entry.split("@", 1)[1])
    return None


def probe_fact(image: str) -> Command:
    """`present`, `reachable`, `unknown: why`, or the failing `docker manifest inspect`'s error.
    Gated on the image: `present` comes from the gathering's own `docker image inspect`, and the
    probe runs only while the image is absent."""
    img = quote(image)
    fmt = quote("{{.HTTPSProxy}}|{{.NoProxy}}")
    # the daemon may pull Docker Hub images through a mirror the client never asks: then the
    # client's answer says nothing about the pull, and the node pulls as before
    mirrors = (f"mirrors=$(docker info --format {quote('{{json .RegistryConfig.Mirrors}}')} "
               '2>/dev/null); case "$mirrors" in *://*) echo "unknown: the docker daemon pulls '
               'docker.io images through a mirror ($mirrors)"; exit 0;; esac; '
               if registry_of(image) == "docker.io" else "")
    command = (
        f"{mirrors}"
        f"info=$(docker info --format {fmt} 2>/dev/null); proxy=${{info%%|*}}; "
        'case "$proxy" in *xxxxx*) echo "unknown: the docker daemon\'s proxy has credentials '
        'docker info does not show"; exit 0;; esac; '
        'if [ -n "$proxy" ]; then export HTTPS_PROXY="$proxy" https_proxy="$proxy" '
        'NO_PROXY="${info#*|}" no_proxy="${info#*|}"; fi; '
        f"timeout {PROBE_SECONDS} docker manifest inspect {img} >/dev/null && echo reachable")
    return Command(f"registry {image}", command, gate=ImageGate(image, "absent", "present\n"))


def probe_request(image: str | None) -> Request:
    return probe_fact(image).request() if image else {}


def with_probe(request: Request, image: str | None) -> Request:
    return merge_requests([request, probe_request(image)])


@dataclass(frozen=True)
class Reach:
    state: str
    """present | reachable | blocked | unknown (not probed, or the probe could not tell)."""
    reason: str = ""
    network: bool = False
    """A blocked node's reason is the network (DNS, route, TLS, proxy), not the image."""


def reach(facts: NodeFacts, image: str) -> Reach:
    """One node's answer: the image's inspect first (present), then the probe."""
    present = DockerImage(image).read(facts, strict=False)
    if present is not None and present.id:
        return Reach("present")
    result = probe_fact(image).read(facts)
    if result is None:
        return Reach("unknown", "not probed")
    out = result.out.strip()
    if result.ok:
        state, _, why = out.partition(":")
        return Reach(state, why.strip()) if state in ("present", "reachable") else \
            Reach("unknown", why.strip() or out)
    if result.rc == 124:
        return Reach("blocked", f"no answer within {PROBE_SECONDS} s", network=True)
    lines = [line.strip() for line in (result.err or out).splitlines() if line.strip()]
    why = (lines[-1] if lines else f"exit {result.rc}").removeprefix("Error response from daemon: ")
    if result.rc in (126, 127) or any(word in why.lower() for word in UNSUPPORTED):
        return Reach("unknown", f"`docker manifest inspect` is not available: {why}")
    return Reach("blocked", why, network=any(word in why.lower() for word in NETWORK_WORDS))


@dataclass
class Supply:
    """Who pulls the image, who gets it over the fabric (node -> why) and from whom."""

    image: str
    pullers: list[str] = field(default_factory=list)
    receivers: dict[str, str] = field(default_factory=dict)
    source: str | None = None
    error: str | None = None
    blocked: dict[str, Reach] = field(default_factory=dict)

    def notes(self) -> list[str]:
        if self.source is None:
            return []
        pulls = " (which pulls it)" if self.source in self.pullers else ""
        return [f"{node} {why}: it will get the image from {self.source}{pulls} over the fabric"
                if why != "--distribute-image" else f"{node} gets the image from {self.source}"
                f"{pulls} over the fabric (--distribute-image)" for node, why in self.receivers.items()]


def cannot(image: str, found: Reach) -> str:
    registry = registry_of(image)
    if found.network:
        return f"cannot reach {registry} ({found.reason})"
    return f"cannot pull {image} from {registry} ({found.reason})"


def supply(image: str, reaches: dict[str, Reach], targets: list[str], head: str,
           distribute: bool = False) -> Supply:
    """Pure: every node's Reach (those that may send too), the nodes that need the image."""
    order = [n for n in [head, *sorted(reaches)] if n in reaches]
    order = list(dict.fromkeys(order))
    have = [n for n in order if reaches[n].state == "present"]
    missing = [n for n in order if n in targets and reaches[n].state != "present"]
    blocked = {n: reaches[n] for n in missing if reaches[n].state == "blocked"}
    can = [n for n in missing if n not in blocked]
    pullers = ([] if have else can[:1]) if distribute else can
    receivers = {n: cannot(image, blocked[n]) if n in blocked else "--distribute-image"
                 for n in missing if n not in pullers}
    source = next(iter(have or pullers), None)
    result = Supply(image, pullers, receivers, source, blocked=blocked)
    if receivers and source is None:
        registry = registry_of(image)
        said: dict[str, list[str]] = {}  # one line per reason, its nodes together
        for name, found in blocked.items():
            said.setdefault(cannot(image, found), []).append(name)
        reasons = "; ".join(f"{', '.join(names)} {why}" for why, names in said.items())
        result.error = (
            f"no node has {image} and none can pull it from {registry}: {reasons}. Fix: make "
            f"{registry} reachable from at least one node (DNS, proxy, firewall: `docker pull "
            f"{image}` must work there; `--distribute-image` then pulls only there), or "
            "`docker load` the image on one node by hand; sparkctl sends it to the other nodes "
            "over the fabric")
    return result


Targets = Callable[[NodeContext], "list[str] | None"]
ImageOf = Callable[[NodeContext], "str | None"]


def supply_for(ctx: NodeContext, image: str, targets: Targets | None = None) -> Supply:
    """`supply()` over this phase's facts (targets: default every node of the phase)."""
    nodes = (targets(ctx) if targets else None) or sorted(ctx.cluster_facts)
    reaches = {n: reach(f, image) for n, f in ctx.cluster_facts.items()}
    return supply(image, reaches, nodes, ctx.inventory.head_name,
                  ctx.options.distribute_image)


def want(ctx: NodeContext, node: str, reason: str) -> None:
    ctx.shared.image_wanted[node] = reason


def receive(ctx: NodeContext, image: str, targets: Targets | None = None) -> Change | None:
    """The Image step's change on a node that gets the image over the fabric (None: it pulls);
    no node with the image and none that can pull it: the error, before anything is pulled."""
    planned = supply_for(ctx, image, targets)
    if planned.error:
        raise SparkctlError(planned.error)
    why = planned.receivers.get(ctx.node.name)
    if why is None:
        return None
    return Change(f"get {image} from {planned.source} over the fabric ({why})",
                  payload={"image": image, "distribute": why, "source": planned.source})


class RegistryCheck(Step):
    """Before anything changes: every node that needs the image can pull it, or gets it from a
    node that has it (said up front), or the run stops here naming node, registry and fix."""

    name = "registry"
    scope = "head"

    def __init__(self, image_of: ImageOf, targets: Targets | None = None) -> None:
        self.image_of, self.targets = image_of, targets

    def check(self, ctx: NodeContext) -> Outcome:
        image = self.image_of(ctx)
        if not image:
            return Unchanged("no image")
        found = supply_for(ctx, image, self.targets)
        if found.error:
            raise SparkctlError(found.error)
        notes = found.notes()
        if not notes:
            return Unchanged(f"{image}: present or pullable on every node that needs it")
        # an interactive run checks twice (the plan it shows, then the run): say it once
        said = ctx.options.notes_said
        for note in notes:
            if note not in said:
                ctx.options.note(f"note: {note}")
                said.add(note)
            if note not in ctx.shared.notes:
                ctx.shared.notes.append(note)
        return Unchanged("; ".join(notes))

    def apply(self, ctx: NodeContext, change: Any) -> str | None:  # never called
        return None


def phase(image: str, targets: list[str], head: str) -> Any:
    """launch's `image-check` phase: the head and the serving nodes, probed in the first facts."""
    from orchestrator.phases.models import ServingPhase

    def facts(inv: Any, node: Any) -> Request:
        return {"images": [image], **(probe_request(image) if node.name in targets else {})}

    nodes = [head, *(n for n in targets if n != head)]
    return ServingPhase("image-check", [RegistryCheck(lambda ctx: image, lambda ctx: targets)],
                        facts, serving=nodes)
