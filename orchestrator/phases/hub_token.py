"""The Hugging Face token, checked on the head before anything downloads or any container changes.

Only when the head lacks a model the recipe serves (nothing to download: nothing to check). In
a models container on the head (phases/model_tools.py), where the download would run and against
the hub it would use ($HF_ENDPOINT there, huggingface.co by default):
- with a token: `hf auth whoami`, the token on stdin (read into the process's environment by
  the shell inside the container: never on a command line, never in `docker inspect`). A token
  the hub refuses stops the launch here (exit 1, naming the hub); a hub that cannot be reached
  is said and the launch goes on (the download will tell);
- without one: `hf download --dry-run` of each missing repository, which asks the hub for the
  file list without downloading; a gated repository answers 401, and the launch stops (exit 2)
  saying where a token goes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.core.step import NodeContext, Outcome, Phase, Step, Unchanged
from orchestrator.errors import InputError, SparkctlError
from orchestrator.inventory import Inventory, Node
from orchestrator.phases.model_tools import ModelTools, model_tools
from orchestrator.phases.models import (
    ServingPhase,
    download_cmd,
    manifest_fact,
    manifests_from_facts,
)
from orchestrator.recipe import BaseRecipe as Recipe

DEFAULT_HUB = "https://huggingface.co"
CHECK_SECONDS = 60
REJECTED = ("401", "invalid user token", "invalid credentials", "unauthorized",
            "invalid username or password")
UNREACHABLE = ("connection", "max retries", "name or service not known", "temporary failure",
               "timed out", "no route to host", "offline", "proxyerror", "ssl")
GATED = ("gatedrepoerror", "cannot access gated repo", "401", "unauthorized")
WHOAMI = ('echo "hub=${HF_ENDPOINT:-' + DEFAULT_HUB + '}"; IFS= read -r HF_TOKEN; export HF_TOKEN; '
          "exec hf auth whoami 2>&1")


@dataclass(frozen=True)
class Verdict:
    """What `hf auth whoami` said: accepted | rejected | unreachable | unknown, and the hub."""

    state: str
    hub: str
    said: str


def read_whoami(exit_status: int, output: str) -> Verdict:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    hub = DEFAULT_HUB
    if lines and lines[0].startswith("hub="):
        hub = lines.pop(0).removeprefix("hub=") or DEFAULT_HUB
    said = lines[-1] if lines else f"exit {exit_status}"
    text = " ".join(lines).lower()
    if exit_status == 0 and "not logged in" not in text:
        return Verdict("accepted", hub, said)
    if any(word in text for word in REJECTED):
        return Verdict("rejected", hub, said)
    if any(word in text for word in UNREACHABLE):
        return Verdict("unreachable", hub, said)
    return Verdict("unknown", hub, said)


def whoami_cmd(tools: ModelTools) -> str:
    """The token arrives on stdin and lives only in the shell's environment inside the
    container: never in its argv, its `docker inspect` or a file."""
    return tools.cmd(["sh", "-c", WHOAMI], interactive=True)


def rejected_error(node: str, verdict: Verdict) -> SparkctlError:
    return SparkctlError(
        f"{node}: the HF token (HF_TOKEN, --hf-token-file or ~/.cache/huggingface/token) was "
        f"rejected by the hub {verdict.hub} ({verdict.said}); nothing was downloaded and no "
        "container was changed. Fix: create a read token at huggingface.co/settings/tokens (or "
        "your hub's) and set HF_TOKEN or write it to ~/.cache/huggingface/token")


class HubToken(Step):
    """Before any download: the token present when a missing repository is gated, and accepted
    by the hub when there is one."""

    name = "hf-token"
    scope = "head"

    def __init__(self, recipe: Recipe, tools: ModelTools) -> None:
        self.recipe, self.tools = recipe, tools

    def check(self, ctx: NodeContext) -> Outcome:
        manifests = manifests_from_facts(ctx, ctx.node.name, self.recipe, self.tools)
        missing = [repo for repo, _, _ in self.recipe.repos if not manifests[repo]["present"]]
        if not missing:
            return Unchanged("no model to download: no token needed")
        tools = self.tools
        if any(manifests[repo].get("no_image") for repo in missing):
            return Unchanged(f"HF token not checked yet: {tools.image} is not on {ctx.node.name} "
                             "(the model-image phase brings it first)")
        token = ctx.options.hf_token
        if token is None:
            return self._without_token(ctx, tools, missing)
        result = ctx.run(whoami_cmd(tools), stdin=token.reveal() + "\n", timeout=CHECK_SECONDS,
                         display=tools.shown("hf auth whoami (token on stdin)"))
        verdict = read_whoami(result.exit_status, result.stdout + result.stderr)
        if verdict.state == "rejected":
            raise rejected_error(ctx.node.name, verdict)
        if verdict.state == "accepted":
            return Unchanged(f"HF token accepted by {verdict.hub} ({verdict.said})")
        why = "cannot be reached" if verdict.state == "unreachable" else "gave no clear answer"
        return Unchanged(f"HF token not checked: the hub {verdict.hub} {why} from "
                         f"{ctx.node.name} ({verdict.said}); the download will tell")

    def _without_token(self, ctx: NodeContext, tools: ModelTools, missing: list[str]) -> Outcome:
        gated = []
        for repo, revision, local in self.recipe.repos:
            if repo not in missing:
                continue
            allow, deny = self.recipe.file_patterns(repo)
            result = ctx.run(download_cmd(tools, repo, revision, local, False, allow, deny,
                                          dry_run=True), timeout=CHECK_SECONDS,
                             display=tools.shown(f"hf download {repo} --dry-run"))
            text = (result.stdout + result.stderr).lower()
            if result.exit_status != 0 and any(word in text for word in GATED):
                gated.append(repo)
        if gated:
            ctx.options.token_missing = True
            raise InputError(
                f"{', '.join(gated)} {'is' if len(gated) == 1 else 'are'} gated on the hub and no "
                "HF token was given; nothing was downloaded and no container was changed. Set "
                "HF_TOKEN, write the token to ~/.cache/huggingface/token, or pass --hf-token-file "
                "FILE (and accept the model's licence on its hub page)")
        return Unchanged(f"no HF token; {', '.join(missing)} need none (the hub lists the files)")

    def apply(self, ctx: NodeContext, change: Any) -> str | None:  # never called
        return None


def phase(recipe: Recipe, image: str, inventory: Inventory) -> Phase:
    """launch's check before any download: on the head, in a models container of IMAGE, from the
    models' facts (after the model-image phase)."""
    tools = model_tools(image, inventory)

    def facts(inv: Inventory, node: Node) -> dict[str, Any]:
        return {**manifest_fact(tools, recipe).request(), "timeout": 3600}

    return ServingPhase("hf-token", [HubToken(recipe, tools)], facts, serving=[inventory.head_name])


def phases(recipe: Recipe, nodes: list[str], image: str, inventory: Inventory) -> list[Phase]:
    """launch's first phases: the models' IMAGE on the head and NODES (phases/model_image.py:
    where hf runs), then the token check."""
    from orchestrator.phases.model_image import image_phase

    return [image_phase(image, nodes, inventory), phase(recipe, image, inventory)]
