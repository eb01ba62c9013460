"""One fake cluster for every unit test: scripted transports, inventories, contexts, sessions.

`FakeTransport` stands in for orchestrator.remote.transport.Transport: it takes the same keyword
arguments as `Transport.run` (stdin, sudo, timeout, display), records every call, and answers
from (in this order) the rules added with `.on(pattern, ...)`, the node-side facts gatherer
(`facts=`: a dict, or a function of the request), a queue of canned answers, and finally
success with no output. An answer may be an exception (raised) or a function of the call.

`FakeCluster` holds one FakeTransport per reachable node, a journal shared by all of them (in
the order commands ran, across threads), and builds the `Session`/`NodeContext` the code under
test expects.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.progress import Progress
from orchestrator.core.report import Report
from orchestrator.core.session import Session
from orchestrator.core.step import NodeContext, RunOptions, RunState
from orchestrator.inventory import Inventory
from orchestrator.inventory_checks import inventory_from_data
from orchestrator.remote.gathered import NodeFacts
from orchestrator.remote.transport import Result

GOLDEN = Path(__file__).parent / "golden" / "up"
FACTS_PREFIX = "python3 - "

TWO_SPARKS: dict[str, Any] = {
    "cluster": {"name": "two-sparks", "ssh_key": "/k"},
    "nodes": [
        {"name": "spark-a", "host": "a",
         "addresses": {"enp1s0f1np1": "192.168.200.12/24", "enP2p1s0f1np1": "192.168.201.12/24"}},
        {"name": "spark-b", "host": "b",
         "addresses": {"enp1s0f1np1": "192.168.200.13/24", "enP2p1s0f1np1": "192.168.201.13/24"}},
    ],
}

Answer = Any
"""(status, stdout, stderr), a Result, an exception, or a function (Call) -> one of those."""


@dataclass
class Call:
    node: str
    command: str
    stdin: bytes | str | None
    sudo: bool
    timeout: float | None
    display: str | None

    def __getitem__(self, key: str) -> Any:  # old tests read calls as dicts
        return getattr(self, key)

    @property
    def request(self) -> dict[str, Any]:
        """The JSON request of a facts-gatherer call (python3 - REQUEST)."""
        return json.loads(shlex.split(self.command)[2])  # type: ignore[no-any-return]


@dataclass
class Rule:
    pattern: re.Pattern[str]
    answer: Answer
    times: int | None  # None: forever
    used: int = 0


def facts_request(command: str) -> dict[str, Any] | None:
    if not command.startswith(FACTS_PREFIX):
        return None
    return json.loads(shlex.split(command)[2])  # type: ignore[no-any-return]


class FakeTransport:
    """A scripted node: see the module docstring."""

    def __init__(self, node: str, answers: list[Answer] | None = None, *,
                 facts: dict[str, Any] | Callable[[dict[str, Any]], Any] | None = None,
                 journal: list[tuple[str, str]] | None = None,
                 journal_lock: threading.Lock | None = None) -> None:
        self.node = node
        self.answers = list(answers or [])
        self.facts = facts
        self.rules: list[Rule] = []
        self.calls: list[Call] = []
        self.journal = journal if journal is not None else []
        self._lock = journal_lock or threading.Lock()
        self.closed = False

    def on(self, pattern: str, status: int = 0, stdout: str = "", stderr: str = "", *,
           answer: Answer = None, times: int | None = None) -> FakeTransport:
        """Answer commands matching the regex `pattern` (searched); the first rule added wins."""
        reply = answer if answer is not None else (status, stdout, stderr)
        self.rules.append(Rule(re.compile(pattern), reply, times))
        return self

    @property
    def commands(self) -> list[str]:
        return [call.command for call in self.calls]

    def run(self, command: str, *, stdin: bytes | str | None = None, sudo: bool = False,
            timeout: float | None = None, display: str | None = None) -> Result:
        call = Call(self.node, command, stdin, sudo, timeout, display)
        with self._lock:
            self.calls.append(call)
            self.journal.append((self.node, command))
        answer = self._answer(call)
        if callable(answer) and not isinstance(answer, type):
            answer = answer(call)
        if isinstance(answer, BaseException) or (
                isinstance(answer, type) and issubclass(answer, BaseException)):
            raise answer
        if isinstance(answer, Result):
            return answer
        if isinstance(answer, dict):  # a JSON answer
            answer = (0, json.dumps(answer), "")
        status, out, err = answer
        return Result(self.node, display or command, status, out, err, 0.0)

    def _answer(self, call: Call) -> Answer:
        for rule in self.rules:
            if rule.pattern.search(call.command) and (rule.times is None or rule.used < rule.times):
                rule.used += 1
                return rule.answer
        request = facts_request(call.command)
        if request is not None and self.facts is not None:
            facts = self.facts(request) if callable(self.facts) else self.facts
            return facts if isinstance(facts, (tuple, Result, BaseException)) else (0, json.dumps(facts), "")
        if self.answers:
            return self.answers.pop(0)
        return (0, "", "")

    def close(self) -> None:
        self.closed = True


SERVERS_CMD = r'"migrate"'
"""A regex matching the command that lists a node's servers (engines/servers.servers_cmd)."""


def servers_listing(*records: dict[str, Any], node: str = "spark-a",
                    alive: bool = True) -> dict[str, Any]:
    """node/servers.py's answer on NODE for RECORDS (name, nodes and engine filled in as every
    engine writes them), each `alive` unless it says otherwise."""
    listed = [{"nodes": [node], "engine": "trtllm", "alive": alive,
               **r, "name": r.get("name") or r.get("recipe")} for r in records]
    return {"servers": listed}


def as_servers(records: list[dict[str, Any]], node: str = "spark-a") -> list[Any]:
    """RECORDS (as node/servers.py lists them) read as the typed servers every reader gets."""
    from orchestrator.records import read_server

    return [read_server({"nodes": [r.get("node") or node], "engine": "trtllm", **r},
                        str(r.get("node") or (r.get("nodes") or [node])[0]))
            for r in records]


def make_inventory(data: dict[str, Any] | None = None, source: str = "two-sparks.yml",
                   **container: Any) -> Inventory:
    """The two-Spark inventory (or `data`); keyword arguments become TensorRT-LLM's container
    section (engines.trtllm.container)."""
    data = json.loads(json.dumps(data or TWO_SPARKS))
    if container:
        from orchestrator.engines import REGISTRY

        engines = data.setdefault("engines", {name: {} for name in REGISTRY})
        engines.setdefault("trtllm", {})["container"] = container
    return inventory_from_data(data, source)


def node_facts(raw: dict[str, Any] | NodeFacts, node: str = "node") -> NodeFacts:
    """A gatherer's answer (as a test writes it) parsed as the executor parses it."""
    return raw if isinstance(raw, NodeFacts) else NodeFacts.parse(raw, node)


def cluster_of(raw: dict[str, Any]) -> dict[str, NodeFacts]:
    """Every node's answer parsed, by node name."""
    return {name: node_facts(facts, name) for name, facts in raw.items()}


def make_context(inv: Inventory, node: str, cluster_facts: dict[str, Any],
                 shared: RunState | dict[str, Any] | None = None,
                 transports: dict[str, FakeTransport] | None = None,
                 options: RunOptions | None = None) -> NodeContext:
    """A step's context; `shared` as a dict sets RunState's fields by name, any other key is an
    engine's own (RunState.engine)."""
    transports = transports or {}
    if not isinstance(shared, RunState):
        given, shared = shared or {}, RunState()
        for key, value in given.items():
            if hasattr(shared, key) and key != "engine":
                setattr(shared, key, value)
            else:
                shared.engine[key] = value
    cluster = cluster_of(cluster_facts)
    return NodeContext(
        inventory=inv, node=inv.node(node), facts=cluster[node], cluster_facts=cluster,
        transport=transports.get(node), options=options or RunOptions(),  # type: ignore[arg-type]
        shared=shared, transports=transports,  # type: ignore[arg-type]
    )


@dataclass
class FakeCluster:
    """Every node of `inventory` as a FakeTransport; `unreachable` nodes get none."""

    inventory: Inventory
    facts: dict[str, Any] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)
    journal: list[tuple[str, str]] = field(default_factory=list)
    transports: dict[str, FakeTransport] = field(default_factory=dict)

    def __post_init__(self) -> None:
        lock = threading.Lock()
        for node in self.inventory.nodes:
            if node.name not in self.unreachable:
                self.transports[node.name] = FakeTransport(
                    node.name, facts=self.facts.get(node.name), journal=self.journal, journal_lock=lock)

    def __getitem__(self, node: str) -> FakeTransport:
        return self.transports[node]

    def commands(self, node: str | None = None) -> list[str]:
        return [command for name, command in self.journal if node in (None, name)]

    def session(self, command: str = "up") -> Session:
        report = Report(command)
        for node in self.inventory.nodes:
            report.host(node.name)
        for name, message in self.unreachable.items():
            report.fail_host(name, message)
        return Session(self.inventory, report, Progress(quiet=True), dict(self.transports))  # type: ignore[arg-type]

    def connect_all(self, inventory: Inventory, nodes: Any, sudo: Any, trust_new_hosts: bool = False
                    ) -> tuple[dict[str, Any], dict[str, str]]:
        """Stands in for orchestrator.remote.connect.connect_all."""
        names = {n.name for n in nodes}
        return ({k: v for k, v in self.transports.items() if k in names},
                {k: v for k, v in self.unreachable.items() if k in names})

    def context(self, node: str, cluster_facts: dict[str, dict[str, Any]] | None = None,
                **kwargs: Any) -> NodeContext:
        cluster_facts = cluster_facts or {n: self.facts.get(n) or {} for n in self.transports}
        return make_context(self.inventory, node, cluster_facts, transports=self.transports, **kwargs)


def golden_compare(name: str, actual: str) -> None:
    """Compare with tests/unit/golden/up/NAME; SPARKCTL_UPDATE_GOLDEN=1 rewrites it."""
    path = GOLDEN / name
    if os.environ.get("SPARKCTL_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
    assert path.exists(), f"golden file missing: {path} (run with SPARKCTL_UPDATE_GOLDEN=1)"
    assert actual == path.read_text(), f"{name} differs from its golden file"


@pytest.fixture
def fake_cluster() -> Callable[..., FakeCluster]:
    """fake_cluster(inventory=None, facts={node: facts}, unreachable={node: message})."""
    def build(inventory: Inventory | None = None, facts: dict[str, Any] | None = None,
              unreachable: dict[str, str] | None = None) -> FakeCluster:
        return FakeCluster(inventory or make_inventory(), dict(facts or {}), dict(unreachable or {}))
    return build


@pytest.fixture
def fake_transport() -> type[FakeTransport]:
    return FakeTransport


@pytest.fixture
def inventory() -> Callable[..., Inventory]:
    return make_inventory


@pytest.fixture
def context() -> Callable[..., NodeContext]:
    return make_context


@pytest.fixture
def golden() -> Callable[[str, str], None]:
    return golden_compare


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private $SPARKCTL_STATE_DIR, and the sparkctl logger's handlers restored afterwards."""
    import logging

    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(tmp_path / "state"))
    logger = logging.getLogger("sparkctl")
    handlers, level = list(logger.handlers), logger.level
    yield tmp_path / "state"
    for handler in logger.handlers[:]:
        if handler not in handlers:
            logger.removeHandler(handler)
            handler.close()
    logger.setLevel(level)


LAB_NODE_TOOLS = Path(__file__).resolve().parents[2] / "lab" / "sparklab" / "node_tools"


@pytest.fixture
def docker_shim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., list[Any]]:
    """The lab's docker shim in-process, its state under tmp_path: docker_shim("manage") gives
    [sparklab_dockerd_state, sparklab_dockerd_manage] (the state module first, always)."""
    import importlib

    def load(*parts: str) -> list[Any]:
        monkeypatch.syspath_prepend(str(LAB_NODE_TOOLS))
        monkeypatch.setenv("SPARKLAB_IMAGE_DIR", str(LAB_NODE_TOOLS.parent / "image"))
        modules = [importlib.import_module(f"sparklab_dockerd_{p}") for p in ("state", *parts)]
        for module in modules:
            monkeypatch.setattr(module, "IMAGES", str(tmp_path / "images"))
        monkeypatch.setattr(modules[0], "CONFIG", str(tmp_path / "config"))
        monkeypatch.setattr(modules[0], "ROOT", str(tmp_path))
        return modules

    return load


def model_args(recipe: Any, inventory: Inventory | None = None) -> tuple[list[str], Any]:
    """(serving nodes, ModelTools of the engine's model image): what the models phases and
    steps take explicitly (the launch plan works both out once)."""
    from orchestrator.engines import engine_of
    from orchestrator.phases.model_tools import model_tools
    from orchestrator.recipe import serving_nodes

    inv = inventory or make_inventory()
    return serving_nodes(recipe, inv), model_tools(engine_of(recipe).model_image(recipe, inv), inv)


@pytest.fixture(autouse=True)
def _no_user_recipes(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user recipe folder ($XDG_CONFIG_HOME/sparkctl/recipes) of whoever runs the tests
    must not leak into them: every test starts with an empty configuration folder."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg-config")))


@pytest.fixture(autouse=True)
def _no_kept_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test hands its SSH connections to a keeper process that would outlive it
    (remote/keeper.py); test_keeper.py turns keeping on where it tests it."""
    monkeypatch.setenv("SPARKCTL_SSH_PERSIST", "0")
