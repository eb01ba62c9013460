"""Shared pieces: lab config, fault flags, NCCL-style interface choice, HF cache lookup, logs."""
from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import sys
import time

SIMULATION_NOTE = "sparklab simulation: no GPU, no real model; behaves like the real tool " \
    "where sparkctl depends on it."
IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x1, 0x8, 0x40
SIOCGIFFLAGS, SIOCGIFADDR = 0x8913, 0x8915
GATED_ORGS = ("nvidia/", "meta-llama/")


def option_table(engine: str):  # type: ignore[no-untyped-def]
    """sparkctl's option table for an engine: the copy `lab up` puts beside the image's code, or
    the source tree's when the simulator runs from a checkout (unit tests)."""
    tables = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tables")
    if os.path.isfile(os.path.join(tables, "optiontable.py")):
        if tables not in sys.path:
            sys.path.insert(0, tables)
        import optiontable  # type: ignore[import-not-found]

        return optiontable.load_table(engine, path=__import__("pathlib").Path(tables, f"{engine}.json"))
    from orchestrator.engines.optiontable import load_table

    return load_table(engine)


def image_version(default: str) -> str:
    """The engine version of the image this container runs (catalog.json, by SPARKLAB_IMAGE from
    the image's environment), else `default` (outside a container: unit tests)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        with open(os.path.join(here, "catalog.json")) as f:
            entry = json.load(f)["images"].get(os.environ.get("SPARKLAB_IMAGE", ""), {})
    except (OSError, ValueError, KeyError):
        entry = {}
    return str(entry.get("version") or default)


class UsageError(Exception):
    """A command line the engine's argparse parser refuses (exit 2)."""


def usage_errors(problems: list) -> None:  # type: ignore[type-arg]
    """argparse's wording for what the option table found: unrecognized arguments (all of them),
    an ambiguous abbreviation with its candidates, or the first bad value."""
    if not problems:
        return
    unknown = [p.key for p in problems if p.message == "unknown option"]
    if unknown:
        raise UsageError(f"unrecognized arguments: {' '.join(unknown)}")
    p = problems[0]
    if p.message.startswith("ambiguous option: could match "):
        raise UsageError(f"ambiguous option: {p.key} could match {p.message.split('match ', 1)[1]}")
    raise UsageError(f"argument {p.key}: {p.message}")


def lab_dir() -> str:
    return os.environ.get("SPARKLAB_LAB_DIR", "/var/lib/sparklab")


def lab_config() -> dict:
    try:
        with open(os.path.join(lab_dir(), "config", "lab.json")) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        cfg = {}
    cfg.setdefault("engine_load_seconds", 2.0)
    cfg.setdefault("model_bytes", 4 * 1024 * 1024)
    cfg.setdefault("ms_per_iteration", 4.0)
    return cfg


def fault(name: str) -> bool:
    return os.path.exists(os.path.join(lab_dir(), "faults", name))


def hostname() -> str:
    return socket.gethostname()


def trt_log(level: str, message: str) -> None:
    stamp = time.strftime("%m/%d/%Y-%H:%M:%S")
    print(f"[{stamp}] [TRT-LLM] [{level}] {message}", file=sys.stderr, flush=True)


def nccl_log(level: str, message: str) -> None:
    pid = os.getpid()
    print(f"{hostname()}:{pid}:{pid} [0] NCCL {level} {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ interfaces
def _ifreq(name: str, request: int) -> bytes | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            return fcntl.ioctl(s.fileno(), request, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None


def interface_flags(name: str) -> int | None:
    res = _ifreq(name, SIOCGIFFLAGS)
    return struct.unpack("H", res[16:18])[0] if res else None


def interface_ipv4(name: str) -> str | None:
    res = _ifreq(name, SIOCGIFADDR)
    return socket.inet_ntoa(res[20:24]) if res else None


def usable(name: str) -> bool:
    flags = interface_flags(name)
    return bool(flags is not None and flags & IFF_UP and flags & IFF_RUNNING
                and interface_ipv4(name))


class NcclError(RuntimeError):
    pass


def nccl_interface() -> tuple[str, str]:
    """The (name, IPv4) NCCL's socket bootstrap would use, or NcclError like NCCL fails."""
    names = [n for _, n in socket.if_nameindex()]
    spec = os.environ.get("NCCL_SOCKET_IFNAME", "")
    if spec:
        nccl_log("INFO", f"NCCL_SOCKET_IFNAME set by environment to {spec}")
    if spec and not spec.startswith("^"):
        exact = spec.startswith("=")
        wanted = [w for w in spec.lstrip("=").split(",") if w]
        # NCCL walks the system's interfaces in their order and keeps those the list matches
        # (the list's own order does not count)
        candidates = [n for n in names
                      if any(n == w if exact else n.startswith(w) for w in wanted)]
    else:
        excluded = [w for w in spec.lstrip("^").split(",") if w]
        candidates = [n for n in names if not any(n.startswith(x) for x in excluded)
                      and not (interface_flags(n) or 0) & IFF_LOOPBACK]
    for name in candidates:
        if usable(name):
            return name, interface_ipv4(name) or ""
    nccl_log("WARN", "Bootstrap : no socket interface found")
    raise NcclError("NCCL error: internal error - please report this issue to the NCCL "
                    "developers (sparklab: NCCL_SOCKET_IFNAME="
                    f"{spec or '<unset>'}: no such interface that is up with an IPv4 address)")


HOSTFILE_VARS = ("OMPI_MCA_orte_default_hostfile", "PRTE_MCA_prte_default_hostfile")


def _launcher_envs() -> list[dict[str, str]]:
    """The environments of this process's ancestors (the MPI daemon that started the rank, its
    launcher): where PRRTE's own PRTE_MCA_* settings live."""
    envs, pid = [], os.getppid()
    for _ in range(6):
        if pid <= 1:
            break
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                raw = f.read().decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        envs.append(dict(item.partition("=")[::2] for item in raw.split("\0") if "=" in item))
        pid = ppid
    return envs


def leader_address() -> str:
    """Lab stand-in for NCCL's unique-id broadcast: rank 0 listens on the hostfile's first host.

    Open MPI 4 hands its ranks OMPI_MCA_orte_default_hostfile; Open MPI 5 (PRRTE) keeps
    PRTE_MCA_* to itself, so the hostfile is then looked up in the environment of the daemon
    that started the rank (prted, or prterun on the head).
    """
    path, source = "", HOSTFILE_VARS[0]
    for env in (os.environ, *_launcher_envs()):
        found = next(((name, env[name]) for name in HOSTFILE_VARS if env.get(name)), None)
        if found:
            source, path = found
            break
    try:
        with open(path) as f:
            for line in f:
                line = line.split("#")[0].strip()
                if line:
                    return line.split()[0]
    except OSError:
        pass
    raise NcclError(f"NCCL error: invalid usage (sparklab: cannot read the MPI hostfile "
                    f"'{path}' named by {source} to find rank 0)")


def rendezvous_port() -> int:
    return int(os.environ.get("SPARKLAB_RDZV_PORT", "29511"))


def rendezvous_timeout() -> float:
    return float(os.environ.get("SPARKLAB_RDZV_TIMEOUT", "600"))


# ------------------------------------------------------------------ Hugging Face cache
def hf_home() -> str:
    if os.environ.get("HF_HOME"):
        return os.environ["HF_HOME"]
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(xdg, "huggingface")


def hub_dir() -> str:
    return os.environ.get("HF_HUB_CACHE") or os.path.join(hf_home(), "hub")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def repo_folder(repo: str) -> str:
    return os.path.join(hub_dir(), "models--" + repo.replace("/", "--"))


def cached_snapshot(repo: str, revision: str = "main") -> str | None:
    folder = repo_folder(repo)
    commit = revision
    ref = os.path.join(folder, "refs", revision)
    if os.path.isfile(ref):
        with open(ref) as f:
            commit = f.read().strip()
    snap = os.path.join(folder, "snapshots", commit)
    return snap if os.path.isfile(os.path.join(snap, "config.json")) else None


class ModelMissing(Exception):
    pass


def resolve_model(ref: str, what: str = "model") -> str:
    """Local dir or HF id -> snapshot path, failing like transformers/huggingface_hub do."""
    if ref.startswith(("/", "./", "../")) or os.path.isdir(ref):
        if os.path.isfile(os.path.join(ref, "config.json")):
            return os.path.realpath(ref)
        if os.path.isdir(ref):
            raise ModelMissing(f"OSError: {ref} does not appear to have a file named "
                               "config.json.")
        raise ModelMissing(f"OSError: Incorrect path_or_model_id: '{ref}'. Please provide "
                           f"either the path to a local folder or the repo_id of a model on "
                           f"the Hub ({what}).")
    snap = cached_snapshot(ref)
    if snap:
        return snap
    if offline():
        raise ModelMissing(
            "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate "
            "cached snapshot folder for the specified revision on the local disk and outgoing "
            "traffic has been disabled. To enable repo look-ups and downloads online, set "
            f"'HF_HUB_OFFLINE=0' as environment variable. ({what} {ref}, cache {hub_dir()})")
    raise ModelMissing(
        f"OSError: We couldn't connect to 'https://huggingface.co' to load the files, and "
        f"couldn't find them in the cached files. ({what} {ref} not in {hub_dir()}; the "
        "sparklab has no internet: run `hf download` on every node first)")
