"""`docker run`/`start`: option parsing, container records, the monitor that outlives the SSH session."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time

from sparklab_dockerd_state import (
    DEFAULT_PATH,
    SHIM,
    DockerError,
    caller_env,
    catalog_entry,
    cdir,
    find,
    image_dir,
    image_env,
    image_record,
    lock,
    normalize_image,
    now_iso,
    pull,
    read_json,
    remove_dir,
    set_state,
    write_json,
)

RUN_VALUE_FLAGS = {"--name", "-e", "--env", "--env-file", "-v", "--volume", "--label", "-l",
                   "--network", "--net", "--ulimit", "--device", "--gpus", "--ipc", "--shm-size",
                   "--restart", "--entrypoint", "-w", "--workdir", "--user", "-u", "--hostname",
                   "-h", "--pid", "--runtime", "--cap-add", "--security-opt", "--memory", "-m",
                   "--cpus", "--log-driver", "--log-opt", "--stop-timeout", "--pull",
                   "--platform", "--add-host", "-p", "--publish", "--tmpfs", "--stop-signal"}


COLLECTED = "collected"
"""Marker an attached `docker run --rm` client leaves once it has the exit code."""
ATTACHED_CLIENT_WAIT = 30.0

RUN_BOOL_FLAGS = {"-d", "--detach", "--rm", "-i", "--interactive", "-t", "--tty", "--privileged",
                  "--init", "-it", "-dit", "-ti", "-di", "-id"}


def split_flags(args: list[str], value_flags: set[str], bool_flags: set[str], cmd: str,
                ) -> tuple[list[tuple[str, str | None]], list[str]]:
    """docker-style option parsing: options until the first positional argument."""
    opts: list[tuple[str, str | None]] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return opts, args[i + 1:]
        if not a.startswith("-") or a == "-":
            return opts, args[i:]
        flag, eq, val = a.partition("=")
        if flag in value_flags:
            if not eq:
                if flag.startswith("--") or len(a) == 2:
                    i += 1
                    if i >= len(args):
                        raise DockerError(f"flag needs an argument: {flag}\n"
                                          f"See 'docker {cmd} --help'.", 125)
                    val = args[i]
                else:  # -eFOO=bar
                    flag, val = a[:2], a[2:]
            opts.append((flag, val))
        elif a in bool_flags:
            opts.append((a, None))
        elif len(a) > 2 and a[1] != "-" and a[:2] in value_flags:
            opts.append((a[:2], a[2:]))
        else:
            raise DockerError(f"unknown flag: {flag}\nSee 'docker {cmd} --help'.", 125)
        i += 1
    return opts, []


def env_entries(opts: list[tuple[str, str | None]]) -> list[str]:
    env: list[str] = []
    for flag, val in opts:
        if flag in ("-e", "--env") and val is not None:
            if "=" in val:
                env.append(val)
            elif val in caller_env():
                env.append(f"{val}={caller_env()[val]}")
        elif flag == "--env-file" and val is not None:
            try:
                with open(val) as f:
                    lines = f.read().splitlines()
            except OSError as exc:
                raise DockerError(f"docker: open {val}: {exc.strerror.lower()}.", 125) from exc
            for line in lines:
                line = line.strip()
                if line and not line.startswith("#"):
                    env.append(line if "=" in line else f"{line}={caller_env().get(line, '')}")
    return env


def parse_volume(spec: str) -> dict:
    parts = spec.split(":")
    if len(parts) < 2 or len(parts) > 3 or not parts[1].startswith("/"):
        raise DockerError(f"docker: Error response from daemon: invalid volume specification: "
                          f"'{spec}'.\nSee 'docker run --help'.", 125)
    if not parts[0].startswith("/"):
        raise DockerError(f"docker: sparklab: named volume '{parts[0]}' is not supported "
                          "(use an absolute host path).", 125)
    mode = parts[2] if len(parts) == 3 else "rw"
    return {"Type": "bind", "Source": os.path.normpath(parts[0]),
            "Destination": os.path.normpath(parts[1]), "Mode": mode, "RW": "ro" not in mode,
            "Propagation": "rprivate"}


def cmd_run(args: list[str]) -> int:
    import secrets

    opts, rest = split_flags(args, RUN_VALUE_FLAGS, RUN_BOOL_FLAGS, "run")
    flags = {f for f, _ in opts}
    if not rest:
        raise DockerError('docker: "docker run" requires at least 1 argument.\n'
                          "See 'docker run --help'.", 125)
    detached = bool(flags & {"-d", "--detach", "-dit", "-di", "-id"})
    ref, cmd = rest[0], rest[1:]
    name_opt = [v for f, v in opts if f == "--name"]
    env = env_entries(opts)
    labels = dict((v or "").partition("=")[::2] for f, v in opts if f in ("--label", "-l"))
    mounts = [parse_volume(v or "") for f, v in opts if f in ("-v", "--volume")]
    entrypoint = next((v for f, v in reversed(opts) if f == "--entrypoint"), None)
    workdir = next((v for f, v in reversed(opts) if f in ("-w", "--workdir")), None) or "/"
    network = next((v for f, v in reversed(opts) if f in ("--network", "--net")), "default")
    image_name = normalize_image(ref)
    fd = lock()
    try:
        name = name_opt[-1] if name_opt else None
        if name:
            try:
                other = find(name)
                raise DockerError(
                    f'docker: Error response from daemon: Conflict. The container name "/{name}" '
                    f'is already in use by container "{other["Id"]}". You have to remove (or '
                    "rename) that container to be able to reuse that name.\n"
                    "See 'docker run --help'.", 125)
            except DockerError as exc:
                if exc.code == 125:
                    raise
        image = image_record(image_name)
        if image is None:
            print(f"Unable to find image '{ref}' locally", file=sys.stderr)
            try:
                image = pull(ref, sys.stderr)
            except DockerError as exc:
                raise DockerError(f"docker: {exc}.\nSee 'docker run --help'.", 125) from exc
        argv = ([entrypoint] if entrypoint else []) + (cmd or ([] if entrypoint else ["/bin/bash"]))
        cid = secrets.token_hex(32)
        name = name or f"sparklab_{cid[:8]}"
        d = cdir(cid)
        os.makedirs(d + "/root", mode=0o700)
        config = {
            "Id": cid, "Created": now_iso(), "Path": argv[0], "Args": argv[1:],
            "Name": "/" + name, "Image": image["Id"], "Driver": "overlay2",
            "Config": {"Hostname": os.uname().nodename, "Image": ref,
                       "Env": [*image_env(image_name), *env], "Cmd": cmd or None,
                       "Entrypoint": [entrypoint] if entrypoint else None,
                       "WorkingDir": workdir if workdir != "/" else "", "Labels": labels},
            "HostConfig": {"NetworkMode": network, "Binds": [v for f, v in opts
                                                             if f in ("-v", "--volume")],
                           # dockerd removes a --rm container itself, attached or not: a
                           # client killed mid-run leaves nothing behind
                           "AutoRemove": "--rm" in flags,
                           "Privileged": "--privileged" in flags,
                           "RestartPolicy": {"Name": next((v for f, v in opts
                                                           if f == "--restart"), "no")},
                           "IpcMode": next((v for f, v in opts if f == "--ipc"), "private"),
                           "ShmSize": next((v for f, v in opts if f == "--shm-size"), "64m"),
                           "Ulimits": [v for f, v in opts if f == "--ulimit"],
                           "Devices": [v for f, v in opts if f == "--device"],
                           "DeviceRequests": [v for f, v in opts if f == "--gpus"]},
            "Mounts": mounts,
            "sparklab": {"argv": argv, "workdir": workdir, "image_dir": image_dir(),
                         "attached": not detached,
                         "image_name": image_name,
                         "image_mounts": catalog_entry(image_name).get("mounts") or [],
                         "image_lacks": catalog_entry(image_name).get("lacks") or []},
        }
        write_json(d + "/config.json", config)
        write_json(d + "/state.json", {"Status": "created", "Running": False, "Pid": 0,
                                       "ExitCode": 0, "StartedAt": "0001-01-01T00:00:00Z",
                                       "FinishedAt": "0001-01-01T00:00:00Z"})
    finally:
        os.close(fd)
    if detached:
        return start_container(cid, "run")
    return run_attached(cid, remove="--rm" in flags,
                        stdin=bool(flags & {"-i", "--interactive", "-it", "-ti"}))


def feed_stdin(fifo: str) -> None:
    """`docker run -i`: this command's stdin is the container's (through a FIFO the monitor
    opens as the process's stdin); its end is the process's end of input."""
    with contextlib.suppress(OSError), open(fifo, "wb", buffering=0) as out:
        while True:
            chunk = os.read(0, 65536)
            if not chunk:
                break
            out.write(chunk)


def run_attached(cid: str, remove: bool, stdin: bool = False) -> int:
    """Foreground `docker run`: stream the container's output, return its exit code; with -i,
    the caller's stdin goes to the container's process."""
    import io
    import threading

    from sparklab_dockerd_query import cmd_logs

    if stdin:
        os.mkfifo(cdir(cid) + "/stdin", 0o600)
        threading.Thread(target=feed_stdin, args=(cdir(cid) + "/stdin",), daemon=True).start()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            start_container(cid, "run")
    except DockerError:
        if remove:
            remove_dir(cid)
        raise
    # the monitor marks the container running once it has its process: `logs -f` ends at once
    # for a container not (yet) running, and a quick one's output was lost (an empty answer,
    # exit 0) when this client got there first, as under a loaded machine
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (read_json(cdir(cid) + "/state.json", {}) or {}).get(
            "Status") not in ("running", "exited"):
        time.sleep(0.01)
    cmd_logs(["-f", cid])
    deadline = time.monotonic() + 10
    state: dict = {}
    while time.monotonic() < deadline:
        state = read_json(cdir(cid) + "/state.json", {}) or {}
        if state.get("Status") == "exited":
            break
        time.sleep(0.05)
    # the exit code is ours now: the monitor may remove the container (AutoRemove)
    with contextlib.suppress(OSError), open(cdir(cid) + "/" + COLLECTED, "w"):
        pass
    if remove:
        remove_dir(cid)
    return int(state.get("ExitCode", 0))


def start_locked(cid: str) -> int:
    """`docker start` of an existing container, under the runtime's lock (start, restart and
    the boot-time restart policies all go through here)."""
    fd = lock()
    try:
        return start_container(cid, "start")
    finally:
        os.close(fd)


def start_container(cid: str, verb: str) -> int:
    d = cdir(cid)
    set_state(cid, ManuallyStopped=False)
    for marker in ("started", "init-error"):
        if os.path.exists(f"{d}/{marker}"):
            os.unlink(f"{d}/{marker}")
    spawn_monitor(cid)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if os.path.exists(d + "/init-error"):
            with open(d + "/init-error") as f:
                msg = f.read().strip()
            prefix = "docker: " if verb == "run" else ""
            code = 127 if "not found" in msg else 126
            raise DockerError(f"{prefix}Error response from daemon: failed to create task for "
                              f"container: failed to create shim task: OCI runtime create "
                              f"failed: {msg}: unknown.", code if verb == "run" else 1)
        if os.path.exists(d + "/started") or not os.path.isdir(d):
            break
        if (read_json(d + "/state.json", {}) or {}).get("Status") == "exited":
            break
        time.sleep(0.01)
    print(cid if verb == "run" else find(cid)["Name"][1:])
    return 0


def spawn_monitor(cid: str) -> None:
    if os.fork():
        os.wait()
        return
    os.setsid()
    if os.fork():
        os._exit(0)
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        # nothing else of the caller's: an inherited lock fd (`docker start` holds the state
        # lock) would keep every later docker command waiting for as long as the container runs
        os.closerange(3, 65536)
        monitor(cid)
    finally:
        os._exit(0)


def monitor(cid: str) -> None:
    import selectors
    import subprocess

    d = cdir(cid)
    config = read_json(d + "/config.json")
    assert isinstance(config, dict)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    open(d + "/log", "a").close()  # before the process starts: an attached client follows it
    # `docker run -i` in the foreground: its stdin arrives through this FIFO (run_attached)
    stdin = os.open(d + "/stdin", os.O_RDONLY) if os.path.exists(d + "/stdin") else None
    proc = subprocess.Popen(
        ["unshare", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
         "--propagation", "private", sys.executable, SHIM, "__container_init", cid],
        stdin=subprocess.DEVNULL if stdin is None else stdin, stdout=out_w, stderr=err_w,
        env={"PATH": DEFAULT_PATH, "LIBMOUNT_UTAB": d + "/utab"})
    os.close(out_w)
    os.close(err_w)
    if stdin is not None:
        os.close(stdin)
    pid = 0
    while not pid and proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
                pid = int((f.read().split() or ["0"])[0])
        except OSError:
            break
        time.sleep(0.002)
    set_state(cid, Status="running", Running=True, Pid=pid, MonitorPid=os.getpid(),
              ExitCode=0, StartedAt=now_iso(), FinishedAt="0001-01-01T00:00:00Z")
    sel = selectors.DefaultSelector()
    sel.register(out_r, selectors.EVENT_READ, "stdout")
    sel.register(err_r, selectors.EVENT_READ, "stderr")
    pending = {"stdout": b"", "stderr": b""}
    with open(d + "/log", "a") as log:
        while sel.get_map():
            events = sel.select(timeout=1.0)
            if not events and proc.poll() is not None:
                break
            for key, _ in events:
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    chunk = b"\n" if pending[key.data] else b""
                lines = (pending[key.data] + chunk).split(b"\n")
                pending[key.data] = lines.pop()
                for line in lines:
                    log.write(json.dumps({"log": line.decode(errors="replace") + "\n",
                                          "stream": key.data, "time": now_iso()}) + "\n")
                log.flush()
    rc = proc.wait()
    code = rc if rc >= 0 else 128 - rc
    if os.path.exists(d + "/killed"):
        with open(d + "/killed") as f:
            code = 128 + int(f.read() or 9)
        os.unlink(d + "/killed")
    set_state(cid, Status="exited", Running=False, ExitCode=code, FinishedAt=now_iso())
    reap(cid)


def reap(cid: str, wait_for_client: float = ATTACHED_CLIENT_WAIT) -> None:
    """An exited container with AutoRemove goes, as dockerd removes it: an attached client
    first collects its output and exit code (it marks COLLECTED); a client that is gone (killed
    under load) is waited for WAIT_FOR_CLIENT seconds, then the container goes all the same."""
    d = cdir(cid)
    config = read_json(d + "/config.json") or {}
    if not isinstance(config, dict) or not config["HostConfig"].get("AutoRemove"):
        return
    if (config.get("sparklab") or {}).get("attached"):
        deadline = time.monotonic() + wait_for_client
        # (a client that collected may have removed the container already: then nothing is
        # left to wait for, and this monitor, which shows the client's command line, goes too)
        while (time.monotonic() < deadline and os.path.isdir(d)
               and not os.path.exists(d + "/" + COLLECTED)):
            time.sleep(0.05)
    remove_dir(cid)
