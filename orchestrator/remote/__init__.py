"""One connection per node and what runs over it (see docs/architecture.md).

paramiko's config module imports invoke at import time (only `Match exec` lines in
~/.ssh/config use it), and invoke imports unittest.mock and asyncio: together about a tenth of
a second of every run, most of which never read such a line. Until its first use, `invoke` is
a stand-in module that imports the real one when paramiko first touches it.

paramiko's own `__init__` asks `importlib.metadata.version("paramiko")` (for its SSH client
banner), and importing importlib.metadata (email, zipfile, csv...) costs ~17 ms before the first
connection can start. Until something asks it more than a version, importlib.metadata is a
stand-in whose `version` reads the installed `NAME-VERSION.dist-info` folder's name.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from typing import Any


class _ImportedOnFirstUse(types.ModuleType):
    """A module whose first attribute lookup imports the real module of that name. (The
    standard library's LazyLoader is loaded by the `import` statement itself, which reads the
    module's __spec__.)"""

    def __getattr__(self, attribute: str) -> Any:
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), attribute)


def _import_on_first_use(name: str) -> None:
    if name not in sys.modules and importlib.util.find_spec(name) is not None:
        sys.modules[name] = _ImportedOnFirstUse(name)


class _MetadataOnFirstUse(_ImportedOnFirstUse):
    """importlib.metadata: `version` from the dist-info folder's name on sys.path (what pip
    installs), the real module for anything else or a distribution found no other way."""

    def version(self, distribution: str) -> str:
        prefix = distribution.replace("-", "_").lower() + "-"
        for folder in sys.path:
            try:
                names = os.listdir(folder or ".")
            except OSError:
                continue
            for name in names:
                if name.endswith(".dist-info") and name.lower().startswith(prefix):
                    return name[len(prefix):-len(".dist-info")]
        return str(self.__getattr__("version")(distribution))


_import_on_first_use("invoke")
if "importlib.metadata" not in sys.modules:
    sys.modules["importlib.metadata"] = importlib.metadata = _MetadataOnFirstUse(
        "importlib.metadata")
