"""The container image node to node over the fabric, for nodes that cannot (or should not) pull.

A node gets the image this way when it cannot pull: its registry probe in the facts failed
(phases/registry.py: no route or DNS to the registry, a proxy, the tag unknown there), or its
`docker pull` failed (the Image step records the error instead of failing); or, with
`--distribute-image` (`up`, `launch`), whenever it lacks the image: then only one node pulls
(the head when it needs the image), unless a node has it already. The source is the head when
it has the image, else any node that has it. Per target, in parallel: a receiver
on the target's fabric address (a one-time token on stdin, one connection) pipes the stream
into `docker load`; the source streams `docker save` into it (node/imagecopy.py). The stream's
sha256 is checked end to end, and the loaded image must show the source's image ID (and its
registry digest, where the node's docker keeps one): else the step fails, naming the node.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from orchestrator.commands import join
from orchestrator.core.progress import Heartbeat
from orchestrator.core.step import Change, NodeContext, Outcome, Step, Unchanged
from orchestrator.errors import SparkctlError
from orchestrator.node import script
from orchestrator.phases.registry import ImageOf, Targets, repo_digest, supply_for
from orchestrator.remote.cluster import parallel
from orchestrator.remote.gathered import NodeFacts
from orchestrator.remote.node_facts import DockerImage, ImageInfo
from orchestrator.remote.pipe import RemoteProcess
from orchestrator.remote.transport import Transport

IMAGECOPY_SCRIPT = script("stdin_watch.py") + "\n" + script("imagecopy.py")


def imagecopy_cmd(mode: str, args: dict[str, Any]) -> str:
    return join(["python3", "-c", IMAGECOPY_SCRIPT, mode, json.dumps(args, sort_keys=True)])


def gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def image_steps(image_of: ImageOf, targets: Targets | None = None) -> list[Step]:
    """The image on every node that needs it (`targets`, default every node of the phase),
    pulled or sent over the fabric from a node that has it, the same digest everywhere."""
    from orchestrator.phases.container_image import Image, ImageDigest

    def needed(ctx: NodeContext) -> str | None:
        wanted = targets(ctx) if targets else None
        return image_of(ctx) if wanted is None or ctx.node.name in wanted else None

    return [Image(needed, share=True, targets=targets), ImageShare(image_of, targets),
            ImageDigest(needed)]


def image_fact(ctx: NodeContext, node: str, image: str) -> ImageInfo | None:
    """The node's image: pulled or received in this run, or from the facts."""
    pulled = ctx.shared.image_facts.get(node)
    info = ImageInfo.of(pulled) if pulled else DockerImage(image).read(
        ctx.cluster_facts.get(node) or NodeFacts(node), strict=False)
    return info if info is not None and info.id else None


def copy_image(source: Transport, target: Transport, target_ip: str, image: str) -> dict[str, Any]:
    """`docker save` on source -> `docker load` on target over raw TCP on the target's fabric
    address. Returns the receiver's final record (id, digests, bytes); raises naming the node."""
    token = secrets.token_hex(16) + "\n"
    # both watch their stdin, kept open: Ctrl-C or a lost connection ends them on the nodes,
    # `docker save`/`docker load` with them (otherwise the image would go on streaming)
    receiver = RemoteProcess(target, imagecopy_cmd("recv", {"listen": target_ip, "image": image,
                                                            "watch": True}),
                             display="python3 -c <imagecopy recv>")
    receiver.feed(token, close=False)
    sender: RemoteProcess | None = None
    try:
        ready = receiver.first_json()
        if "port" not in ready:
            raise SparkctlError(f"{target.node}: the image receiver did not start: "
                                f"{ready or receiver.stderr_tail()}")
        sender = RemoteProcess(source, imagecopy_cmd("send", {"host": target_ip, "image": image,
                                                              "port": ready["port"],
                                                              "watch": True}),
                               display="python3 -c <imagecopy send>")
        sender.feed(token, close=False)
        sent = sender.first_json()
        final = receiver.first_json()
        if sent.get("error") in ("connect", "save", "inspect"):  # the cause: the receiver only
            # saw the stream stop or never start
            raise SparkctlError(f"{source.node}: sending {image} to {target.node} failed "
                                f"({sent['error']}): {sent.get('message')}")
        if final.get("error"):
            raise SparkctlError(f"{target.node}: receiving {image} from {source.node} failed "
                                f"({final['error']}): {final.get('message')}")
        if sent.get("error") or not sent.get("done"):
            raise SparkctlError(f"{source.node}: sending {image} to {target.node} failed: "
                                f"{sent.get('message') or sender.stderr_tail()}")
        if not final.get("done"):
            raise SparkctlError(f"{target.node}: the image receiver ended without loading "
                                f"{image}: {receiver.stderr_tail()}")
        return {**final, "source_id": sent.get("id"), "source_digests": sent.get("digests") or [],
                "seconds": sent.get("seconds", 0.0)}
    finally:
        if sender is not None:
            sender.close()
        receiver.close()


def verify(node: str, image: str, got: dict[str, Any], want_id: str,
           want_digest: str | None) -> str:
    """The loaded image must be the source's: same image ID, same registry digest if kept."""
    if got.get("id") != want_id:
        raise SparkctlError(f"{node}: {image} arrived as image ID {got.get('id')}, the source has "
                            f"{want_id} (docker load registered another image); run up again")
    theirs = repo_digest(got.get("digests") or [], image)
    if want_digest and theirs and theirs != want_digest:
        raise SparkctlError(f"{node}: {image} arrived with digest {theirs}, the source has "
                            f"{want_digest}")
    return theirs or want_digest or want_id


class ImageShare(Step):
    """Runs on the head after every node's Image step: sends the image to the nodes that need
    it from a node that has it."""

    name = "image-share"
    scope = "head"

    def __init__(self, image_of: ImageOf | None = None, targets: Targets | None = None) -> None:
        self.image_of = image_of or (lambda ctx: ctx.inventory.container.image)
        self.targets = targets

    def check(self, ctx: NodeContext) -> Outcome:
        image = self.image_of(ctx)
        if not image:
            return Unchanged("no image")
        planned = supply_for(ctx, image, self.targets)  # (a dry run sees it before any pull)
        wanted = {**planned.receivers, **ctx.shared.image_wanted}
        wanted = {n: why for n, why in sorted(wanted.items()) if image_fact(ctx, n, image) is None}
        if not wanted:
            return Unchanged("no node needs the image from another")
        source = f" from {planned.source}" if planned.source else ""
        return Change(f"send {image}{source} over the fabric to " + ", ".join(wanted),
                      payload=wanted)

    def source(self, ctx: NodeContext, image: str, wanted: dict[str, str]) -> str:
        names = [ctx.inventory.head_name, *(n for n in sorted(ctx.transports)
                                            if n != ctx.inventory.head_name)]
        for name in names:
            if name not in wanted and name in ctx.transports and image_fact(ctx, name, image):
                return name
        reasons = "; ".join(f"{n}: {why}" for n, why in wanted.items())
        raise SparkctlError(f"no node has {image} to send to the others ({reasons}). Make the "
                            "registry reachable from at least the head (or `docker load` the "
                            "image there by hand) and run the command again")

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        image = str(self.image_of(ctx))
        wanted: dict[str, str] = change.payload
        source = self.source(ctx, image, wanted)
        mine = image_fact(ctx, source, image) or ImageInfo("")
        want_id, want_digest = mine.id, repo_digest(mine.repo_digests, image)

        def one(node: str) -> dict[str, Any]:
            ip = ctx.inventory.mpi_address(ctx.inventory.node(node))
            return copy_image(ctx.transports[source], ctx.transports[node], ip, image)

        note = ctx.options.note
        # docker save | docker load reports nothing until it is done: say it still runs
        with Heartbeat(note, f"copy of {image} from {source} to {', '.join(wanted)}"):
            outcomes = parallel(one, list(wanted))
        lines, extra, errors = [], {}, []
        for node, outcome in outcomes.items():
            try:
                got = outcome.get()
                shown = verify(node, image, got, want_id, want_digest)
            except SparkctlError as exc:
                errors.append(str(exc))
                continue
            ctx.shared.image_facts[node] = {
                "Id": got["id"], "RepoDigests": got.get("digests") or []}
            extra[node] = {"from": source, "why": wanted[node], "image_id": got["id"],
                           "digest": shown, "bytes": got.get("bytes", 0)}
            lines.append(f"{node} <- {source} ({wanted[node]}, {gb(got.get('bytes', 0))}), "
                         f"{shown} verified")
        ctx.shared.report_extra.setdefault("image_distribution", {}).update(extra)
        if errors:
            raise SparkctlError("; ".join(errors))
        return f"{image} sent over the fabric: " + "; ".join(lines)
