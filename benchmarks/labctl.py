"""Driving the simulated lab and the sparkctl CLI from the benchmarks (subprocesses only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks import tracing

BIN = Path(sys.executable).parent
SPARKCTL = str(BIN / "sparkctl")
STATE_ROOT = Path("/var/lib/sparklab")


class BenchError(Exception):
    """A benchmark could not run (lab failed, sparkctl failed): reported, never a traceback."""


@dataclass
class Timed:
    """One sparkctl invocation: wall time as the user waits for it, its report and trace."""

    seconds: float
    code: int
    report: dict[str, Any]
    trace: tracing.TraceSummary
    stderr: str

    @property
    def ok(self) -> bool:
        return self.code == 0

    def failure(self) -> str:
        failed = [f"{node}: {step.get('phase')}/{step.get('step')}: {step.get('message', '')}"
                  for node, host in self.report.get("hosts", {}).items()
                  for step in host.get("steps", []) if step.get("status") == "failed"]
        detail = "; ".join(failed) or self.stderr.strip()[-400:]
        return f"exit {self.code}: {detail[:600]}"


@dataclass
class Lab:
    """A lab with one id (`SPARKLAB_ID`); the benchmarks bring it up and always take it down."""

    lab_id: int
    nodes: int = 2
    topology: str = "b2b"
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sparkctl-bench-")))

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKCTL_")}
        env["SPARKLAB_ID"] = str(self.lab_id)
        root = Path(__file__).resolve().parent.parent  # measure this checkout, not the venv's
        env["PYTHONPATH"] = f"{root}:{root / 'lab'}"
        # keep the user's remembered inventory and run logs out of the way
        env["SPARKCTL_STATE_DIR"] = str(self.workdir / "state")
        return env

    @property
    def state_dir(self) -> Path:
        return STATE_ROOT / str(self.lab_id)

    @property
    def inventory(self) -> Path:
        return self.state_dir / "inventory.yml"

    def inventory_data(self) -> dict[str, Any]:
        return dict(yaml.safe_load(self.inventory.read_text()))

    def is_up(self) -> bool:
        return self.state_dir.exists()

    def lab_cli(self, *args: str, check: bool = True, stdin: str | None = None
                ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([SPARKCTL, "lab", *args], env=self.env, capture_output=True,
                              text=True, input=stdin, check=False)
        if check and proc.returncode != 0:
            raise BenchError(f"`sparkctl lab {' '.join(args)}` (lab {self.lab_id}) exited "
                             f"{proc.returncode}: {proc.stderr.strip()[-500:]}")
        return proc

    def up(self, engine_load_seconds: float, model_bytes: int, extra: tuple[str, ...] = ()) -> None:
        """`lab up` with the simulated engines' load time and model size; `extra`: more `lab
        up` options (the real vLLM's memory: --node-memory, --memory-scale)."""
        if self.is_up():
            raise BenchError(
                f"lab {self.lab_id} is already up ({self.state_dir}); it may be someone else's: "
                f"take it down with `SPARKLAB_ID={self.lab_id} sparkctl lab down` or pick another "
                "id with --lab-id")
        args = ["up", "--nodes", str(self.nodes), "--topology", self.topology,
                "--engine-load-seconds", str(engine_load_seconds), "--model-bytes", str(model_bytes),
                *extra]
        self.lab_cli(*args)

    def down(self) -> None:
        self.lab_cli("down", check=False)

    def node_names(self) -> list[str]:
        return [n["name"] for n in self.inventory_data()["nodes"]]

    def exec(self, node: str, command: str, check: bool = True, stdin: str | None = None) -> str:
        proc = self.lab_cli("exec", node, "--", "sh", "-c", command, check=check, stdin=stdin)
        return proc.stdout

    def delay(self, node: str, interface: str, ms: float) -> None:
        self.lab_cli("fault", "delay", "--node", node, "--interface", interface, "--ms", str(ms))

    def restore_faults(self) -> None:
        self.lab_cli("fault", "restore", check=False)

    def sparkctl(self, *args: str, capture: Path | None = None, json_out: bool = True,
                 env: dict[str, str] | None = None) -> Timed:
        """Run `sparkctl ARGS --inventory <lab> [--json]` and time it as a user would."""
        trace = self.workdir / f"trace-{time.monotonic_ns()}.jsonl"
        env = {**self.env, **(env or {}), "SPARKCTL_TRACE": str(trace)}
        argv = [*args, "--inventory", str(self.inventory)] + (["--json"] if json_out else [])
        if capture is not None:
            command = [str(BIN / "python"), "-m", "benchmarks.capture", str(capture), "--", *argv]
        else:
            command = [SPARKCTL, *argv]
        started = time.perf_counter()
        proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False,
                              stdin=subprocess.DEVNULL, cwd=Path(__file__).resolve().parent.parent)
        seconds = time.perf_counter() - started
        try:
            report = json.loads(proc.stdout) if json_out and proc.stdout.strip() else {}
        except json.JSONDecodeError:
            report = {}
        records = tracing.load(trace)
        trace.unlink(missing_ok=True)
        return Timed(seconds, proc.returncode, report, tracing.summarize(records), proc.stderr)
