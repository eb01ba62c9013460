"""The shape of the code: no import cycles, layers import only downward, small modules, and a
sparkctl wheel that ships the product and nothing of the simulated lab."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "orchestrator"
MAX_LINES = 400

# Layers, lowest first; a module may import its own layer, lower layers and the top-level
# modules (inventory, errors, commands, ...). FORBIDDEN lists what each layer must not import.
JUDGES = ("netcheck", "status")
"""Read-only judges over gathered facts; bench sits above them (it relaunches servers)."""
FORBIDDEN = {
    "remote": {"core", "phases", "engines", "gateway", *JUDGES, "bench", "dashboard", "cli"},
    "core": {"phases", "engines", "gateway", *JUDGES, "bench", "dashboard", "cli"},
    "phases": {"engines", "gateway", *JUDGES, "bench", "dashboard", "cli"},
    "engines": {"gateway", "bench", "dashboard", "cli"},
    "gateway": {"bench", "dashboard", "cli"},
    "netcheck": {"bench", "dashboard", "cli"},
    "status": {"bench", "dashboard", "cli"},
    "bench": {"dashboard", "cli"},
    "advise": {"dashboard", "cli"},
    "dashboard": {"bench", "cli"},  # the web page over status's judges
}
# Modules allowed to break the rule above, with what they may import: core/plan.py assembles
# the plans out of the phases and the engine. Anything else found is a failure to fix.
ALLOWED = {
    "orchestrator.core.plan": {"phases", "engines"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(path: Path, runtime_only: bool) -> list[tuple[str, int]]:
    """(module, line) of every orchestrator module `path` imports, at any depth of the code.

    `from orchestrator.x import y` counts as importing orchestrator.x.y when that is a module.
    With runtime_only, imports under `if TYPE_CHECKING:` are left out (they never run).
    """
    tree = ast.parse(path.read_text(), str(path))
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if runtime_only and _type_checking_block(node):
            for child in node.orelse:  # type: ignore[attr-defined]
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((sub if sub in MODULES else base, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return [(name, line) for name, line in found if name in MODULES and name != here]


def graph(runtime_only: bool = True) -> dict[str, set[str]]:
    return {name: {m for m, _ in imports(path, runtime_only)} for name, path in MODULES.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path [a, b, ..., a], or None (depth-first, colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                return [*stack[stack.index(target):], target]
            if target not in state and (cycle := dfs(target)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (cycle := dfs(start)):
            return cycle
    return None


def test_cycle_finder_finds_and_names_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_graph_sees_function_level_and_submodule_imports() -> None:
    edges = graph()
    # cli/up.py imports core.runner inside a function; session imports connect inside one
    assert "orchestrator.core.runner" in edges["orchestrator.cli.up"]
    assert "orchestrator.remote.connect" in edges["orchestrator.core.session"]
    # `from orchestrator.phases import teardown`-style imports resolve to the submodule
    assert "orchestrator.core.lock" in edges["orchestrator.core.runner"]


# Import edges that close a cycle today, each to be removed by moving code, not by adding here.
# netcheck/checks.py imports netcheck_container inside run_checks (line ~287) while
# netcheck_container.py imports CheckResult, Status and _link from netcheck at module level.
KNOWN_CYCLE_EDGES: set[tuple[str, str]] = set()
"""Import edges allowed to close a cycle (none: netcheck/results.py broke the last one)."""


def test_no_import_cycles() -> None:
    edges = graph(runtime_only=True)
    for source, target in KNOWN_CYCLE_EDGES:
        assert target in edges[source], f"{source} no longer imports {target}: drop it from KNOWN_CYCLE_EDGES"
        edges[source].discard(target)
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else ""


def test_layers_import_only_downward() -> None:
    violations = []
    for name, path in MODULES.items():
        forbidden = FORBIDDEN.get(_layer(name), set()) - ALLOWED.get(name, set())
        for target, line in imports(path, runtime_only=False):
            if _layer(target) in forbidden:
                violations.append(f"{path.relative_to(ROOT)}:{line}: {name} imports {target}")
    assert not violations, "layer violations:\n" + "\n".join(violations)


NO_CLI_LIBRARY = ("core", "remote", "phases", "engines")
"""Layers that must work without the CLI library: they print through core/output.py and ask
through its ask_yes_no, so another front end (or a test) can drive them."""


def library_imports(path: Path, library: str) -> list[int]:
    """Lines of `path` importing `library` (or a submodule of it), at any depth of the code."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        if any(name == library or name.startswith(library + ".") for name in names):
            lines.append(node.lineno)
    return lines


def test_only_the_cli_imports_click() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}" for name, path in MODULES.items()
             if _layer(name) in NO_CLI_LIBRARY for line in library_imports(path, "click")]
    assert not found, "click imported below cli/ (print through core/output.py): " + ", ".join(found)


def test_the_click_finder_sees_nested_imports(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text("import os\ndef f():\n    import click.testing\n    from click import echo\n"
                      "from clicker import x\n")
    assert library_imports(sample, "click") == [3, 4]


@pytest.mark.parametrize("tree", ["orchestrator", "lab/sparklab"])
def test_no_module_is_over_the_line_limit(tree: str) -> None:
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / tree).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them): {long}"


@pytest.mark.slow
def test_wheels_split_product_and_lab(tmp_path: Path) -> None:
    """`python -m build` of both distributions (from a copy, so the checkout gets no build/):
    the sparkctl wheel holds every product module and template and nothing of the lab."""
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", "tests",
        "docs", "benchmarks"))
    wheels = tmp_path / "dist"
    for project in (source, source / "lab"):
        built = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(wheels),
                                str(project)],
                               capture_output=True, text=True, cwd=tmp_path)
        assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
        # every folder shipped is declared: setuptools warns of each undeclared one per install
        assert "Python recognizes" not in built.stdout + built.stderr, built.stderr[-3000:]
    sparkctl = set(zipfile.ZipFile(next(wheels.glob("dgx_sparkctl-*.whl"))).namelist())
    sparklab = set(zipfile.ZipFile(next(wheels.glob("sparklab-*.whl"))).namelist())

    lab_markers = ("sparklab", "docker", "nvidia-smi", "systemctl", "trtllm-serve", "/hf")
    leaked = sorted(n for n in sparkctl if any(m in n.rsplit("/", 1)[-1] or m in n for m in lab_markers))
    assert not leaked, f"lab files in the sparkctl wheel: {leaked}"
    product = {str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")}
    assert product <= sparkctl, f"missing from the sparkctl wheel: {sorted(product - sparkctl)}"
    recipes = {str(p.relative_to(ROOT)) for p in PACKAGE.glob("engines/*/recipes/*.yml")}
    engine_templates = {str(p.relative_to(ROOT)) for p in PACKAGE.glob("engines/*/templates/*")}
    templates = {"orchestrator/" + str(p.relative_to(ROOT)) for p in (ROOT / "templates").rglob("*")
                 if p.is_file()}
    assert recipes and engine_templates and templates
    # `sparkctl init --example` reads the example inventory from the installed package
    assert "orchestrator/inventories/two-sparks.yml" in sparkctl
    assert (recipes | engine_templates | templates) <= sparkctl, sorted(
        (recipes | engine_templates | templates) - sparkctl)

    assert any(n.startswith("sparklab/image/") for n in sparklab), sorted(sparklab)
    assert any(n.startswith("sparklab/node_tools/") for n in sparklab), sorted(sparklab)
    assert not any(n.startswith("orchestrator/") for n in sparklab)


# ------------------------------------------------------------------ the Engine seam
def engine_words() -> tuple[str, ...]:
    """Engine names (the registry's, and TensorRT-LLM's title) as they would leak into code."""
    from orchestrator.engines import REGISTRY

    return (*REGISTRY, "tensorrt")
NOT_ENGINES = ("sglang_router", "sglang-router", "sglang model gateway")
"""Names of the gateway's router (PyPI sglang-router, the SGLang Model Gateway: issue 40), which
is no engine and runs whatever engines serve behind it: the counter skips them."""


def without_router_names(text: str) -> str:
    text = text.lower()
    for name in NOT_ENGINES:
        text = text.replace(name, "")
    return text


KNOWN_LEAKS = {
    # What is left to move behind the Engine seam (issue 24); this list only shrinks. Target: {}.
}


def engine_names_in(path: Path) -> list[str]:
    """Names and string literals naming an engine (docstrings and comments aside: prose may
    name engines; code may not)."""
    import io
    import tokenize

    text = path.read_text()
    prose: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(
                node.value.value, str):
            prose.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return [token.string for token in tokenize.generate_tokens(io.StringIO(text).readline)
            if token.type in (tokenize.NAME, tokenize.STRING) and token.start[0] not in prose
            and any(word in without_router_names(token.string) for word in engine_words())]


def engine_name_counts() -> dict[str, int]:
    from orchestrator.engines import REGISTRY

    counts: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        inside = any(rel.startswith(f"orchestrator/engines/{name}/") for name in REGISTRY)
        if inside or rel == "orchestrator/engines/__init__.py":  # an engine's folder, the registry
            continue
        found = engine_names_in(path)
        if found:
            counts[rel] = len(found)
    return counts


def test_engine_names_stay_in_their_folders() -> None:
    counts = engine_name_counts()
    grown = {path: n for path, n in counts.items() if n > KNOWN_LEAKS.get(path, 0)}
    assert not grown, ("engine names in product code outside orchestrator/engines/NAME/ (make "
                       f"it an Engine member): {grown}")
    fixed = {path for path, n in KNOWN_LEAKS.items() if counts.get(path, 0) < n}
    assert not fixed, f"fewer engine names than KNOWN_LEAKS says: lower it for {sorted(fixed)}"


def test_the_engine_name_counter_sees_code_and_not_prose(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text('"""TensorRT-LLM and vLLM in prose."""\n# sglang in a comment\n'
                      'X = "vllm"\nif engine == "trtllm":\n    pass\n')
    assert engine_names_in(sample) == ['"vllm"', '"trtllm"']
    sample.write_text('import sglang_router\nX = "sglang-router 0.3.2"\nY = "sglang"\n')
    assert engine_names_in(sample) == ['"sglang"']  # the router's names are no engine's


def crossings(engine: str, imported: list[tuple[str, int]], where: str) -> list[str]:
    """The imports (module, line) of a file of ENGINE's folder that reach another engine's."""
    from orchestrator.engines import REGISTRY

    return [f"{where}:{line} imports {target}" for target, line in imported
            if any(target == f"orchestrator.engines.{other}"
                   or target.startswith(f"orchestrator.engines.{other}.")
                   for other in REGISTRY if other != engine)]


def test_no_engine_imports_another_engine() -> None:
    """Engines share code through engines/*.py (placed.py, serverctl.py, ...), never through
    each other's folders: removing one engine's folder must not break another."""
    from orchestrator.engines import REGISTRY

    found = [crossing for name in REGISTRY
             for path in sorted((PACKAGE / "engines" / name).rglob("*.py"))
             for crossing in crossings(name, imports(path, runtime_only=False),
                                       str(path.relative_to(ROOT)))]
    assert not found, "engines import each other (move it to orchestrator/engines/*.py):\n" + \
        "\n".join(found)


def test_the_engine_import_rule_sees_a_crossing() -> None:
    imported = [("orchestrator.engines.placed", 3), ("orchestrator.engines.sglang.ready", 16),
                ("orchestrator.engines.llamacpp.serve", 20), ("orchestrator.engines", 4)]
    assert crossings("llamacpp", imported, "x.py") == [
        "x.py:16 imports orchestrator.engines.sglang.ready"]


def test_the_documented_engine_members_are_the_protocols() -> None:
    """docs/architecture.md's Engine table lists exactly the members of engines.base.Engine (the
    core, at most 10), each implemented by every registered engine; its capability table lists
    exactly the protocols of engines/capabilities.py with their members, and an engine that has
    a member of a capability implements the whole capability (never half of one)."""
    import re

    from orchestrator.engines import REGISTRY, capabilities, get_engine
    from orchestrator.engines.base import Engine

    text = (ROOT / "docs" / "architecture.md").read_text()

    def table(header: str) -> list[list[str]]:
        rows = text[text.index(header):].split("\n\n", 1)[0].splitlines()[2:]
        return [row.split(" | ") for row in rows]

    def names(cell: str) -> set[str]:
        return set(re.findall(r"`([a-z_]+)(?:\([^`]*\))?`", cell))

    def members(protocol: type) -> set[str]:
        return {name for name in {*getattr(protocol, "__annotations__", {}), *vars(protocol)}
                if not name.startswith("_")}

    core = members(Engine)
    assert set().union(*(names(row[0]) for row in table("| member | what it gives |"))) == core
    assert len(core) <= 10, core
    found = {row[0].strip("| `"): names(row[2]) for row in table("| capability | who has it |")}
    protocols = {name: cls for name, cls in vars(capabilities).items() if isinstance(cls, type)
                 and getattr(cls, "_is_protocol", False) and name != "Protocol"}
    assert set(found) == set(protocols)
    for name, cls in protocols.items():
        assert members(cls) <= found[name], (name, members(cls), found[name])
    for engine_name in REGISTRY:
        engine = get_engine(engine_name)
        missing = sorted(m for m in core if not hasattr(engine, m))
        assert not missing, f"{engine_name} lacks Engine members {missing}"
        for cls in protocols.values():
            has = {m for m in members(cls) if hasattr(engine, m)}
            assert has in (set(), members(cls)), f"{engine_name}: half of {cls.__name__}: {has}"
