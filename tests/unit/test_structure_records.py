"""Server records are read once, typed (orchestrator/records.py), and phases/ and engines/ read
them only through attributes: no `server.get("port")`, no `record["nodes"]`. The rule is
static: a string lookup of a record field on a name that holds a server record there."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

from orchestrator.records import Server, ServerRecord

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("phases", "engines")

RECORD_KEYS = ({f.name for f in fields(ServerRecord)} | {f.name for f in fields(Server)}
               | {"legacy"}) - {"extra", "record"}
"""What server.json and node/servers.py's answer hold, typed now."""

RECORD_NAMES = {"server", "servers", "record", "other", "same", "mine", "earlier", "legacy",
                "single", "dead", "moved", "running", "found", "payload", "s"}
"""Names that hold a server record (or what a node listed) where phases and engines use them."""


def _receiver(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def record_lookups(source: str) -> list[tuple[int, str]]:
    """(line, what) of each string lookup of a record field on a record's name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        target, key = None, None
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("get", "pop", "setdefault") and node.args
                and isinstance(node.args[0], ast.Constant)):
            target, key = node.func.value, node.args[0].value
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            target, key = node.value, node.slice.value
        if target is None or key not in RECORD_KEYS:
            continue
        name = _receiver(target)
        if name in RECORD_NAMES:
            found.append((node.lineno, f"{name}[{key!r}]"))
    return found


def test_phases_and_engines_read_server_records_through_attributes() -> None:
    bad = []
    for layer in CHECKED:
        for path in sorted((ROOT / "orchestrator" / layer).rglob("*.py")):
            bad += [f"{path.relative_to(ROOT)}:{line}: {what}"
                    for line, what in record_lookups(path.read_text())]
    assert not bad, ("string lookups on server records (read them as orchestrator.records."
                     "Server / ServerRecord attributes):\n" + "\n".join(bad))


def test_the_lookup_finder_sees_gets_subscripts_and_payloads() -> None:
    source = ('port = server.get("port")\n'
              'nodes = record["nodes"]\n'
              'name = change.payload.get("name")\n'
              'fine = answer.get("pids")\n'
              'also_fine = server.record.port\n'
              'not_a_record_key = server.get("executor")\n')
    assert record_lookups(source) == [(1, "server['port']"), (2, "record['nodes']"),
                                      (3, "payload['name']")]
