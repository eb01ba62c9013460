"""Models on every serving node, fetched from the internet once.

The head downloads each missing model in a short-lived container of the recipe's engine image
(phases/model_tools.py: every engine alike; `hf download`, only the files the recipe's `files`
patterns allow, the token read from a 0600 file that HF_TOKEN_PATH names, removed again
afterwards); the other nodes get a copy over the fabric (phases/fanout.py: parallel
raw TCP streams, resumable, every chunk verified); then every node's files are compared with the
head's (revision, names, sizes, sha256 of every file, cached beside the model). Only what is
missing or different is fetched or copied; free space is checked first, with the numbers.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from orchestrator.commands import join
from orchestrator.core.progress import Heartbeat
from orchestrator.core.step import Change, NodeContext, Outcome, Phase, Step, Unchanged
from orchestrator.core.transfers import Transfers
from orchestrator.errors import SparkctlError
from orchestrator.inventory import Inventory, Node
from orchestrator.paths import TOKEN_PATH
from orchestrator.phases import fanout
from orchestrator.phases.files import check_written
from orchestrator.phases.model_tools import NO_IMAGE, ModelTools, model_tools
from orchestrator.recipe import CONTAINER_HF_HOME, Note
from orchestrator.recipe import BaseRecipe as Recipe
from orchestrator.remote.cluster import parallel
from orchestrator.remote.facts import Command
from orchestrator.remote.gathered import NodeFacts
from orchestrator.remote.stream import stream_run
from orchestrator.remote.transport import Transport

HUB_DIR = f"{CONTAINER_HF_HOME}/hub"
DOWNLOAD_TIMEOUT = 24 * 3600.0



def repo_requests(recipe: Recipe) -> list[dict[str, Any]]:
    out = []
    for repo, rev, local in recipe.repos:
        allow, deny = recipe.file_patterns(repo)
        out.append({"repo": repo, "revision": rev, "dir": local, "allow": allow, "deny": deny})
    return out


def manifest_cmd(tools: ModelTools, recipe: Recipe, chunks: bool = False) -> str:
    """Each model's files on the node, with sha256 (cached beside the model; node/fanout.py)."""
    return fanout.node_script_cmd(tools, "manifest", {"hub": HUB_DIR, "chunks": chunks,
                                                      "repos": repo_requests(recipe)})


def manifest_fact(tools: ModelTools, recipe: Recipe) -> Command:
    """The manifest as a fact (what every launch gathers up front): manifest_cmd's node script
    run by the node's own python3 over the same files (the cache a models container mounts is
    that folder), without starting a container, about a second of the node's CPU; a model in a
    local folder (a path in the container) still in a models container. Either way NO_IMAGE
    while the image is not on the node (the models' tools, the token check, need it next)."""
    if any(local is not None for _, _, local in recipe.repos):
        return tools.when_present("models", manifest_cmd(tools, recipe))
    args = {"hub": tools.host_hub(), "chunks": False, "repos": repo_requests(recipe)}
    return tools.when_present("models", join(["python3", "-c", fanout.FANOUT_SCRIPT, "manifest",
                                              json.dumps(args, sort_keys=True)]))


def download_cmd(tools: ModelTools, repo: str, revision: str, local_dir: str | None,
                 with_token: bool, allow: list[str] | None = None,
                 deny: list[str] | None = None, dry_run: bool = False) -> str:
    """`hf download` in a models container; the token is a file HF_TOKEN_PATH names, never a value.
    Patterns go as repeated `--include P` / `--exclude P` (the hf CLI's list options)."""
    argv = ["hf", "download", repo, "--revision", revision]
    if local_dir:
        argv += ["--local-dir", local_dir]
    for pattern in allow or []:
        argv += ["--include", pattern]
    for pattern in deny or []:
        argv += ["--exclude", pattern]
    if dry_run:
        argv.append("--dry-run")
    env = {"HF_TOKEN_PATH": TOKEN_PATH} if with_token else {}
    return tools.cmd(argv, env=env, token=with_token)


def token_write_cmd() -> str:
    """The token file through the node's ledger (orchestrator/node/ledger.py): the content
    arrives on stdin as JSON, never on a command line."""
    from orchestrator.phases.files import write_files_cmd

    return f"install -d -m 0700 /etc/sparkctl/secrets && {write_files_cmd()}"


def token_remove_cmd() -> str:
    """Remove the token file only if it is the one sparkctl wrote (ledger)."""
    from orchestrator.phases.files import undo_files_cmd

    return undo_files_cmd([TOKEN_PATH])


def comparable(entry: dict[str, Any]) -> dict[str, Any]:
    """What must be equal on every node: the commit, the file names, each file's size and sha256."""
    blobs = entry.get("blobs") or {}
    files = {name: [(blobs.get(rel) or {}).get("size"), (blobs.get(rel) or {}).get("sha256")]
             for name, rel in (entry.get("files") or {}).items()}
    return {"commit": entry.get("commit"), "files": files, "partial": bool(entry.get("partial"))}


gb = fanout.gb


def read_manifests(transport: Transport, tools: ModelTools, recipe: Recipe,
                   chunks: bool = False) -> dict[str, Any]:
    result = transport.run(manifest_cmd(tools, recipe, chunks), timeout=3600,
                           display=tools.shown("python3 -c <model manifest>")).check()
    try:
        return dict(json.loads(result.stdout))
    except ValueError:  # (never an internal error: name the node and what it printed)
        raise SparkctlError(f"{transport.node}: the model manifest printed no JSON (exit "
                            f"{result.exit_status}): {(result.stdout + result.stderr)[-300:]!r}; "
                            "run the launch again, and `sparkctl logs` if it persists") from None


SIZE_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}


def dry_run_bytes(output: str) -> int | None:
    """Bytes `hf download --dry-run` says it would fetch ("... totalling 1.2G."), or None."""
    found = re.search(r"totalling ([\d.]+)\s*([KMGTP]?)", output)
    return int(float(found.group(1)) * SIZE_UNITS[found.group(2)]) if found else None


def check_space(ctx: NodeContext, recipe: Recipe, tools: ModelTools, nodes: list[str],
                need: int) -> None:
    """Before downloading: every serving node must have room for what will be fetched (the
    head downloads it, the peers get a copy)."""
    short = []
    for node in nodes:
        manifests = manifests_from_facts(ctx, node, recipe, tools)
        free = min((int(m.get("free") or 0) for m in manifests.values()), default=0)
        if need > free:
            short.append(fanout.space_error(node, HUB_DIR, need, free,
                                            "for the download").args[0])
    if short:
        raise SparkctlError("\n".join(short))


def manifests_from_facts(ctx: NodeContext, node: str, recipe: Recipe,
                         tools: ModelTools) -> dict[str, Any]:
    """The node's manifests; before the models' image is on the node (a dry run), every model
    counts as missing there."""
    answer = (ctx.cluster_facts.get(node) or NodeFacts(node)).command("models")
    if answer is None or answer.rc != 0:
        raise SparkctlError(
            f"{node}: cannot look at the models with {tools.image}: "
            f"{(answer.err if answer else '')[-300:]}")
    if answer.out.strip() == NO_IMAGE:
        return {repo: {"present": False, "bytes": 0, "files": {}, "free": 0, "no_image": True}
                for repo, _, _ in recipe.repos}
    return dict(json.loads(answer.out))


class Download(Step):
    """Fetch what the head lacks, once, in a models container; the token lives only meanwhile."""

    name = "download"
    scope = "head"

    def __init__(self, recipe: Recipe, nodes: list[str], tools: ModelTools) -> None:
        self.recipe, self.nodes, self.tools = recipe, nodes, tools

    def check(self, ctx: NodeContext) -> Outcome:
        manifests = manifests_from_facts(ctx, ctx.node.name, self.recipe, self.tools)
        missing = [repo for repo, _, _ in self.recipe.repos if not manifests[repo]["present"]]
        leftover = ctx.facts.exists(TOKEN_PATH)
        if not missing:
            if leftover:
                return Change("remove a leftover HF token file", payload=[])
            have = ", ".join(f"{r} ({gb(manifests[r]['bytes'])})" for r, _, _ in self.recipe.repos)
            return Unchanged(f"already on {ctx.node.name}: {have}")
        size = self.recipe.memory.weights_gb
        return Change(f"download {', '.join(missing)} on {ctx.node.name} (model ~{size:g} GB)",
                      payload=missing)

    def _check_space(self, ctx: NodeContext, missing: list[str], with_token: bool) -> None:
        """What the downloads will fetch (`hf download --dry-run`, exact) against every serving
        node's free space; an hf without --dry-run only skips the check (said so)."""
        tools = self.tools
        note = ctx.options.note
        need = 0
        for repo, revision, local in self.recipe.repos:
            if repo not in missing:
                continue
            allow, deny = self.recipe.file_patterns(repo)
            result = ctx.run(download_cmd(tools, repo, revision, local, with_token, allow,
                                          deny, dry_run=True), timeout=600,
                             display=tools.shown(f"hf download {repo} --dry-run"))
            size = dry_run_bytes(result.stdout + result.stderr) if result.exit_status == 0 else None
            if size is None:
                note(f"        ! {ctx.node.name}: `hf download --dry-run` gave no size for {repo}; "
                     "free space not checked before the download")
                return
            need += size
        check_space(ctx, self.recipe, tools, self.nodes, need)

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        token = ctx.options.hf_token
        progress = ctx.options.note
        fetched = []
        try:
            if change.payload and token:
                payload = json.dumps([{"path": TOKEN_PATH, "mode": "600",
                                       "content": token.reveal() + "\n"}])
                result = ctx.run(token_write_cmd(), stdin=payload, sudo=True,
                                 display=f"install {TOKEN_PATH} (0600, from stdin)")
                check_written(result, ctx.node.name, "models/download")
            if change.payload:
                self._check_space(ctx, change.payload, bool(token))
            for repo, revision, local in self.recipe.repos:
                if repo not in change.payload:
                    continue
                status, tail = self._download(ctx, progress, repo, revision, local, bool(token))
                if status != 0:
                    hint = "" if token else (
                        " (no HF token was given: set HF_TOKEN or pass --hf-token-file for gated "
                        "models)")
                    raise SparkctlError(f"{ctx.node.name}: download of {repo} failed (exit "
                                        f"{status}){hint}:\n{tail.strip()[-800:]}")
                fetched.append(repo)
        finally:
            ctx.run(token_remove_cmd(), sudo=True, timeout=60)
        return f"downloaded {', '.join(fetched)}" if fetched else "removed a leftover HF token file"

    def _download(self, ctx: NodeContext, progress: Note, repo: str, revision: str,
                  local: str | None, with_token: bool) -> tuple[int, str]:
        """`hf download`, its progress lines throttled; a line at least every heartbeat."""
        tools = self.tools
        # its progress for `sparkctl dashboard` (core/transfers.py), removed when it ends
        board = Transfers(ctx.inventory.cluster.name)
        with Heartbeat(progress, f"{ctx.node.name}: hf download {repo}") as beat:
            beat.say(f"        ↓ {ctx.node.name}: hf download {repo} ({revision})")
            last = [0.0]
            board.update("download", ctx.node.name, repo, line="starting")

            def on_line(line: str) -> None:
                board.update("download", ctx.node.name, repo, line=line)
                if time.monotonic() - last[0] > 5 or "100%" in line:
                    last[0] = time.monotonic()
                    beat.say(f"          {repo}: {line[-110:]}")

            allow, deny = self.recipe.file_patterns(repo)
            try:
                return stream_run(ctx.transport,  # type: ignore[arg-type]
                                  download_cmd(tools, repo, revision, local, with_token, allow,
                                               deny),
                                  on_line, DOWNLOAD_TIMEOUT, tools.shown(f"hf download {repo}"))
            finally:
                board.close()


class Distribute(Step):
    """Copy the head's files to every serving node that differs, then prove all are identical."""

    name = "distribute"
    scope = "head"

    def __init__(self, recipe: Recipe, nodes: list[str], tools: ModelTools) -> None:
        self.recipe, self.nodes, self.tools = recipe, nodes, tools

    def check(self, ctx: NodeContext) -> Outcome:
        peers = [n for n in self.nodes if n != ctx.node.name]
        head = manifests_from_facts(ctx, ctx.node.name, self.recipe, self.tools)
        todo = []
        for repo, _, _ in self.recipe.repos:
            for peer in peers:
                theirs = manifests_from_facts(ctx, peer, self.recipe, self.tools)[repo]
                if not head[repo]["present"] or comparable(theirs) != comparable(head[repo]):
                    todo.append(f"{repo} -> {peer}")
        if todo:
            return Change("copy over the fabric: " + ", ".join(todo), payload=peers)
        return Unchanged(summary(self.recipe, head, [ctx.node.name, *peers]))

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        tools = self.tools
        note = ctx.options.note
        peers: list[str] = change.payload
        # the chunk hashes of a model not hashed before take minutes: said while they run
        with Heartbeat(note, f"{ctx.node.name}: hashing the model's chunks for the copy"):
            head = read_manifests(ctx.transport, tools, self.recipe, chunks=True)  # type: ignore[arg-type]
        for repo, _, _ in self.recipe.repos:
            if not head[repo]["present"]:
                raise SparkctlError(f"{ctx.node.name}: {repo} is not complete on the head "
                                    f"({head[repo].get('error') or 'no config.json'})")
        beat = Heartbeat(note, f"{ctx.node.name}: copy of the model to {', '.join(peers)}")
        board = Transfers(ctx.inventory.cluster.name)  # for `sparkctl dashboard`
        head_name, repos = ctx.node.name, ", ".join(repo for repo, _, _ in self.recipe.repos)
        bar = fanout.FanoutProgress(beat.say, on_update=lambda peer, done, total, rate: board.update(
            "copy", peer, f"{repos}: {head_name} -> {peer}", done=done, total=total, rate=rate))

        def copy_to(peer: str) -> fanout.PeerCopy:
            ip, link = fanout.link_of(ctx.inventory, head_name, peer)
            return fanout.copy_to_peer(head=ctx.transport, peer=ctx.transports[peer],  # type: ignore[arg-type]
                                       tools=tools, peer_ip=ip, progress=bar, link=link,
                                       entries=[head[repo] for repo, _, _ in self.recipe.repos])

        # every peer at once: each gets its own streams over its own link (or switch port)
        started = time.monotonic()
        try:
            with beat:
                outcomes = parallel(copy_to, peers, limit=8)
        finally:
            bar.stop()
            board.close()
        seconds = time.monotonic() - started
        totals = {peer: outcome.get() for peer, outcome in outcomes.items() if outcome.ok}
        errors = [str(outcome.error) for outcome in outcomes.values() if not outcome.ok]
        # the same figures as numbers, for scripts (`--json`: "fanout", per peer)
        ctx.shared.report_extra["fanout"] = {
            peer: copy.figures() for peer, copy in totals.items()}
        if errors:
            raise SparkctlError("; ".join(errors))
        after = self._peer_manifests(ctx, peers)
        for peer in peers:
            for repo, _, _ in self.recipe.repos:
                if comparable(after[peer][repo]) != comparable(head[repo]):
                    raise SparkctlError(
                        f"{peer}: {repo} still differs from {ctx.node.name} after the copy "
                        f"({len(after[peer][repo]['files'])} vs {len(head[repo]['files'])} files); "
                        "run launch again"
                    )
        return ("copied " + fanout.copied_line(list(totals.values()), seconds) + "; "
                + summary(self.recipe, head, [ctx.node.name, *peers]))

    def _peer_manifests(self, ctx: NodeContext, peers: list[str]) -> dict[str, dict[str, Any]]:
        tools = self.tools
        answers = parallel(lambda p: read_manifests(ctx.transports[p], tools, self.recipe), peers)
        return {p: outcome.get() for p, outcome in answers.items()}


def summary(recipe: Recipe, head: dict[str, Any], nodes: list[str]) -> str:
    parts = [
        f"{repo}@{(head[repo].get('commit') or 'local')[:12]}: {len(head[repo]['files'])} files, "
        f"{gb(head[repo]['bytes'])}" for repo, _, _ in recipe.repos
    ]
    return "identical on " + ", ".join(nodes) + ": " + "; ".join(parts)


@dataclass
class ServingPhase(Phase):
    """A phase on the nodes that hold a rank (head first), not the whole inventory."""

    serving: list[str] = field(default_factory=list)

    def nodes(self, inventory: Inventory) -> list[Node]:
        return [inventory.node(name) for name in self.serving]


def phase(recipe: Recipe, nodes: list[str], image: str, inventory: Inventory) -> Phase:
    """The recipe's models (its repos and files) on NODES, the serving nodes in rank order,
    fetched, hashed and copied with IMAGE's tools (the engine's `model_image`)."""
    tools = model_tools(image, inventory)

    def facts(inv: Inventory, node: Node) -> dict[str, Any]:
        return {"files": {TOKEN_PATH: False}, **manifest_fact(tools, recipe).request(),
                "timeout": 3600}

    # the head fetches (in a models container) even when the server is placed on other nodes
    where = [inventory.head_name, *(n for n in nodes if n != inventory.head_name)]
    return ServingPhase("models", [Download(recipe, nodes, tools), Distribute(recipe, nodes, tools)],
                        facts, serving=where)
