"""Fetch the real Debian netplan.io 0.106 for the lab nodes without installing it on the host.

`apt-get download` + `dpkg -x` into a shared cache; nodes see the result through an overlay of
their /usr (lower layers: this tree, then the host's /usr), so netplan runs at its real paths.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

from sparklab.identity import CACHE_DIR, LabError

# netplan.io and what it imports that a minimal Debian 12 may lack (python3-yaml is a lab
# prerequisite installed on the host; the rest are cheap to carry).
PACKAGES = (
    "netplan.io",
    "libnetplan0",
    "python3-netifaces",
    "python3-dbus",
    "python3-rich",
    "python3-markdown-it",
    "python3-mdurl",
    "python3-pygments",
    "python3-typing-extensions",
    "iputils-ping",  # not on a minimal Debian host; every Spark has it
    "earlyoom",  # for `sparkctl up --oom-guard` (nodes have no route to a mirror)
)
# Versioned by the package list: running labs keep their overlay lower layer untouched when a
# newer lab needs a different set.
_VERSION = hashlib.sha256(" ".join(PACKAGES).encode()).hexdigest()[:12]
NETPLAN_ROOT = CACHE_DIR / "netplan" / f"root-{_VERSION}"
_MARKER = CACHE_DIR / "netplan" / f"complete-{_VERSION}"


def netplan_root() -> Path:
    """The extracted tree (its usr/ is a lower layer of each node's /usr); fetch it if needed."""
    if _extracted():
        return NETPLAN_ROOT
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / "netplan.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several labs may start at once
        if not _extracted():
            _download_and_extract()
    return NETPLAN_ROOT


def _download_and_extract() -> None:
    debs_dir = CACHE_DIR / "netplan" / "debs"
    debs_dir.mkdir(parents=True, exist_ok=True)
    missing = [p for p in PACKAGES if not list(debs_dir.glob(f"{p}_*.deb"))]
    if missing:
        result = subprocess.run(["apt-get", "download", *missing], cwd=debs_dir,
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            # a fresh machine may have empty package lists: refresh them once and retry
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, check=False)
            result = subprocess.run(["apt-get", "download", *missing], cwd=debs_dir,
                                    capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise LabError("could not download netplan for the lab nodes "
                           f"(apt-get download {' '.join(missing)}):\n{result.stderr.strip()}\n"
                           "try `apt-get update` first", 1)
    staging = Path(tempfile.mkdtemp(prefix="root.", dir=NETPLAN_ROOT.parent))
    for deb in sorted(debs_dir.glob("*.deb")):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(staging)], check=True)
    _merge_into_usr(staging)
    if NETPLAN_ROOT.exists():  # a half-finished earlier attempt, never a lower layer in use
        shutil.rmtree(NETPLAN_ROOT)
    staging.rename(NETPLAN_ROOT)
    _MARKER.write_text("extracted: " + " ".join(PACKAGES) + "\n")


def _extracted() -> bool:
    return _MARKER.exists()


def _merge_into_usr(root: Path) -> None:
    """Debian 12 is merged-/usr (/lib -> usr/lib, /bin -> usr/bin): move the debs' files."""
    for top in ("lib", "bin", "sbin"):
        src = root / top
        if not src.is_dir() or src.is_symlink():
            continue
        for path in sorted(src.rglob("*")):
            target = root / "usr" / top / path.relative_to(src)
            if path.is_dir() and not path.is_symlink():
                target.mkdir(parents=True, exist_ok=True)
            elif not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                path.rename(target)
        shutil.rmtree(src)
