"""Inside a new container's mount and PID namespaces: build its filesystem view, exec CMD."""
from __future__ import annotations

import os
import sys

from sparklab_dockerd_state import (
    DEFAULT_PATH,
    IMAGE_IN_CONTAINER,
    OUTBOX,
    OUTBOX_IN_CONTAINER,
    OVERLAID,
    PRIVATE_PREFIXES,
    ROOT,
    cdir,
    read_json,
)

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT = 1, 2, 4, 32
MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 4096, 8192, 16384, 1 << 18


def mount(src: str | None, target: str, fstype: str | None, flags: int,
          data: str | None = None) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    def enc(s):
        return (s.encode() if s is not None else None)
    if libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {src} -> {target}: {os.strerror(err)}")


def bind(src: str, target: str, readonly: bool = False) -> None:
    mount(src, target, None, MS_BIND | MS_REC)
    if readonly:
        mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)


def make_mountpoint(dst: str, like: str) -> None:
    if os.path.exists(dst):
        return
    if not any(dst.startswith(p) or dst == p.rstrip("/") for p in PRIVATE_PREFIXES):
        raise OSError(f'sparklab: mount point "{dst}" would be created on the host; use a '
                      f"destination under {', '.join(PRIVATE_PREFIXES)}")
    if os.path.isdir(like):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()


def hide_tools(names: list[str]) -> None:
    """/usr/local/bin as the image has it: links to the lab image's tools except those the real
    image lacks (its `ray`), so `command -v ray` finds nothing and `docker run IMAGE ray` fails."""
    mount("tmpfs", "/usr/local/bin", "tmpfs", MS_NODEV, "mode=0755")
    tools = IMAGE_IN_CONTAINER + "/bin"
    for tool in sorted(os.listdir(tools)):
        if tool not in names:
            os.symlink(f"{tools}/{tool}", f"/usr/local/bin/{tool}")


def container_init(cid: str) -> None:
    d = cdir(cid)
    config = read_json(d + "/config.json")
    assert isinstance(config, dict)
    lab = config["sparklab"]
    env = dict(e.partition("=")[::2] for e in config["Config"]["Env"])
    env.setdefault("HOME", "/root")
    env.setdefault("HOSTNAME", os.uname().nodename)
    os.umask(0o022)
    # The state dir disappears from view once /var/lib/sparklab is mounted: keep a handle on it.
    state_fd = os.open(d, os.O_DIRECTORY)

    def mark(name: str, text: str = "") -> None:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, dir_fd=state_fd)
        with os.fdopen(fd, "w") as f:
            f.write(text)

    try:
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        bind("/proc/sys", "/proc/sys", readonly=True)
        # the node's /proc/meminfo (its memory cgroup, sparklab/memory.py), as docker shows a
        # container the node's; before /run is replaced by the container's own tmpfs
        if os.path.exists("/run/sparklab/meminfo"):
            bind("/run/sparklab/meminfo", "/proc/meminfo", readonly=True)
        stage = d + "/stage-image"
        os.makedirs(stage, exist_ok=True)
        bind(lab["image_dir"], stage, readonly=True)
        # Bind sources are taken from the node's own tree BEFORE /etc and /opt are overlaid, as
        # docker binds host paths: a bind through the overlay would show the overlay's (cached)
        # view, where a file deleted on the node could still be opened by name.
        staged = []
        for index, m in enumerate(config["Mounts"]):
            if not os.path.exists(m["Source"]):
                os.makedirs(m["Source"], exist_ok=True)
            point = f"{d}/stage-mount-{index}"
            if os.path.isdir(m["Source"]):
                os.makedirs(point, exist_ok=True)
            else:
                open(point, "a").close()
            bind(m["Source"], point, readonly=not m["RW"])
            staged.append((point, m))
        for path in OVERLAID:
            layer = f"{d}/layers{path}"
            os.makedirs(layer + "/upper", exist_ok=True)
            os.makedirs(layer + "/work", exist_ok=True)
            if os.path.isdir(path):
                mount("overlay", path, "overlay", 0,
                      f"lowerdir={path},upperdir={layer}/upper,workdir={layer}/work")
        bind(d + "/root", "/root")
        mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
        mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
        mount("tmpfs", "/usr/local", "tmpfs", MS_NODEV, "mode=0755")
        for sub in ("bin", "sbin", "lib/sparklab-image"):
            os.makedirs("/usr/local/" + sub)
        mount(stage, IMAGE_IN_CONTAINER, None, MS_MOVE)
        bind(IMAGE_IN_CONTAINER + "/bin", "/usr/local/bin", readonly=True)
        if lab.get("image_lacks"):  # the real image has no such tool: not on PATH at all
            hide_tools(lab["image_lacks"])
        # Outbox first: a bind taken from inside the read-only lab dir would be read-only too.
        if os.path.isdir(OUTBOX_IN_CONTAINER):
            bind(OUTBOX, OUTBOX_IN_CONTAINER)
        for point, m in staged:  # before ROOT is re-bound: the stage points live under it
            make_mountpoint(m["Destination"], m["Source"])
            mount(point, m["Destination"], None, MS_MOVE)
        # Not recursive: the containers' state tmpfs stays out of the container.
        mount(ROOT, ROOT, None, MS_BIND)
        mount(None, ROOT, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
        # What the image itself carries beyond the simulated engine (e.g. Open MPI 5).
        for m in lab.get("image_mounts") or []:
            if not os.path.isdir(m["source"]):
                raise OSError(f"sparklab: image {lab['image_name']} needs {m['source']} on the "
                              "node (`lab up` installs it; llama.cpp's binaries: `lab up --llamacpp`); "
                              "recreate the lab")
            make_mountpoint(m["destination"], m["source"])
            bind(m["source"], m["destination"], readonly=True)
        argv = lab["argv"]
        exe = argv[0] if "/" in argv[0] else next(
            (f"{p}/{argv[0]}" for p in env.get("PATH", DEFAULT_PATH).split(":")
             if os.access(f"{p}/{argv[0]}", os.X_OK) and not os.path.isdir(f"{p}/{argv[0]}")),
            None)
        if exe is None or not os.path.exists(exe):
            raise OSError(f'runc create failed: unable to start container process: exec: '
                          f'"{argv[0]}": executable file not found in $PATH')
        try:
            os.chdir(lab["workdir"])
        except OSError as exc:
            raise OSError(f"runc create failed: unable to start container process: chdir to "
                          f"cwd (\"{lab['workdir']}\") set in config.json failed: "
                          "no such file or directory") from exc
    except Exception as exc:
        mark("init-error", str(exc))
        sys.exit(127)
    mark("started")
    os.close(state_fd)
    os.execve(exe, argv, env)
