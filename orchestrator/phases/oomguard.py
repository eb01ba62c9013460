"""`up --oom-guard`: earlyoom on every node, as the last line behind sparkctl's memory guard.

earlyoom (the Debian/Ubuntu package) kills the process with the highest OOM score when both
available memory and free swap fall below its thresholds, before the kernel's OOM killer (which
on a Spark's unified memory often comes too late: the node thrashes and needs a hard reset).
sparkctl configures it so that its own memory guard acts first: the guard stops the server
below GUARD_DEFAULT_GB available, earlyoom sends SIGTERM only below half of that and SIGKILL
below a quarter (-M, in KiB of MemAvailable; -s 100,100: swap does not hold it back, a GPU
allocation cannot be swapped out), and never picks sshd, dockerd/containerd, systemd, itself or
the guard (--avoid, by process name; the guard names itself COMM). The configuration,
/etc/default/earlyoom, is written through the ledger (the package's own file is kept and put
back by `down`); a marker records that sparkctl installed the package, so `down` removes the
package only then.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.core.step import Change, NodeContext, Outcome, Phase, Step, Unchanged
from orchestrator.inventory import Inventory, Node
from orchestrator.paths import LEDGER, STATE_DIR
from orchestrator.phases.files import check_written, ledger_answer, undo_files_cmd, write_files_cmd
from orchestrator.phases.memory import GUARD_DEFAULT_GB
from orchestrator.remote.fact_records import FileInfo
from orchestrator.render import sha256, unified_diff

DEFAULTS = "/etc/default/earlyoom"
MARKER = f"{STATE_DIR}/earlyoom-installed-by-sparkctl"
ENABLED = f"{STATE_DIR}/earlyoom-enabled-by-sparkctl"
"""Markers (written through the ledger): what `down` may undo beyond the config file."""
GUARD_COMM = "sparkctl-guard"
AVOID = ("^(sshd|dockerd|containerd|containerd-shim|systemd|systemd-journal|systemd-logind|"
         f"systemd-udevd|systemd-network|systemd-resolve|earlyoom|{GUARD_COMM})$")
"""Process names earlyoom never kills. No blanks, quotes or glob characters: /etc/default/earlyoom
is read by systemd (EnvironmentFile=, $EARLYOOM_ARGS split at blanks, quotes kept literally)
and sourced by /bin/sh (the init script), and both must pass the same regex."""
INSTALL = "DEBIAN_FRONTEND=noninteractive apt-get install -y -q earlyoom"
STATE_CMD = ("if command -v earlyoom >/dev/null 2>&1; then echo present; else echo absent; fi; "
             "s=$(systemctl is-enabled earlyoom 2>/dev/null | head -1); echo \"${s:-disabled}\"; "
             "s=$(systemctl is-active earlyoom 2>/dev/null | head -1); echo \"${s:-inactive}\"")
"""Three lines: present|absent, enabled|disabled|..., active|inactive|..."""


def thresholds_kib(guard_gb: float = GUARD_DEFAULT_GB) -> tuple[int, int]:
    """SIGTERM and SIGKILL thresholds (KiB of MemAvailable): half and a quarter of the guard's."""
    kib = int(guard_gb * 1024 * 1024)
    return kib // 2, kib // 4


def earlyoom_args(guard_gb: float = GUARD_DEFAULT_GB) -> str:
    term, kill = thresholds_kib(guard_gb)
    return f"-M {term},{kill} -s 100,100 -r 3600 --avoid {AVOID}"


def defaults_text(guard_gb: float = GUARD_DEFAULT_GB) -> str:
    term, kill = thresholds_kib(guard_gb)
    return (
        "# Written by sparkctl (`sparkctl up --oom-guard`); `sparkctl down` puts back what was\n"
        "# here before. sparkctl's memory guard stops the model server when MemAvailable falls\n"
        f"# below {guard_gb:g} GB; earlyoom acts only after it: SIGTERM below {term} KiB "
        f"({term / 1024 / 1024:g} GiB)\n"
        f"# available, SIGKILL below {kill} KiB, whatever the swap; never sshd, dockerd, "
        "containerd,\n"
        f"# systemd, earlyoom itself or the memory guard ({GUARD_COMM}).\n"
        f"EARLYOOM_ARGS=\"{earlyoom_args(guard_gb)}\"\n"
    )


def state(ctx: NodeContext) -> list[str]:
    lines = [line.strip() for line in ctx.facts.output("earlyoom").splitlines() if line.strip()]
    return [*lines, "absent", "disabled", "inactive"][:3] if lines else [
        "absent", "disabled", "inactive"]


def installed_by_us(ctx: NodeContext, marker: str = MARKER) -> bool:
    return ctx.facts.exists(marker)


def write_marker(ctx: NodeContext, path: str, text: str, step: str) -> None:
    payload = [{"path": path, "mode": "644", "content": text}]
    check_written(ctx.run(write_files_cmd(), stdin=json.dumps(payload), sudo=True),
                  ctx.node.name, step)


def facts(inventory: Inventory, node: Node) -> dict[str, Any]:
    return {"files": {DEFAULTS: True, MARKER: False, ENABLED: False, LEDGER: True},
            "commands": {"earlyoom": STATE_CMD}}


class Install(Step):
    name = "earlyoom-package"

    def check(self, ctx: NodeContext) -> Outcome:
        if state(ctx)[0] == "present":
            return Unchanged("earlyoom installed" + (" (by sparkctl)" if installed_by_us(ctx) else
                                                     " (not by sparkctl: down keeps it)"))
        return Change("install earlyoom", commands=(INSTALL,))

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        result = ctx.run(change.commands[0], sudo=True, timeout=900)
        if not result.ok:
            from orchestrator.errors import SparkctlError

            raise SparkctlError(f"{ctx.node.name}: oom-guard: `{INSTALL}` exited "
                                f"{result.exit_status}: {result.stderr.strip()[-400:]}\nHint: "
                                "the node needs its package mirror (`apt-get update` first?)")
        write_marker(ctx, MARKER, "earlyoom was installed by `sparkctl up --oom-guard`\n", self.name)
        return None


class Configure(Step):
    name = "earlyoom-config"

    def check(self, ctx: NodeContext) -> Outcome:
        fact = ctx.facts.file(DEFAULTS) or FileInfo(exists=False)
        want = defaults_text()
        if fact.exists and fact.sha256 == sha256(want):
            return Unchanged(f"{DEFAULTS} as sparkctl wrote it")
        return Change(f"write {DEFAULTS} (earlyoom below the memory guard)",
                      diff=unified_diff(DEFAULTS, fact.content, want),
                      commands=("systemctl try-restart earlyoom",))

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        # the package's own file (a conffile) is kept by the ledger and put back by down; the
        # file goes on stdin, then the listed restart
        payload = [{"path": DEFAULTS, "mode": "644", "content": defaults_text(), "original": True}]
        check_written(ctx.run(write_files_cmd(), stdin=json.dumps(payload), sudo=True),
                      ctx.node.name, self.name)
        return super().apply(ctx, change)


class Enable(Step):
    name = "earlyoom-service"

    def check(self, ctx: NodeContext) -> Outcome:
        _, enabled, active = state(ctx)
        if enabled == "enabled" and active == "active":
            return Unchanged("earlyoom enabled and running")
        return Change("enable and start earlyoom", commands=("systemctl enable --now earlyoom",))

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        if state(ctx)[1] != "enabled":  # (down disables only what sparkctl enabled)
            write_marker(ctx, ENABLED, "earlyoom was enabled by `sparkctl up --oom-guard`\n",
                         self.name)
        return super().apply(ctx, change)


def phase(inventory: Inventory) -> Phase:
    return Phase("oom-guard", [Install(), Configure(), Enable()], facts)


class Remove(Step):
    """`down`: earlyoom's config put back; the package removed only if sparkctl installed it."""

    name = "oom-guard"

    def check(self, ctx: NodeContext) -> Outcome:
        from orchestrator.phases.files import ownership

        ours = ownership(ctx, DEFAULTS) in ("ours", "changed")
        installed, enabled = installed_by_us(ctx), installed_by_us(ctx, ENABLED)
        if not (ours or installed or enabled):
            return Unchanged("no earlyoom set-up of sparkctl's")
        what = [f"put back {DEFAULTS} as it was before sparkctl"] if ours else []
        if installed:
            what.append("stop, disable and remove the earlyoom package (sparkctl installed it)")
        elif enabled:
            what.append("stop and disable earlyoom (sparkctl enabled it; the package was there "
                        "before: kept)")
        else:
            what.append("restart earlyoom with that config (enabled before sparkctl: kept)")
        return Change("; ".join(what), commands=(remove_cmd(installed, enabled),))

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        result = ctx.run(change.commands[0], sudo=True, timeout=600,
                         display="remove sparkctl's earlyoom setup")
        answer = ledger_answer(result, ctx.node.name, self.name)
        left = [str(e.get("reason")) for e in answer.get("left") or []]
        return ("left alone: " + "; ".join(left)) if left else None


def remove_cmd(installed: bool, enabled: bool) -> str:
    """earlyoom's config put back through the ledger, and the package removed (sparkctl
    installed it), or disabled (sparkctl enabled it), or restarted with that config."""
    undo = undo_files_cmd([DEFAULTS, MARKER, ENABLED])
    if installed:
        return ("systemctl disable --now earlyoom >&2; "
                "DEBIAN_FRONTEND=noninteractive apt-get remove -y -q earlyoom >&2; " + undo)
    if enabled:
        return "systemctl disable --now earlyoom >&2; " + undo
    return undo + "; systemctl try-restart earlyoom >&2 || true"


def down_facts(inventory: Inventory) -> dict[str, Any]:
    return {"files": {DEFAULTS: False, MARKER: False, ENABLED: False, LEDGER: True}}
