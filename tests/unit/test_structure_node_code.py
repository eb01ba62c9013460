"""Node-side code lives in real .py files under orchestrator/node/ (linted, unit-tested, shipped
as package data), never in a Python string of the controller's code: a structure test finds a
program in any string literal (also one glued from pieces with `+` or an f-string) and any
`python3 -c '...'` whose program is written inline."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "orchestrator"
NODE = PACKAGE / "node"
INLINE = re.compile(r"python3?\s+-c\s+(['\"])(?P<code>.+?)\1", re.DOTALL)


def text_of(node: ast.AST) -> str | None:
    """A string expression's text; an f-string's holes and a non-literal piece read as `_`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(text_of(part) or "_" for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = text_of(node.left), text_of(node.right)
        if left is not None or right is not None:
            return (left if left is not None else "_") + (right if right is not None else "_")
    return None


def is_program(text: str) -> bool:
    """Python with an import and at least one more statement (prose and shell do not parse)."""
    try:
        tree = ast.parse(textwrap.dedent(text))
    except (SyntaxError, ValueError):
        return False
    imports = any(isinstance(node, (ast.Import, ast.ImportFrom)) for node in ast.walk(tree))
    return imports and len(tree.body) >= 2


def inline_programs(text: str) -> bool:
    """`python3 -c 'import sys; ...'`: a program written into a command line."""
    return any(is_program(m.group("code")) or "import " in m.group("code")
               for m in INLINE.finditer(text))


def programs_in(path: Path) -> list[int]:
    """Lines of string literals in PATH that hold node-side Python (docstrings aside)."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    lines: set[int] = set()
    for node in ast.walk(tree):
        if id(node) in docstrings:
            continue
        text = text_of(node)
        if text is not None and (is_program(text) or inline_programs(text)):
            lines.add(node.lineno)
    return sorted(lines)


def test_no_node_side_program_in_a_python_string() -> None:
    found = {path.relative_to(ROOT).as_posix(): lines for path in sorted(PACKAGE.rglob("*.py"))
             if NODE not in path.parents and (lines := programs_in(path))}
    assert not found, ("node-side Python in a string (move it to orchestrator/node/NAME.py and "
                       f"send script('NAME.py')): {found}")


PLANTED = '''
"""A module's docstring: import this; it is prose."""
import json
from orchestrator.node import script

FINE = "python3 -c " + script("probe.py") + " --at 8000"
SHELL = "cd /x && import-foo --bar; echo done"
PROSE = "import the model, then serve it"
MULTI = ("import json, sys\\n"
         "print(json.dumps(sys.argv))\\n")
GLUED = "import socket, sys\\n" + "sys.exit(socket.socket().connect_ex(('h', 1)))\\n"
def probe(host):
    return f"import urllib.request\\nurllib.request.urlopen({host!r})\\n"
ONE_LINE = 'python3 -c "import socket,sys; sys.exit(0)" host 22'
INDENTED = """
    import os
    os.remove('x')
"""
'''


def test_the_finder_sees_planted_programs_and_not_prose_or_shell(tmp_path: Path) -> None:
    sample = tmp_path / "planted.py"
    sample.write_text(PLANTED)
    assert programs_in(sample) == [9, 11, 13, 14, 15]
