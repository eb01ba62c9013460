"""`launch --verify-models` (and `status --deep`): every model file on every serving node hashed
again, ignoring the hash cache, and compared with the head's manifest.

Why: the fan-out trusts a per-folder cache of sha256s that stays valid while a file's size,
mtime and inode hold (node/fanout_manifest.py, HashCache), so a blob changed in place with its
mtime kept (a bad disk, a careless edit, `touch -r`) is not noticed by the fast path. Re-hashing
reads every byte (minutes for a large model on a Spark), so it is asked for, not done every
launch. In a launch the phase runs before the models phase: a node whose files differ gets its
cache corrected here, and the models phase then sends the right bytes again. On the head, a hub
blob whose content does not match its name (the hub names LFS blobs by their sha256) is corrupt
at the source: the run stops and says which file to delete so it is downloaded again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.core.step import Change, NodeContext, Outcome, Step, Unchanged
from orchestrator.errors import SparkctlError
from orchestrator.phases import fanout
from orchestrator.phases.model_tools import ModelTools, model_tools
from orchestrator.phases.models import HUB_DIR, ServingPhase, repo_requests
from orchestrator.remote.fact_records import CommandResult
from orchestrator.remote.gathered import NodeFacts

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.recipe import BaseRecipe


def rehash_cmd(tools: ModelTools, recipe: BaseRecipe, save: bool) -> str:
    return fanout.node_script_cmd(tools, "manifest", {
        "hub": HUB_DIR, "chunks": False, "rehash": True, "save": save,
        "repos": repo_requests(recipe)})


def differences(head: dict[str, Any], node: dict[str, Any]) -> list[str]:
    """The files of `node` whose bytes are not the head's (per repo manifest, by path)."""
    out = []
    for repo, theirs in node.items():
        mine = (head.get(repo) or {}).get("files") or {}
        their_blobs = theirs.get("blobs") or {}
        head_blobs = (head.get(repo) or {}).get("blobs") or {}
        for name, rel in sorted((theirs.get("files") or {}).items()):
            want = (head_blobs.get(mine.get(name)) or {}).get("sha256")
            got = (their_blobs.get(rel) or {}).get("sha256")
            if want and got and want != got:
                out.append(f"{repo}/{name}")
    return out


def parse(answer: CommandResult | None, node: str) -> dict[str, Any]:
    import json

    if answer is None or answer.rc != 0:
        raise SparkctlError(f"{node}: could not re-hash the models: "
                            + ((answer.err or answer.out) if answer else "").strip()[-300:])
    for line in reversed(answer.out.splitlines()):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict):
            return found
    raise SparkctlError(f"{node}: the model re-hash printed no manifest")


class VerifyModels(Step):
    """Per serving node: its files re-hashed against the head's; the head's against their names."""

    name = "verify-models"

    def __init__(self, recipe: BaseRecipe, tools: ModelTools) -> None:
        self.recipe, self.tools = recipe, tools

    def manifests(self, ctx: NodeContext, node: str) -> dict[str, Any]:
        facts = ctx.cluster_facts.get(node) or NodeFacts(node)
        return parse(facts.command("rehash"), node)

    def check(self, ctx: NodeContext) -> Outcome:
        mine = self.manifests(ctx, ctx.node.name)
        misnamed = [rel for entry in mine.values() for rel in entry.get("misnamed") or []]
        if misnamed and ctx.node.name == ctx.inventory.head_name:
            raise SparkctlError(f"{ctx.node.name}: {len(misnamed)} model file(s) do not match their "
                                f"sha256 name, corrupt at the source: {', '.join(misnamed[:5])} "
                                f"(under {HUB_DIR}); delete them and launch again to download them")
        count = sum(len(e.get("blobs") or {}) for e in mine.values())
        if ctx.node.name == ctx.inventory.head_name:
            return Unchanged(f"re-hashed {count} file(s): each matches its name")
        differ = differences(self.manifests(ctx, ctx.inventory.head_name), mine)
        if not differ:
            return Unchanged(f"re-hashed {count} file(s): identical to the head's")
        tools = self.tools
        return Change(f"{len(differ)} file(s) differ from the head's though the hash cache said "
                      f"otherwise: {', '.join(differ[:5])}; the cache is corrected and the models "
                      "phase sends them again", commands=(rehash_cmd(tools, self.recipe, True),))


def phase(recipe: BaseRecipe, serving: list[str], image: str, inventory: Inventory) -> ServingPhase:
    """--verify-models: every file of the recipe's models re-hashed on the head and SERVING
    nodes, in containers of IMAGE (the models' image)."""
    tools = model_tools(image, inventory)

    def facts(inv: Inventory, node: Node) -> dict[str, Any]:
        return {"commands": {"rehash": rehash_cmd(tools, recipe, False)}, "timeout": 3600}

    nodes = [inventory.head_name, *(n for n in serving if n != inventory.head_name)]
    return ServingPhase("verify-models", [VerifyModels(recipe, tools)], facts, serving=nodes)
