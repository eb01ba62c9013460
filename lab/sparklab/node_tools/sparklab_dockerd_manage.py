"""Commands that act on containers and images: exec, cp, stop/kill, start, rm, pull, images
(save and load: sparklab_dockerd_image)."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

from sparklab_dockerd_query import cmd_inspect, render, running
from sparklab_dockerd_run import env_entries, split_flags, start_locked
from sparklab_dockerd_state import (
    DEFAULT_PATH,
    IMAGES,
    DockerError,
    alive,
    all_containers,
    cdir,
    find,
    image_record,
    normalize_image,
    pull,
    remove_dir,
    set_state,
)


def cmd_exec(args: list[str]) -> int:
    opts, rest = split_flags(args, {"-e", "--env", "-w", "--workdir", "-u", "--user",
                                    "--env-file"},
                             {"-d", "--detach", "-i", "--interactive", "-t", "--tty", "-it",
                              "-ti", "--privileged", "-dit", "-di"}, "exec")
    if len(rest) < 2:
        raise DockerError('"docker exec" requires at least 2 arguments.\n'
                          "See 'docker exec --help'.", 1)
    c = find(rest[0])
    pid = running(c, rest[0])
    flags = {f for f, _ in opts}
    env = dict(e.partition("=")[::2] for e in c["Config"]["Env"])
    env.setdefault("HOME", "/root")
    env.setdefault("HOSTNAME", os.uname().nodename)
    env.update(dict(e.partition("=")[::2] for e in env_entries(opts)))
    workdir = next((v for f, v in reversed(opts) if f in ("-w", "--workdir")), None)
    workdir = workdir or c["sparklab"]["workdir"]
    argv = ["nsenter", "-t", str(pid), "-m", "-p", f"--wd={workdir}", "--", *rest[1:]]
    if not flags & {"-i", "--interactive", "-it", "-ti", "-dit", "-di"}:
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
    if flags & {"-d", "--detach", "-dit", "-di"}:
        if os.fork():
            return 0
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
    import shutil

    resolved = next((f"{p}/{rest[1]}" for p in env.get("PATH", DEFAULT_PATH).split(":")
                     if os.path.isfile(f"/proc/{pid}/root{p}/{rest[1]}")), None)
    if "/" not in rest[1] and resolved is None:
        raise DockerError(f"OCI runtime exec failed: exec failed: unable to start container "
                          f'process: exec: "{rest[1]}": executable file not found in $PATH: '
                          "unknown", 126)
    os.execve(shutil.which("nsenter") or "/usr/bin/nsenter", argv, env)
    return 0


def cmd_cp(args: list[str]) -> int:
    import io
    import subprocess
    import tarfile

    _, rest = split_flags(args, set(), {"-a", "--archive", "-L", "--follow-link", "-q"}, "cp")
    if len(rest) != 2:
        raise DockerError('"docker cp" requires exactly 2 arguments.', 1)
    src, dst = rest
    into = ":" in dst.split("/")[0]
    ref, _, cpath = (dst if into else src).partition(":")
    if (":" in src.split("/")[0]) == into:
        raise DockerError("sparklab: docker cp copies between a container and the node: "
                          "exactly one of SRC/DST must be NAME:PATH", 1)
    c = find(ref)
    pid = running(c, ref)
    enter = ["nsenter", "-t", str(pid), "-m", "--"]
    if into:
        if not os.path.exists(src):
            raise DockerError(f'lstat {src}: no such file or directory', 1)
        isdir = subprocess.run([*enter, "test", "-d", cpath]).returncode == 0
        parent, name = (cpath, os.path.basename(src.rstrip("/"))) if isdir else \
            os.path.split(cpath.rstrip("/"))
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w") as tar:
            tar.add(src, arcname=name)
        res = subprocess.run([*enter, "tar", "-x", "-C", parent or "/", "-f", "-"],
                             input=data.getvalue(), capture_output=True)
        if res.returncode:
            raise DockerError(f"Error response from daemon: Could not find the file {parent} "
                              f"in container {ref}", 1)
        return 0
    parent, name = os.path.split(cpath.rstrip("/"))
    res = subprocess.run([*enter, "tar", "-c", "-C", parent or "/", "-f", "-", name],
                         capture_output=True)
    if res.returncode:
        raise DockerError(f"Error response from daemon: Could not find the file {cpath} in "
                          f"container {ref}", 1)
    target_parent, target = (dst, name) if os.path.isdir(dst) else os.path.split(dst)
    with tarfile.open(fileobj=io.BytesIO(res.stdout)) as tar:
        for member in tar.getmembers():
            member.name = target + member.name[len(name):]
        tar.extractall(target_parent or ".")  # our own archive of one path
    return 0


def stop_one(c: dict, timeout: float) -> None:
    if not c["State"].get("Running"):
        return
    set_state(c["Id"], ManuallyStopped=True)  # restart policies leave it stopped (boot.py)
    pid, monitor_pid = c["State"]["Pid"], c["State"].get("MonitorPid")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid):
        # unshare only reports "failed" when PID 1 dies of a signal: leave a note for monitor().
        with open(cdir(c["Id"]) + "/killed", "w") as f:
            f.write(str(int(signal.SIGKILL)))
        with contextlib.suppress(ProcessLookupError):  # it may end on its own meanwhile
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(monitor_pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def each_container(args: list[str], verb: str, act) -> int:
    """stop, kill and restart: -t/--time, then every container named; errors per container."""
    opts, rest = split_flags(args, {"-t", "--time", "--timeout", "-s", "--signal"}, set(), verb)
    timeout = float(next((v for f, v in reversed(opts) if f in ("-t", "--time", "--timeout")),
                         10) or 10)
    code = 0
    for ref in rest:
        try:
            act(ref, find(ref), timeout)
        except DockerError as exc:
            print(exc, file=sys.stderr)
            code = 1
    return code


def cmd_stop(args: list[str], kill: bool = False) -> int:
    def act(ref: str, c: dict, timeout: float) -> None:
        if kill and not c["State"].get("Running"):
            raise DockerError(f"Error response from daemon: cannot kill container: {ref}: "
                              f"container {c['Id']} is not running", 1)
        stop_one(c, 0 if kill else timeout)
        print(ref)
    return each_container(args, "kill" if kill else "stop", act)


def cmd_start(args: list[str]) -> int:
    _, rest = split_flags(args, set(), {"-a", "--attach", "-i"}, "start")
    for ref in rest:
        c = find(ref)
        if c["State"].get("Running"):
            print(ref)
            continue
        start_locked(c["Id"])
    return 0


def cmd_restart(args: list[str]) -> int:
    """`docker restart`: stop (SIGTERM, then SIGKILL after -t seconds) and start again; the
    container keeps its filesystem, its processes start afresh from its command."""
    def act(ref: str, c: dict, timeout: float) -> None:
        stop_one(c, timeout)
        start_locked(c["Id"])  # (prints the name, as docker does)
    return each_container(args, "restart", act)


def cmd_rm(args: list[str]) -> int:
    opts, rest = split_flags(args, set(), {"-f", "--force", "-v", "--volumes", "-fv", "-vf"},
                             "rm")
    force = bool({f for f, _ in opts} & {"-f", "--force", "-fv", "-vf"})
    code = 0
    for ref in rest:
        try:
            c = find(ref)
        except DockerError as exc:
            print(exc, file=sys.stderr)
            code = 1
            continue
        if c["State"].get("Running"):
            if not force:
                print(f'Error response from daemon: cannot remove container "{c["Name"]}": '
                      "container is running: stop the container before removing or force "
                      "remove", file=sys.stderr)
                code = 1
                continue
            stop_one(c, 0)
        remove_dir(c["Id"])
        print(ref)
    return code


def cmd_image(args: list[str]) -> int:
    sub, rest = (args[0], args[1:]) if args else ("ls", [])
    if sub == "inspect":
        return cmd_inspect(rest, "image")
    if sub == "pull":
        return cmd_pull(rest)
    if sub in ("ls", "list"):
        return cmd_images(rest)
    if sub in ("save", "load"):
        import sparklab_dockerd_image

        return int(getattr(sparklab_dockerd_image, "cmd_" + sub)(rest))
    raise DockerError(f"docker: 'image {sub}' is not a docker command (sparklab).", 1)


def cmd_pull(args: list[str]) -> int:
    _, rest = split_flags(args, {"--platform"}, {"-q", "--quiet", "-a"}, "pull")
    if len(rest) != 1:
        raise DockerError('"docker pull" requires exactly 1 argument.', 1)
    rec = pull(rest[0], sys.stdout)
    print(rec["RepoTags"][0])
    return 0


def cmd_images(args: list[str]) -> int:
    opts, _ = split_flags(args, {"--format", "--filter", "-f"}, {"-q", "-a", "--digests"},
                          "images")
    fmt = next((v for f, v in reversed(opts) if f == "--format"), None)
    try:
        names = sorted(os.listdir(IMAGES))
    except OSError:
        names = []
    recs = [r for r in (image_record(n[:-5].replace("+", "/")) for n in names
                        if n.endswith(".json")) if r]
    rows = [{"Repository": r["RepoTags"][0].rsplit(":", 1)[0],
             "Tag": r["RepoTags"][0].rsplit(":", 1)[1], "ID": r["Id"][7:19],
             "Digest": r["RepoDigests"][0].split("@")[1] if r["RepoDigests"] else "<none>",
             "CreatedSince": "2 weeks ago",
             "Size": "27GB"} for r in recs]
    if fmt:
        for row in rows:
            print(render(fmt, row))
        return 0
    print(f"{'REPOSITORY':<45}{'TAG':<13}{'IMAGE ID':<15}{'CREATED':<14}SIZE")
    for row in rows:
        print(f"{row['Repository']:<45}{row['Tag']:<13}{row['ID']:<15}"
              f"{row['CreatedSince']:<14}{row['Size']}")
    return 0


def cmd_version(args: list[str]) -> int:
    info = {"Client": {"Version": "27.3.1-sparklab", "ApiVersion": "1.47"},
            "Server": {"Version": "27.3.1-sparklab", "ApiVersion": "1.47",
                       "Os": "linux", "Arch": "arm64", "Components": [
                           {"Name": "sparklab simulated engine", "Version": "1"}]}}
    if "--format" in args or "-f" in args:
        print(render(args[-1], info))
    else:
        print("Client: sparklab simulated docker\n Version:    27.3.1-sparklab\n"
              "Server: sparklab dockerd-shim (no real containers)\n Version:    27.3.1-sparklab")
    return 0


def cmd_info(args: list[str]) -> int:
    opts, _ = split_flags(args, {"--format", "-f"}, set(), "info")
    fmt = next((v for f, v in reversed(opts) if f in ("--format", "-f")), None)
    running_n = sum(1 for c in all_containers() if c["State"].get("Running"))
    if fmt is not None:  # {{.Field}} of docker's info; the lab's daemon has no proxy
        info = {"ServerVersion": "27.3.1-sparklab", "Name": os.uname().nodename,
                "Containers": len(all_containers()), "ContainersRunning": running_n,
                "HTTPProxy": "", "HTTPSProxy": "", "NoProxy": "", "RegistryConfig": {"Mirrors": []}}
        print(render(fmt, info))
        return 0
    print(f"Containers: {len(all_containers())}\n Running: {running_n}\n"
          f"Server Version: 27.3.1-sparklab\nRuntimes: sparklab nvidia\n"
          f"Default Runtime: sparklab\nName: {os.uname().nodename}\n"
          "Labels: sparklab simulation")
    return 0


def cmd_kill(args: list[str]) -> int:
    return cmd_stop(args, kill=True)


def cmd_rmi(args: list[str]) -> int:
    """`docker rmi [-f] IMAGE...`: untags and deletes the image record, refusing (without -f) an
    image a container was created from, and always one a running container uses, as dockerd does;
    an image the node does not have is "No such image" (exit 1)."""
    opts, refs = split_flags(args, set(), {"-f", "--force", "--no-prune"}, "rmi")
    if not refs:
        raise DockerError('"docker rmi" requires at least 1 argument.', 1)
    force = any(f in ("-f", "--force") for f, _ in opts)
    code = 0
    for ref in refs:
        name = normalize_image(ref)
        rec = image_record(name)
        if rec is None:
            print(f"Error response from daemon: No such image: {ref}", file=sys.stderr)
            code = 1
            continue
        users = [c for c in all_containers() if c.get("Image") == rec["Id"]]
        running_users = [c for c in users if c["State"].get("Running")]
        blocking = running_users if force else users
        if blocking:
            state = "running container" if blocking[0]["State"].get("Running") else "container"
            print(f'Error response from daemon: conflict: unable to remove repository reference '
                  f'"{ref}" (must force) - {state} {blocking[0]["Id"][:12]} is using its referenced '
                  f'image {rec["Id"][7:19]}', file=sys.stderr)
            code = 1
            continue
        os.remove(f"{IMAGES}/{name.replace('/', '+')}.json")
        print(f"Untagged: {name}")
        for digest in rec["RepoDigests"]:
            print(f"Untagged: {digest}")
        print(f"Deleted: {rec['Id']}")
    return code
