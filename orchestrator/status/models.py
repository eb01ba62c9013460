"""`sparkctl status --deep`: the running servers' model files re-hashed on every node they run
on, against the head's, ignoring the hash cache (phases/verify_models.py says why). Read-only:
a difference is a problem on that node's row; `launch RECIPE --verify-models` repairs it.
"""

from __future__ import annotations

from typing import Any

from orchestrator.errors import SparkctlError
from orchestrator.inventory import Inventory
from orchestrator.remote.fact_records import CommandResult


def verify_served_models(inventory: Inventory, result: dict[str, Any]) -> None:
    """Adds `models_verified` to `result` and a problem per node whose files differ."""
    from orchestrator.core.session import open_session
    from orchestrator.engines import engine_of, load_recipe
    from orchestrator.phases.model_tools import model_tools
    from orchestrator.phases.verify_models import differences, parse, rehash_cmd
    from orchestrator.remote.cluster import parallel

    head = inventory.head_name
    checked: list[dict[str, Any]] = []
    with open_session(inventory, "status", quiet=True) as session:
        for server in result.get("servers") or []:
            try:
                recipe = load_recipe(str(server.get("recipe_file") or server.get("recipe")
                                         or server.get("name")))
            except SparkctlError as exc:
                checked.append({"server": server.get("name"), "error": str(exc)})
                continue
            listed = server.get("nodes") or [server.get("node")]
            nodes = [head, *(n for n in listed if n and n != head)]
            reach = [n for n in nodes if n in session.transports]

            def rehash(node: str, recipe: Any = recipe) -> dict[str, Any]:
                answer = session.transports[node].run(
                    rehash_cmd(model_tools(engine_of(recipe).model_image(recipe, inventory),
                                           inventory), recipe, False), sudo=True, timeout=3600,
                    display="re-hash the model files (status --deep)")
                return parse(CommandResult(answer.exit_status, answer.stdout, answer.stderr), node)

            found = parallel(rehash, reach)
            entry: dict[str, Any] = {"server": server.get("name"), "nodes": {}}
            head_manifest = found[head].get() if head in found and found[head].ok else None
            for node in reach:
                outcome = found[node]
                if not outcome.ok or head_manifest is None:
                    why = str(outcome.error) if not outcome.ok else f"the head {head} could not say"
                    entry["nodes"][node] = {"error": why}
                    continue
                mine = outcome.get()
                differ = differences(head_manifest, mine) if node != head else []
                misnamed = [r for e in mine.values() for r in e.get("misnamed") or []]
                entry["nodes"][node] = {"files": sum(len(e.get("blobs") or {}) for e in mine.values()),
                                        "differ": differ, "misnamed": misnamed}
                if differ or misnamed:
                    row = result["nodes"][node]
                    row["problems"].append(
                        f"model files of {server.get('name')} differ from "
                        + ("their sha256 names" if misnamed else "the head's")
                        + f" (the hash cache did not notice): {', '.join((differ + misnamed)[:5])}; "
                        f"`sparkctl launch {recipe.name} --verify-models` repairs them")
                    row["state"] = "problem"
                    result["ok"] = False
            checked.append(entry)
    result["models_verified"] = checked


def verified_lines(checked: list[dict[str, Any]]) -> list[str]:
    """What `status --deep` says of each server's files, a match included (silence read as
    "not checked"): `models of NAME: N files identical on spark-a, spark-b`."""
    lines = []
    for entry in checked:
        if entry.get("error"):
            lines.append(f"models of {entry.get('server')}: not checked: {entry['error']}")
            continue
        nodes = entry.get("nodes") or {}
        same = [n for n, v in nodes.items() if "error" not in v and not v.get("differ")
                and not v.get("misnamed")]
        files = max((int(v.get("files") or 0) for v in nodes.values() if "files" in v), default=0)
        text = f"models of {entry.get('server')}: "
        text += (f"{files} file(s) re-hashed, identical on {', '.join(same)}" if same
                 else "no node could be compared")
        differ = [n for n in nodes if n not in same]
        if differ:
            text += f"; differ or not checked on {', '.join(differ)} (see the problems above)"
        lines.append(text)
    return lines or ["models: no running server to check"]
