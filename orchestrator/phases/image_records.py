"""What a probe learnt about an image, recorded on the node once per image ID.

Some facts about an image can only be had by running it (which Open MPI it ships, whether it has
`ray`), and a throw-away container costs seconds: each is probed once, recorded in
`/var/lib/sparkctl/images/` under a name derived from the image reference, and read back by the
facts gatherer (`cat`, empty when there is none). A record names the image ID it was made for; a
tag that moved to another ID is probed again.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from orchestrator.commands import quote
from orchestrator.core.step import NodeContext
from orchestrator.node import script
from orchestrator.remote.gathered import NodeFacts
from orchestrator.remote.node_facts import DockerImage

RECORD_DIR = "/var/lib/sparkctl/images"


def record_path(image: str, kind: str = "") -> str:
    """The record of one kind of fact about an image ("" is Open MPI's, the first there was)."""
    suffix = f".{kind}" if kind else ""
    return f"{RECORD_DIR}/{hashlib.sha256(image.encode()).hexdigest()[:16]}{suffix}.json"


def record_fact(key: str, path: str) -> dict[str, str]:
    """The facts `commands` entry that reads a record (empty output when there is none)."""
    return {key: f"cat {quote(path)} 2>/dev/null || true"}


def read_record(facts: NodeFacts, key: str) -> dict[str, Any] | None:
    """The record under `key` in the facts' commands, or None when absent or unreadable."""
    answer = facts.command(key)
    out = answer.out.strip() if answer else ""
    try:
        record = json.loads(out) if out else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def detect_and_record_cmd(probe: str, kind: str, image: str, image_id: str, path: str) -> str:
    """One remote command: run `probe`, turn its output into a record of KIND ("mpi", "ray")
    with node/image_record.py (stdin: the probe's output; stdout: the record's JSON), store it
    at `path` and print it."""
    request = json.dumps({"kind": kind, "image": image, "image_id": image_id}, sort_keys=True)
    parse = f"python3 -c {quote(script('image_record.py'))} {quote(request)}"
    return (f"out=$({probe} 2>&1) || {{ echo \"$out\" | tail -20 >&2; exit 2; }}; "
            f"rec=$(printf '%s' \"$out\" | {parse}) || exit 3; "
            f"install -d -m 0755 {quote(RECORD_DIR)} && "
            f"printf '%s\\n' \"$rec\" > {quote(path)}.tmp && mv {quote(path)}.tmp {quote(path)} && "
            "printf '%s\\n' \"$rec\"")


def image_id_now(ctx: NodeContext, image: str) -> str | None:
    """The ID of IMAGE on this node: as pulled or received in this run, else as gathered (None
    when the node has none, or its inspect failed)."""
    pulled = ctx.shared.image_facts.get(ctx.node.name)
    if isinstance(pulled, dict) and pulled.get("Id"):
        return str(pulled["Id"])
    found = DockerImage(image).read(ctx.facts, strict=False)
    return found.id if found and found.id else None
