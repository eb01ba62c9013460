"""The image a container runs, on every node that runs one: pulled only where it is missing
(or sent over the fabric from a node that has it, phases/image_share.py), then one digest on
every node (drifting images break multi-node runs). The containers themselves:
phases/container.py.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.commands import docker_cmd
from orchestrator.core.step import Change, NodeContext, Outcome, Step, Unchanged
from orchestrator.errors import SparkctlError
from orchestrator.phases.pull_progress import run_pull
from orchestrator.phases.registry import ImageOf, Targets, receive, repo_digest, want
from orchestrator.remote.node_facts import DockerImage, ImageInfo

PULL_TIMEOUT = 3 * 3600


def image_digest(inspect: dict[str, Any] | None, image: str) -> str | None:
    """The registry digest of the image in a `docker image inspect` document, else its ID."""
    if not inspect or "error" in inspect:
        return None
    return digest_of(ImageInfo.of(inspect), image)


def digest_of(info: ImageInfo | None, image: str) -> str | None:
    """The registry digest of the image on a node (RepoDigests), else its local ID."""
    if info is None:
        return None
    return repo_digest(info.repo_digests, image) or info.id or None



def _inventory_image(ctx: NodeContext) -> str | None:
    return ctx.inventory.container.image


class Image(Step):
    """The image on the node: pulled only when missing (None: no image needed on this node).

    With `share` (an ImageShare step follows), a node that cannot pull (probe: phases/registry.py;
    or its pull fails), and with `--distribute-image` every node but the one that pulls, gets the
    image from another node over the fabric (phases/image_share.py); `targets` need the image.
    """

    name = "image"

    def __init__(self, image_of: ImageOf | None = None, share: bool = False,
                 targets: Targets | None = None) -> None:
        self.image_of, self.share, self.targets = image_of or _inventory_image, share, targets

    def check(self, ctx: NodeContext) -> Outcome:
        image = self.image_of(ctx)
        if image is None:
            return Unchanged("no container here")
        if DockerImage(image).read(ctx.facts) is not None:
            return Unchanged(f"{image} present")
        # over the fabric when the probe found the registry unreachable, or --distribute-image
        fabric = receive(ctx, image, self.targets) if self.share else None
        return fabric or Change(f"docker pull {image}", payload={"image": image})

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        payload = change.payload or {"image": self.image_of(ctx)}
        image = payload["image"]
        if payload.get("distribute"):
            want(ctx, ctx.node.name, str(payload["distribute"]))
            return f"{image}: sent by {payload.get('source')} over the fabric (next step)"
        status, output = run_pull(ctx, image, PULL_TIMEOUT)
        result = ctx.run(docker_cmd("image", "inspect", image), sudo=True) if status == 0 else None
        if result is None or not result.ok:
            error = (output if result is None else result.stderr).strip()[-400:]
            if self.share:  # another node may have it: image-share sends it, or says why not
                want(ctx, ctx.node.name, "its pull failed")
                return (f"`docker pull {image}` failed, the image will come from another node "
                        f"over the fabric: {error.splitlines()[-1] if error else ''}")
            raise SparkctlError(
                f"{ctx.node.name}: container/image: `docker pull {image}` exited "
                f"{status if result is None else result.exit_status}: {error}\n"
                "Hint: a 'Root CA' / x509 error usually means the node's clock is wrong."
            )
        try:
            pulled = json.loads(result.stdout)[0]
        except (ValueError, IndexError):
            pulled = None
        ctx.shared.image_facts[ctx.node.name] = pulled
        return None


class ImageDigest(Step):
    """The same image digest on every node (drifting images break multi-node runs)."""

    name = "image-digest"

    def __init__(self, image_of: ImageOf | None = None) -> None:
        self.image_of = image_of or _inventory_image

    def check(self, ctx: NodeContext) -> Outcome:
        image = self.image_of(ctx)
        if image is None:
            return Unchanged("no container here")
        digests: dict[str, str | None] = {}
        ids: dict[str, str | None] = {}
        for name, node_facts in sorted(ctx.cluster_facts.items()):
            pulled = ctx.shared.image_facts.get(name)
            info = ImageInfo.of(pulled) if pulled else DockerImage(image).read(node_facts, strict=False)
            digests[name] = digest_of(info, image)
            ids[name] = (info.id or None) if info else None
        if any(d and d == ids.get(n) for n, d in digests.items()):
            digests = ids  # a node keeps no registry digest (e.g. `docker load`): compare IDs
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
