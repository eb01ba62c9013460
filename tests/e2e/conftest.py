"""The simulated lab for end-to-end tests (root, Linux).

`lab`: a 2-node b2b lab (SPARKLAB_ID from the environment, default 0), brought up once per
session and torn down at the end; if a test module took it down, the next use brings it back.

Under pytest-xdist (`make test` runs the e2e tests in four workers, whole modules each) every
worker gets its own set of lab ids, so two workers never share a lab: with W workers, worker N
uses the main lab N, the sudo/topology lab N+W, the alternate lab N+2W, the jump-host lab N+3W and
the trust lab N+4W (plus SPARKLAB_E2E_BASE). The longest modules are handed out first
(`LONGEST_FIRST`; scripts/run-e2e keeps xdist from reordering them), so the run does not end
waiting on one worker.
"""

from __future__ import annotations

import os
import platform
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def _worker_lab_ids() -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    n, workers = int(worker[2:]), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    # SPARKLAB_E2E_BASE runs another full e2e run beside the first (0-19 for make test's four
    # workers; 20 beside it)
    main, sudo, alt, jump, trust = (int(os.environ.get("SPARKLAB_E2E_BASE", "0")) + n + workers * k
                                    for k in range(5))
    if trust > 39:
        raise RuntimeError(f"the e2e tests need lab ids up to {trust}; the lab has 0-39: fewer "
                           "workers or a lower SPARKLAB_E2E_BASE")
    os.environ.update(SPARKLAB_ID=str(main), SPARKLAB_ALT_ID=str(alt), SPARKLAB_SUDO_ID=str(sudo),
                      SPARKLAB_TOPOLOGY_ID=str(sudo), SPARKLAB_TRUST_ID=str(trust),
                      SPARKLAB_JUMP_ID=str(jump))


_worker_lab_ids()
LAB_ID = int(os.environ.get("SPARKLAB_ID", "0"))
# sparkctl keeps each run's SSH connections for the next runs (remote/keeper.py), a keeper per
# state directory; the tests' keepers end 20 s after their last use instead of 60 (a module's
# runs follow each other within seconds) and are stopped at the session's end
os.environ.setdefault("SPARKCTL_SSH_PERSIST", "20")


def e2e_state(name: str) -> str:
    """A controller state directory for one module, apart per lab (two runs may share a host)."""
    return f"/tmp/sparkctl-e2e-{name}-state-lab{LAB_ID}"


def lab_cli(*args: str, lab_id: int = LAB_ID, check: bool = False,
            timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """`sparkctl lab ARGS` for a given lab id (runs the module, so it works before the lead
    mounts the group under sparkctl)."""
    env = {**os.environ, "SPARKLAB_ID": str(lab_id)}
    result = subprocess.run([sys.executable, "-m", "sparklab.cli", *args], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"lab {' '.join(args)} failed ({result.returncode}):\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


@dataclass
class Lab:
    lab_id: int
    state_dir: Path
    inventory: Path
    nodes: list[str]
    hosts: dict[str, str]
    key: Path
    known_hosts: Path
    data: dict[str, object] = field(default_factory=dict)

    @classmethod
    def load(cls, lab_id: int) -> Lab:
        state_dir = Path(f"/var/lib/sparklab/{lab_id}")
        inventory = state_dir / "inventory.yml"
        data = yaml.safe_load(inventory.read_text())
        return cls(lab_id, state_dir, inventory, [n["name"] for n in data["nodes"]],
                   {n["name"]: n["host"] for n in data["nodes"]},
                   Path(data["cluster"]["ssh_key"]), Path(data["cluster"]["known_hosts"]), data)

    def exec(self, node: str, command: str | Sequence[str], *, check: bool = True,
             user: str | None = None, input_text: str | None = None
             ) -> subprocess.CompletedProcess[str]:
        """Run a command inside a node (a string goes to sh -c)."""
        from sparklab.node import node_exec

        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        return node_exec(self.lab_id, node, argv, check=check, user=user, input_text=input_text)

    def ssh_argv(self, node: str, user: str = "nvidia") -> list[str]:
        return ["ssh", "-i", str(self.key), "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
                "-o", "ConnectTimeout=10", f"{user}@{self.hosts[node]}"]

    def ssh(self, node: str, command: str, *, user: str = "nvidia", check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([*self.ssh_argv(node, user), command], capture_output=True,
                                text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"ssh {node} {command!r} exited {result.returncode}:\n"
                                 f"{result.stdout}\n{result.stderr}")
        return result

    def cli(self, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        return lab_cli(*args, lab_id=self.lab_id, check=check)

    def set_engine_load_seconds(self, seconds: float) -> float:
        """How long the simulated engines take to load from their next start on (every node's
        `lab.json`); returns the value it replaces, to put back."""
        script = ("import json, sys; p = '/var/lib/sparklab/config/lab.json'; c = json.load(open(p)); "
                  "print(c.get('engine_load_seconds', 2.0)); c['engine_load_seconds'] = float(sys.argv[1]); "
                  "json.dump(c, open(p, 'w'))")
        before = [self.exec(node, ["python3", "-c", script, str(seconds)]).stdout for node in self.nodes]
        return float(before[0])

    def healthy(self) -> bool:
        from sparklab.identity import LabIdentity
        from sparklab.node import recorded_pid

        ident = LabIdentity(self.lab_id)
        return self.inventory.exists() and all(
            recorded_pid(ident.node_dir(n) / "pid") is not None for n in self.nodes)


def require_lab_host() -> None:
    if platform.system() != "Linux" or os.geteuid() != 0:
        pytest.skip("the simulated lab needs root on Linux (network namespaces)")


@pytest.fixture(scope="session")
def lab_session() -> Iterator[list[Lab]]:
    require_lab_host()
    holder: list[Lab] = []
    lab_cli("up", "--force", check=True)
    holder.append(Lab.load(LAB_ID))
    yield holder
    lab_cli("down")


def healthy_lab(lab_session: list[Lab]) -> Lab:
    """The session's 2-node b2b lab, brought back if a test module took it down (module-scoped
    fixtures call this; tests take the `lab` fixture)."""
    current = lab_session[0]
    if not current.healthy():
        lab_cli("up", "--force", check=True)
        lab_session[0] = current = Lab.load(LAB_ID)
    return current


@pytest.fixture
def lab(lab_session: list[Lab]) -> Lab:
    return healthy_lab(lab_session)


SPARKCTL = str(REPO / ".venv" / "bin" / "sparkctl")


@dataclass
class Sparkctl:
    """The checkout's sparkctl as one module runs it, from the repository root (every e2e
    module's `sparkctl = Sparkctl(...)`; tests call `sparkctl(*args)`).

    state: the controller's state directory: a module name (e2e_state(name), apart per lab), a
    path, or None (the environment's own). token: $HF_TOKEN, or None to unset it (the lab's hub
    needs none for open models); a call's `token=` overrides it (False: none). env: more
    variables; argv: how sparkctl is started; outputs: every run's stdout and stderr are added
    (a module's secret-sentinel test reads them)."""

    state: str | Path | None = None
    token: str | None = None
    timeout: float = 600
    env: dict[str, str] = field(default_factory=dict)
    argv: Sequence[str] = (SPARKCTL,)
    outputs: list[str] | None = None

    def environment(self, token: str | bool | None = True) -> dict[str, str]:
        env = {**os.environ, **self.env}
        if self.state is not None:
            env["SPARKCTL_STATE_DIR"] = (e2e_state(self.state) if isinstance(self.state, str)
                                         else str(self.state))
        env.pop("HF_TOKEN", None)
        chosen = self.token if token is True else token or None
        if chosen:
            env["HF_TOKEN"] = chosen
        return env

    def command(self, *args: str, token: str | bool | None = True
                ) -> tuple[list[str], dict[str, str]]:
        """(argv, env) for a process the test drives itself (Popen, a terminal)."""
        return [*self.argv, *args], self.environment(token)

    def __call__(self, *args: str, timeout: float | None = None, token: str | bool | None = True,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        argv, environment = self.command(*args, token=token)
        result = subprocess.run(argv, capture_output=True, text=True, cwd=REPO,
                                timeout=timeout or self.timeout, env={**environment, **(env or {})})
        if self.outputs is not None:
            self.outputs.append(result.stdout + result.stderr)
        return result


def inventory_args(lab: Lab) -> list[str]:
    return ["--inventory", str(lab.inventory)]


def fresh_up(lab_session: list[Lab], sparkctl: Sparkctl) -> Lab:
    """The session's lab with nothing served (an earlier module on it may have left a server
    holding the nodes' memory) and `up` run: what a module-scoped fixture starts from."""
    lab = healthy_lab(lab_session)
    sparkctl("down", *inventory_args(lab), "--yes")
    up = sparkctl("up", *inventory_args(lab), "--yes")
    assert up.returncode == 0, up.stdout + up.stderr
    return lab


def run_in_terminal(argv: list[str], env: dict[str, str], replies: Sequence[tuple[bytes, str]],
                    timeout: float = 120) -> tuple[int, str]:
    """Run argv on a pseudo-terminal as a person would: each time one more PROMPT shows than
    were answered, type its REPLY. Returns (exit code, everything the terminal showed)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child
        os.execve(argv[0], argv, env)
    output = b""
    answered: dict[bytes, int] = {}
    deadline = time.monotonic() + timeout
    finished, status = 0, 0
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            output += chunk
            for prompt, reply in replies:
                while output.count(prompt) > answered.get(prompt, 0):
                    answered[prompt] = answered.get(prompt, 0) + 1
                    os.write(fd, reply.encode() + b"\n")
        finished, status = os.waitpid(pid, os.WNOHANG)
        if finished:
            break
    else:
        os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"timed out; output so far:\n{output.decode(errors='replace')}")
    if not finished:
        _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), output.decode(errors="replace")


# Modules that take minutes, longest first (the real vLLM's two modules, reboots, several launches,
# real engines): handed out first under --dist loadfile, which gives workers whole modules in
# collection order when scripts/run-e2e passes --no-loadscope-reorder (without it pytest-xdist
# hands modules out by their number of tests and this order is lost). Measured durations per
# module: docs/lab.md ("How long the e2e tests take").
LONGEST_FIRST = ("test_vllm_real_tp2.py", "test_vllm_real.py", "test_hostile.py",
                 "test_api_keys.py", "test_servers.py", "test_vllm.py", "test_llamacpp.py",
                 "test_fanout.py", "test_gateway.py", "test_dashboard.py", "test_advise.py",
                 "test_topologies.py")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The kept connections of this worker's modules closed (their keepers exit)."""
    from orchestrator.remote import keeper

    for folder in Path("/tmp").glob(f"sparkctl-e2e-*-state-lab{LAB_ID}/ssh-keeper"):
        keeper.stop(folder)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)
    items.sort(key=rank)  # stable: the order inside a module is kept
