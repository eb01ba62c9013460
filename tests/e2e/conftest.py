"""The simulated lab for end-to-end tests (root, Linux).

`lab`: a 2-node b2b lab (SPARKLAB_ID from the environment, default 0), brought up once per
session and torn down at the end; if a test module took it down, the next use brings it back.

Under pytest-xdist (`make test` runs the e2e tests in four workers, whole modules each) every
worker gets its own set of lab ids, so two workers never share a lab: with W workers, worker N
uses the main lab N, the sudo/topology lab N+W, the alternate lab N+2W, the jump-host lab N+3W and
the trust lab N+4W (plus SPARKLAB_E2E_BASE). The longest modules are handed out first
(`LONGEST_FIRST`), so the run does not end waiting on one worker.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
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


def run_sparkctl(state: str, *args: str, timeout: float = 600,
                 token: str | None = None) -> subprocess.CompletedProcess[str]:
    """The checkout's sparkctl with its own state directory (e2e_state(state)), from the
    repository root; $HF_TOKEN is TOKEN, or unset (the lab's hub needs none for open models)."""
    env = {**os.environ, "SPARKCTL_STATE_DIR": e2e_state(state)}
    env.pop("HF_TOKEN", None)
    if token is not None:
        env["HF_TOKEN"] = token
    return subprocess.run([str(REPO / ".venv" / "bin" / "sparkctl"), *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=REPO)


# Modules that take minutes (the real vLLM, reboots, several launches): handed out first under
# --dist loadfile, which gives workers whole modules in collection order.
LONGEST_FIRST = ("test_vllm_real.py", "test_hostile.py", "test_servers.py", "test_advise.py",
                 "test_gateway.py", "test_topologies.py", "test_vllm.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)
    items.sort(key=rank)  # stable: the order inside a module is kept
