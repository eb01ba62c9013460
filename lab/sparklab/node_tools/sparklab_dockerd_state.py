"""Container and image state of the lab runtime: paths, JSON records, lookups, locking."""
from __future__ import annotations

import hashlib
import json
import os
import time

ROOT = "/var/lib/sparklab"


CONTAINERS = ROOT + "/containers"


IMAGES = ROOT + "/images"


CONFIG = ROOT + "/config"


OUTBOX = ROOT + "/outbox"


OUTBOX_IN_CONTAINER = "/var/lib/sparklab-outbox"


IMAGE_IN_CONTAINER = "/usr/local/lib/sparklab-image"


SHIM = os.path.join(os.path.dirname(os.path.realpath(__file__)), "dockerd-shim")


DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Container paths that are private to the container, so creating a -v mount point there never
# touches the node or the host root filesystem.


PRIVATE_PREFIXES = ("/etc/", "/opt/", "/root", "/tmp/", "/run/", "/usr/local/", "/workspace")


OVERLAID = ("/etc", "/opt")


class DockerError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def now_iso() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e9):09d}Z"


def parse_iso(text: str) -> float:
    import calendar

    base, _, frac = text.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S")) + float("0." + (frac or "0"))


def read_json(path: str, default: object = None) -> object:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def write_json(path: str, data: object) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def image_dir() -> str:
    lab = read_json(CONFIG + "/lab.json", {}) or {}
    here = os.path.dirname(SHIM)
    for cand in (os.environ.get("SPARKLAB_IMAGE_DIR"), lab.get("image_dir"),
                 "/usr/local/lib/sparklab/image", os.path.join(here, "..", "image")):
        if cand and os.path.isfile(os.path.join(cand, "catalog.json")):
            return os.path.realpath(cand)
    raise DockerError("sparklab: lab image files not found (install lab/sparklab/image "
                      "at /usr/local/lib/sparklab/image)", 125)


def normalize_image(ref: str) -> str:
    if "@" in ref:  # by digest: the catalog image that declares it (else unknown, as a registry)
        return by_digest(ref)
    last = ref.rsplit("/", 1)[-1]
    if "@" not in ref and ":" not in last:
        ref += ":latest"
    if "/" not in ref.split(":")[0]:
        ref = "docker.io/library/" + ref
    return ref


def by_digest(ref: str) -> str:
    """REPO@sha256:... -> the catalog's REPO:TAG whose declared `digest` it is; unchanged
    otherwise (the pull then fails as a registry's "manifest unknown" does)."""
    repo, _, digest = ref.partition("@")
    repo = repo.rsplit(":", 1)[0] if ":" in repo.rsplit("/", 1)[-1] else repo
    catalog = read_json(image_dir() + "/catalog.json", {}) or {}
    for name, entry in (catalog.get("images") or {}).items():
        if name.rsplit(":", 1)[0] == repo and isinstance(entry, dict) \
                and entry.get("digest") == digest:
            return name
    return ref


def catalog_entry(name: str) -> dict:
    """The image's catalog entry ({} for an unknown image)."""
    catalog = read_json(image_dir() + "/catalog.json", {}) or {}
    entry = (catalog.get("images") or {}).get(name)
    return entry if isinstance(entry, dict) else {}


def image_path(name: str) -> str:
    """The image's PATH: DEFAULT_PATH after what the catalog entry puts first (its own MPI)."""
    first = catalog_entry(name).get("path_prepend")
    return f"{first}:{DEFAULT_PATH}" if first else DEFAULT_PATH


def image_env(name: str) -> list[str]:
    """The image's own environment (its Config.Env): its PATH, and for the lab's simulated tools
    which image they run in and what it lacks (SPARKLAB_IMAGE_LACKS=ray: python3 without Ray)."""
    entry = catalog_entry(name)
    env = [f"PATH={image_path(name)}", f"SPARKLAB_IMAGE={name}"]
    if entry.get("lacks"):
        env.append("SPARKLAB_IMAGE_LACKS=" + ",".join(entry["lacks"]))
    return env


def catalog_digest(name: str) -> str | None:
    import hashlib

    d = image_dir()
    catalog = read_json(d + "/catalog.json", {}) or {}
    if name not in catalog.get("images", {}):
        return None
    declared = (catalog["images"][name] or {}).get("digest")
    if declared:  # an image the lab serves under its real registry digest (pinned references)
        return str(declared)
    h = hashlib.sha256(name.encode())
    for base, dirs, files in sorted(os.walk(d)):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for fn in sorted(files):
            h.update(fn.encode())
            with open(os.path.join(base, fn), "rb") as f:
                h.update(f.read())
    return "sha256:" + h.hexdigest()


def node_digest(name: str) -> str | None:
    """Digest as this node reports it; the drift hook may override it (docs/lab-engine.md)."""
    override = read_json(CONFIG + "/image-digest-override.json", {}) or {}
    digest = catalog_digest(name)
    if digest is None:
        return None
    return override.get(name) or override.get("image") or digest


def config_blob(name: str, digest: str) -> bytes:
    """The image's config as `docker save` writes it; its sha256 is the image ID."""
    return json.dumps({"architecture": "arm64", "os": "linux",
                       "config": {"Env": image_env(name), "Cmd": ["/bin/bash"],
                                  "Labels": {"org.sparklab.simulated": "true"}},
                       "sparklab": {"image": name, "repo_digest": digest}},
                      sort_keys=True).encode()


def image_id(name: str, digest: str) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(config_blob(name, digest)).hexdigest()


def registry_blocked() -> bool:
    """The lab fault `block-registry`: this node cannot reach any registry."""
    return os.path.exists(ROOT + "/faults/block-registry")


def registry_unreachable(name: str) -> str:
    """What Go's HTTP client says when the registry's name does not resolve (no DNS/route).
    The registry is the first part of the name when it looks like a host, else Docker Hub."""
    first, _, rest = name.partition("/")
    registry = first if rest and ("." in first or ":" in first or first == "localhost") else \
        "registry-1.docker.io"
    return (f'Get "https://{registry}/v2/": dial tcp: lookup {registry}: no such host '
            "(sparklab fault block-registry)")


def stored_digest(name: str, rec: dict) -> str:
    """The manifest digest an image on this node was made from (its ID derives from it)."""
    return str(rec["digest"] if rec.get("loaded") else (node_digest(name) or rec["digest"]))


def image_record(name: str) -> dict | None:
    rec = read_json(f"{IMAGES}/{name.replace('/', '+')}.json")
    if not isinstance(rec, dict):
        return None
    # a loaded image keeps the ID it was saved with but no registry digest: the classic image
    # store records RepoDigests only on a pull (moby/moby#22011, still so in Docker 29); a
    # pulled one shows this node's registry's digest
    digest = stored_digest(name, rec)
    repo = name.rsplit(":", 1)[0]
    return {"Id": image_id(name, digest), "RepoTags": [name],
            "RepoDigests": [] if rec.get("loaded") else [f"{repo}@{digest}"],
            "Created": rec["pulled"], "Size": 27_000_000_000,
            "Config": {"Env": image_env(name), "Cmd": ["/bin/bash"], "Entrypoint": None,
                       "Labels": {"org.sparklab.simulated": "true"}}}


def pull(ref: str, out: object) -> dict:
    name = normalize_image(ref)
    if registry_blocked():
        raise DockerError(f"Error response from daemon: {registry_unreachable(name)}", 1)
    digest = node_digest(name)
    if digest is None:
        raise DockerError(f"Error response from daemon: manifest for {ref} not found: "
                          "manifest unknown: manifest unknown", 1)
    os.makedirs(IMAGES, exist_ok=True)
    repo, tag = name.rsplit(":", 1)
    print(f"{tag}: Pulling from {repo.split('/', 1)[1]}", file=out)
    fresh = image_record(name) is None
    if fresh:
        pull_layers(digest, out)
    write_json(f"{IMAGES}/{name.replace('/', '+')}.json", {"name": name, "digest": digest,
                                                           "pulled": now_iso()})
    print(f"Digest: {digest}", file=out)
    status = "Downloaded newer image for" if fresh else "Image is up to date for"
    print(f"Status: {status} {name}", file=out)
    return image_record(name) or {}


LAYER_BYTES = (31_500_000, 4_210_000_000, 18_700_000_000, 4_090_000_000)
"""The lab image's layers (27 GB together, the Size `docker image inspect` reports)."""


def human(size: float) -> str:
    """go-units HumanSize, as docker prints sizes (decimal, 3 significant digits)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.3g}{unit}"
        size /= 1000
    return f"{size}B"


def pull_layers(digest: str, out: object) -> None:
    """Docker's per-layer lines; `pull_seconds` in the node's lab.json spreads them over that
    long (a test of progress), and on a terminal the `Downloading` lines carry the bytes
    (off one, docker prints no bytes either)."""
    lab = read_json(CONFIG + "/lab.json", {}) or {}
    seconds = float(lab.get("pull_seconds") or 0)
    tty = hasattr(out, "isatty") and out.isatty()  # type: ignore[attr-defined]
    ids = [hashlib.sha256(f"{digest}/{i}".encode()).hexdigest()[:12] for i in range(len(LAYER_BYTES))]

    def say(line: str) -> None:
        print(line, file=out, flush=True)  # type: ignore[call-overload]

    for layer in ids:
        say(f"{layer}: Pulling fs layer")
    steps = 10
    for layer, total in zip(ids, LAYER_BYTES, strict=True):
        for step in range(1, steps + 1):
            time.sleep(seconds / len(ids) / steps)
            if tty:
                bar = "=" * (5 * step - 1) + (">" if step < steps else "=")
                say(f"{layer}: Downloading [{bar:<50}]  {human(total * step / steps)}/{human(total)}")
        say(f"{layer}: Verifying Checksum")
        say(f"{layer}: Download complete")
    for layer in ids:
        say(f"{layer}: Extracting")
        say(f"{layer}: Pull complete")


def cdir(cid: str) -> str:
    return f"{CONTAINERS}/{cid}"


def load(cid: str) -> dict:
    cfg = read_json(cdir(cid) + "/config.json")
    if not isinstance(cfg, dict):
        raise KeyError(cid)
    state = read_json(cdir(cid) + "/state.json", {}) or {}
    if state.get("Running") and not alive(state.get("Pid")) and not alive(state.get("MonitorPid")):
        state.update(Status="exited", Running=False, ExitCode=137, FinishedAt=now_iso())
    cfg["State"] = state
    return cfg


def all_containers() -> list[dict]:
    out = []
    try:
        names = os.listdir(CONTAINERS)
    except OSError:
        return out
    for cid in names:
        if len(cid) == 64:
            try:
                out.append(load(cid))
            except KeyError:
                continue
    out.sort(key=lambda c: c["Created"], reverse=True)
    return out


def find(ref: str) -> dict:
    for c in all_containers():
        if c["Name"] == "/" + ref or c["Name"] == ref or c["Id"] == ref:
            return c
    matches = [c for c in all_containers() if len(ref) >= 3 and c["Id"].startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    raise DockerError(f"Error response from daemon: No such container: {ref}", 1)


def lock() -> int:
    import fcntl

    ensure_state_fs()
    fd = os.open(CONTAINERS + "/.lock", os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def ensure_state_fs() -> None:
    # Overlay upper dirs cannot live on overlayfs (the node's /var is one): the node's init binds
    # a plain directory of the node's disk here (kept across `lab reboot`); without it (an
    # older node), a tmpfs in the node's mount namespace, gone with the node.
    os.makedirs(CONTAINERS, exist_ok=True)
    os.makedirs(OUTBOX, mode=0o755, exist_ok=True)
    os.makedirs(OUTBOX_IN_CONTAINER, mode=0o755, exist_ok=True)
    if not os.path.ismount(CONTAINERS):
        import subprocess

        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0700,size=8g", "sparklab-containers",
                        CONTAINERS], check=True)


def set_state(cid: str, **changes: object) -> None:
    path = cdir(cid) + "/state.json"
    state = read_json(path, {}) or {}
    state.update(changes)
    write_json(path, state)


def remove_dir(cid: str) -> None:
    import shutil

    shutil.rmtree(cdir(cid), ignore_errors=True)


CALLER_ENV: dict[str, str] | None = None


def caller_env() -> dict[str, str]:
    return CALLER_ENV if CALLER_ENV is not None else dict(os.environ)
