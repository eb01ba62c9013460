"""sparklab simulation: the unit handling of `systemctl` in a lab node (there is no systemd).

Enough of systemd's behaviour for what sparkctl installs (its boot units, earlyoom): unit files
are found where systemd looks (/etc, /run, /lib, /usr/lib `systemd/system`); `enable` makes the
[Install] WantedBy= symlinks under /etc/systemd/system/<target>.wants/ (they live on the node's
disk, so they outlast `lab reboot`), `disable` removes them; `start` runs ExecStart= (with
Environment=/EnvironmentFile= and $VAR/${VAR} expansion) detached in its own session, its PID
under /run (gone with a reboot, like systemd's runtime state), its output appended to
/var/log/sparklab-journal/<unit>.log (the lab's journal); `stop` signals its process group.
At boot (`lab reboot`, node_supervisor.py) every unit a target wants is started, after docker.
Simplified: every start is detached, as for Type=exec/simple units (sparkctl's boot units are
Type=exec; a Type=oneshot unit's `systemctl start` would wait under real systemd).
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time

UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/lib/systemd/system",
             "/usr/lib/systemd/system")
ETC = "/etc/systemd/system"
RUNTIME = "/run/sparklab/units"
JOURNAL = "/var/log/sparklab-journal"


PACKAGED = {"earlyoom.service"}
"""Packaged units the lab runs (its node image carries earlyoom); any other unit of the host's
systemd (e.g. systemd-udev-trigger, which `netplan apply` touches) stays a no-op, as before."""


def handled(name: str) -> bool:
    """Units this shim runs: the administrator's (/etc/systemd/system, e.g. sparkctl's) and
    PACKAGED."""
    return os.path.isfile(os.path.join(ETC, name)) or (name in PACKAGED and find_unit(name) is not None)


def find_unit(name: str) -> str | None:
    for d in UNIT_DIRS:
        path = os.path.join(d, name)
        if os.path.isfile(path):
            return path
    return None


def parse_unit(path: str) -> dict[str, list[tuple[str, str]]]:
    sections: dict[str, list[tuple[str, str]]] = {}
    current = sections.setdefault("", [])
    with open(path) as f:
        for raw in f:
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("[") and line.endswith("]"):
                current = sections.setdefault(line[1:-1], [])
            elif "=" in line:
                key, _, value = line.partition("=")
                current.append((key.strip(), value.strip()))
    return sections


def values(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def _wants_links(name: str) -> list[str]:
    links = []
    for entry in sorted(os.listdir(ETC)) if os.path.isdir(ETC) else []:
        link = os.path.join(ETC, entry, name)
        if entry.endswith((".wants", ".requires")) and os.path.lexists(link):
            links.append(link)
    return links


def enable(name: str) -> list[str]:
    path = find_unit(name)
    if path is None:
        raise SystemExit(f"Failed to enable unit: Unit file {name} does not exist.")
    out = []
    for target in " ".join(values(parse_unit(path), "Install", "WantedBy")).split():
        wants = os.path.join(ETC, target + ".wants")
        os.makedirs(wants, exist_ok=True)
        link = os.path.join(wants, name)
        if not os.path.lexists(link):
            os.symlink(path, link)
            out.append(f"Created symlink {link} \u2192 {path}.")
    return out


def disable(name: str) -> list[str]:
    out = []
    for link in _wants_links(name):
        os.unlink(link)
        out.append(f"Removed \"{link}\".")
    return out


def is_enabled(name: str) -> bool:
    return bool(_wants_links(name))


def environment(unit: dict[str, list[tuple[str, str]]]) -> dict[str, str]:
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "LANG": "C.UTF-8"}
    for line in values(unit, "Service", "Environment"):
        for word in shlex.split(line):
            key, _, value = word.partition("=")
            env[key] = value
    for spec in values(unit, "Service", "EnvironmentFile"):
        optional, path = spec.startswith("-"), spec.lstrip("-")
        try:
            with open(path) as f:
                for raw in f:
                    line = raw.strip()
                    if line and not line.startswith("#") and "=" in line:
                        key, _, value = line.partition("=")
                        env[key.strip()] = " ".join(shlex.split(value)) if value else ""
        except OSError:
            if not optional:
                raise SystemExit(f"Failed to load environment files: {path}") from None
    return env


def exec_argv(line: str, env: dict[str, str]) -> list[str]:
    """ExecStart= words: a leading -@+! prefix dropped; `$VAR` splits on blanks, `${VAR}` is
    one word (as systemd.service(5) says)."""
    line = re.sub(r"^[-@+!:]+", "", line)
    argv: list[str] = []
    for word in shlex.split(line):
        whole = re.fullmatch(r"\$(\w+)", word)
        if whole:
            argv += env.get(whole.group(1), "").split()
        else:
            argv.append(re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), word))
    return argv


def _pid(name: str) -> int | None:
    try:
        with open(os.path.join(RUNTIME, name + ".pid")) as f:
            pid = int(f.read().strip())
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return None
        return pid
    except (OSError, ValueError, IndexError):
        return None


def is_active(name: str) -> bool:
    return _pid(name) is not None


def start(name: str) -> None:
    path = find_unit(name)
    if path is None:
        raise SystemExit(f"Failed to start {name}: Unit {name} not found.")
    if is_active(name):
        return
    unit = parse_unit(path)
    env = environment(unit)
    lines = values(unit, "Service", "ExecStart")
    if not lines:
        raise SystemExit(f"{name}: no ExecStart= (sparklab's systemctl runs only services)")
    os.makedirs(RUNTIME, exist_ok=True)
    os.makedirs(JOURNAL, exist_ok=True)
    log = open(os.path.join(JOURNAL, name + ".log"), "ab")  # noqa: SIM115 - the child's
    log.write(f"-- {time.strftime('%Y-%m-%d %H:%M:%S')} sparklab systemctl: Starting {name} --\n"
              .encode())
    log.flush()
    proc = subprocess.Popen(exec_argv(lines[0], env), stdin=subprocess.DEVNULL, stdout=log,
                            stderr=log, env=env, start_new_session=True, cwd="/")
    log.close()
    with open(os.path.join(RUNTIME, name + ".pid"), "w") as f:
        f.write(f"{proc.pid}\n")


def stop(name: str, timeout: float = 10.0) -> None:
    pid = _pid(name)
    if pid is None:
        return
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while _pid(name) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    if _pid(name) is not None:
        os.killpg(pid, signal.SIGKILL)


def boot() -> list[str]:
    """Start every unit a target under /etc/systemd/system wants (what systemd does at boot)."""
    started = []
    for entry in sorted(os.listdir(ETC)) if os.path.isdir(ETC) else []:
        if not entry.endswith(".wants"):
            continue
        for name in sorted(os.listdir(os.path.join(ETC, entry))):
            if name.endswith(".service") and handled(name):
                try:
                    start(name)
                    started.append(f"started {name} (wanted by {entry[:-6]})")
                except (OSError, SystemExit) as exc:
                    started.append(f"failed to start {name}: {exc}")
    return started
