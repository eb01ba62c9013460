"""What the lab runtime does when its node (re)starts, as dockerd does when it starts.

`reset` runs first (before sshd): every container recorded as running died with the node's
processes, so it is recorded as exited (255, as docker shows a container the daemon lost), and
its recorded PIDs, meaningless in the node's new PID namespace, are cleared. `restart` then
starts the containers whose restart policy says so: `always`; `unless-stopped` unless it was
stopped by hand (`docker stop`/`kill`); `on-failure` when it had failed. Each line of what
happened goes to stdout (the node's boot log).
"""
from __future__ import annotations

import contextlib
import io

from sparklab_dockerd_state import all_containers, cdir, now_iso, read_json, set_state


def reset() -> list[str]:
    done = []
    for c in all_containers():
        state = read_json(cdir(c["Id"]) + "/state.json", {}) or {}  # as recorded, not judged
        if state.get("Running"):
            set_state(c["Id"], Status="exited", Running=False, ExitCode=255, Pid=0,
                      MonitorPid=0, FinishedAt=now_iso())
            done.append(f"{c['Name'][1:]}: was running when the node went down; exited (255)")
        elif state.get("Pid") or state.get("MonitorPid"):
            set_state(c["Id"], Pid=0, MonitorPid=0)
    return done


def should_restart(c: dict) -> bool:
    policy = ((c.get("HostConfig") or {}).get("RestartPolicy") or {}).get("Name") or "no"
    policy = policy.split(":", 1)[0]
    state = c["State"]
    if state.get("Running"):
        return False
    manual = bool(state.get("ManuallyStopped"))
    return (policy == "always" or (policy == "unless-stopped" and not manual)
            or (policy == "on-failure" and not manual and state.get("ExitCode", 0) != 0))


def restart() -> list[str]:
    from sparklab_dockerd_run import start_locked

    done = []
    for c in reversed(all_containers()):  # oldest first, like creation order
        if not should_restart(c):
            continue
        policy = c["HostConfig"]["RestartPolicy"]["Name"]
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # it prints the name, as docker does
                start_locked(c["Id"])
            done.append(f"{c['Name'][1:]}: restarted (restart policy {policy})")
        except Exception as exc:  # one container's failure must not keep the others down
            done.append(f"{c['Name'][1:]}: restart failed: {exc}")
    return done


def main(args: list[str]) -> int:
    lines = reset() if args[:1] == ["reset"] else restart()
    for line in lines:
        print(f"docker: {line}", flush=True)
    return 0
