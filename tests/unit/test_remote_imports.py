"""What importing paramiko costs a run before its first connection (orchestrator/remote/__init__):
invoke and importlib.metadata are stand-ins until something really uses them, and both stand-ins
must then behave as the real modules. Each check runs in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys


def fresh(code: str) -> object:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_paramiko_imports_without_invoke_or_importlib_metadata() -> None:
    loaded = fresh("import sys, json; import orchestrator.remote as r; import paramiko\n"
                   "real = [m for m in ('invoke', 'importlib.metadata', 'email.message', 'zipfile')"
                   " if m in sys.modules and not isinstance(sys.modules[m], r._ImportedOnFirstUse)]\n"
                   "print(json.dumps([paramiko.__version__, real]))")
    real = fresh("import json, importlib.metadata as m; print(json.dumps(m.version('paramiko')))")
    assert loaded == [real, []]


def test_the_metadata_stand_in_answers_as_the_real_module() -> None:
    names = ["paramiko", "pydantic", "pydantic-core", "dgx-sparkctl", "PyYAML"]
    ask = (f"[m.version(n) for n in {names!r}] + [len(m.entry_points(group='console_scripts')) > 0, "
           "m.distribution('paramiko').metadata['Name']]")
    stood_in = fresh("import json; import orchestrator.remote; import importlib.metadata as m\n"
                     f"print(json.dumps({ask}))")
    dotted = fresh("import json; import orchestrator.remote; import importlib.metadata\n"
                   "m = importlib.metadata\n"
                   f"print(json.dumps({ask}))")
    real = fresh(f"import json, importlib.metadata as m; print(json.dumps({ask}))")
    assert stood_in == dotted == real
    missing = ("import json, importlib.metadata as m\ntry:\n    m.version('no-such-dist-xyz')\n"
               "except m.PackageNotFoundError as e:\n    print(json.dumps(str(e)))")
    assert fresh("import orchestrator.remote\n" + missing) == fresh(missing)
