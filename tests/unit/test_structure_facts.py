"""Steps read a node's facts through the typed `NodeFacts` (remote/gathered.py), never by string
lookups into the gatherer's JSON: in phases/ and engines/, no `facts.get("...")` or
`facts["..."]` on anything named facts, and no facts typed as a dict. The checker is proven
on planted examples, so a rule that stopped seeing anything would fail here too."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TYPED_LAYERS = ("phases", "engines")

FACTS_NAME = re.compile(r"^(facts|cluster_facts|node_facts|head_facts|ctx_facts|\w+_facts)$")
"""What a variable, attribute or parameter holding facts is called here."""


def _named_facts(node: ast.AST) -> bool:
    """`facts`, `ctx.facts`, `ctx.cluster_facts[name]`, `cluster_facts.get(n)`: an expression
    whose value is a node's facts (or every node's)."""
    if isinstance(node, ast.Name):
        return bool(FACTS_NAME.match(node.id))
    if isinstance(node, ast.Attribute):
        return bool(FACTS_NAME.match(node.attr))
    if isinstance(node, ast.Subscript):
        return _named_facts(node.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return _named_facts(node.func.value)
    if isinstance(node, ast.BoolOp):  # (cluster_facts.get(n) or ...)
        return any(_named_facts(value) for value in node.values)
    return False


def _is_text(node: ast.AST) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)) or isinstance(node, ast.JoinedStr)


DICT_TYPE = re.compile(r"^(dict|Dict|Mapping)(\[str, (Any|dict\[str, Any\]|dict)\])?$|^Any$")
"""An annotation that leaves facts untyped."""


def string_lookups(source: str) -> list[str]:
    """'line: code' of every string lookup on facts and every facts parameter or variable
    typed as a dict."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if _string_lookup(node):
            found.append(f"{getattr(node, 'lineno', 0)}: {ast.unparse(node)}")
        elif isinstance(node, ast.arg) and node.annotation is not None and FACTS_NAME.match(node.arg):
            if _untyped(node.annotation):
                found.append(f"{node.lineno}: {node.arg}: {ast.unparse(node.annotation)}")
        elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name | ast.Attribute)
              and _named_facts(node.target) and _untyped(node.annotation)):
            found.append(f"{node.lineno}: {ast.unparse(node.target)}: {ast.unparse(node.annotation)}")
    return found


def _string_lookup(node: ast.AST) -> bool:
    """facts["..."] or facts.get("...")."""
    if isinstance(node, ast.Subscript):
        return _named_facts(node.value) and _is_text(node.slice)
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get" and _named_facts(node.func.value)
            and bool(node.args) and _is_text(node.args[0]))


def _untyped(annotation: ast.AST) -> bool:
    text = ast.unparse(annotation).replace("'", "").replace('"', "")
    return bool(DICT_TYPE.match(text)) or text.startswith(("dict[str, dict[str, Any]]", "dict[str, Any] |"))


def typed_layer_files() -> list[Path]:
    return sorted(p for layer in TYPED_LAYERS for p in (ROOT / "orchestrator" / layer).rglob("*.py"))


def test_phases_and_engines_read_facts_only_through_types() -> None:
    offences = [f"{path.relative_to(ROOT)}:{where}" for path in typed_layer_files()
                for where in string_lookups(path.read_text())]
    assert not offences, ("string lookups on facts (read them as NodeFacts attributes, "
                          "remote/gathered.py):\n" + "\n".join(offences))


@pytest.mark.parametrize("planted", [
    'x = ctx.facts.get("commands")',
    'x = (facts.get("files") or {}).get(path)',
    'x = ctx.cluster_facts[node]["hostname"]',
    'x = ctx.cluster_facts.get(node).get("time")',
    'x = node_facts["links"]',
    'x = facts.get(f"ethtool:{name}")',
    'def f(facts: dict[str, Any]) -> None: ...',
    'def f(cluster_facts: dict[str, dict[str, Any]]) -> None: ...',
    'def f(facts: "dict[str, Any]") -> None: ...',
    'def f(node_facts: Any) -> None: ...',
    'class C:\n    facts: dict[str, Any]\n',
])
def test_the_checker_sees_a_planted_string_lookup(planted: str) -> None:
    assert string_lookups(planted), planted


@pytest.mark.parametrize("clean", [
    'x = ctx.facts.command("serve")',
    'x = ctx.facts.file(LEDGER).content',
    'x = ctx.cluster_facts[node.name].hostname',
    'x = ctx.cluster_facts.get(node) or NodeFacts(node)',
    'x = ctx.shared.image_facts.get(name)',
    'x = server.get("engine")',
    'def facts(inventory: Inventory, node: Node) -> dict[str, Any]: ...',
    'def f(facts: NodeFacts, cluster_facts: dict[str, NodeFacts]) -> None: ...',
])
def test_the_checker_leaves_typed_reads_alone(clean: str) -> None:
    assert not string_lookups(clean), clean


def test_the_step_context_carries_typed_facts() -> None:
    from orchestrator.core.step import NodeContext

    hints = NodeContext.__annotations__
    assert hints["facts"] == "NodeFacts" and hints["cluster_facts"] == "dict[str, NodeFacts]"
