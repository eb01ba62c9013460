"""Readiness as data, and the one loop that waits for any engine's server.

An engine states WHEN its server serves (`Readiness`, SkyPilot's readiness_probe idea: the paths
that must answer 200, its ready log line, how long before the first probe, how often, and how a
dead rank shows); each launch says WHICH server to wait for (`Target`: where it answers, its
container, and how to fail: the engine's own log tails). `wait_until_ready` is the only wait
loop: a server that dies while it loads, or the deadline, ends it through the target's `fail`
(which stops the server and raises LaunchFailed with the log tails).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from orchestrator.commands import join, quote
from orchestrator.engines.base import LaunchFailed, Ready
from orchestrator.errors import EXIT_INTERRUPTED, SparkctlError
from orchestrator.node import script
from orchestrator.recipe import Note
from orchestrator.remote.container import ContainerCommands

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory
    from orchestrator.remote.transport import Transport

DeadRanks = Literal["launcher", "containers"]
"""How a dead rank shows: "launcher": the launcher's pid file in the container on the first
node names no live process (mpirun, vllm serve: a rank that dies takes it down); "containers":
the server's container on one of its nodes no longer runs (one container per rank)."""
MODELS = "/v1/models"
PRINT_EVERY = 10.0
"""A note at least this often (seconds) while nothing changes, so a long load is seen alive."""
WAIT_SLICE = PRINT_EVERY
"""Seconds the node-side wait (node/probe.py --wait) may look before it answers unchanged."""
FIRST_LOOK = 2.0
"""Seconds the first node-side wait looks before it answers a server still loading: one that is
ready sooner (a small model already in the page cache) costs one round trip, not two; a slower
one shows its first progress line after this."""


@dataclass(frozen=True)
class Readiness:
    ready_line: str
    """The line its server logs once it serves: with it, a server that stopped answering is
    stalled, not still loading (engines/liveness.py; the node scripts get it as an argument)."""
    paths: tuple[str, ...] = ("/health",)
    """Must answer 200, in this order, and then /v1/models must list the model. `status` probes
    the first two (the engine's second probe: /v1/models when there is one path)."""
    needs_ready_line: bool = False
    """The ready line must be in the log too (an engine whose /health answers 200 before its
    warm-up request went through)."""
    initial_delay: float = 0.0
    """Seconds before the first probe (the server cannot answer sooner)."""
    poll_seconds: float = 2.0
    dead_ranks: DeadRanks = "containers"

    @property
    def status_paths(self) -> tuple[str, str]:
        return self.paths[0], self.paths[1] if len(self.paths) > 1 else MODELS


@dataclass
class FirstRequest:
    """The launch's one real request (its smoke test). A readiness wait that looks on the node
    (node/probe.py --wait) sends it there as soon as the server is ready, in the same command,
    and keeps the answer here for the smoke-test step, which then asks nothing again: one SSH
    command and one python3 start fewer at the end of every such launch."""

    body: dict[str, Any]
    answer: dict[str, Any] | None = None
    """{"code", "body", "seconds"} of the node's request, once it was sent."""


@dataclass(frozen=True)
class Target:
    """One server being waited for."""

    name: str
    nodes: list[str]
    """Its nodes, the one that answers first."""
    container: str
    model: str
    port: int
    host: str
    key_file: str | None
    launcher: str
    """What runs on the first node, as a user knows it (mpirun, vllm serve, llama-server)."""
    ranks: str
    """What runs on each other node (rpc-server, SGLang's rank, Ray)."""
    fail: Callable[[dict[str, Transport], Note, str], NoReturn]
    """Stop the server, raise LaunchFailed with its log tails (the engine's own logs)."""
    run_dir: str = ""
    """"launcher": the server's directory in the container (its pid files and record)."""
    main: str = ""
    """"launcher": the launcher's pid file."""
    ours: tuple[str, ...] = ()
    why_dead: Callable[[dict[str, Transport]], list[str]] = field(default=lambda _: [])
    """What explains a dead launcher beyond its exit (the memory guard's record), one a line."""
    first_request: FirstRequest | None = None
    """Sent by a wait on the node once ready (FirstRequest)."""

    @property
    def first(self) -> str:
        return self.nodes[0]

    @property
    def record(self) -> str:
        """Its record on the first node (ready_at: the wait on the node or the ready step)."""
        from orchestrator.engines.servers import record_dir

        return f"{record_dir(self.name)}/server.json"


@dataclass(frozen=True)
class Poll:
    """One look at a loading server."""

    running: bool
    dead: list[str]
    codes: dict[str, Any]
    models: list[str]
    logged_ready: bool
    waited: bool = False
    """The node looked until something changed (node/probe.py --wait): no pause before the next."""
    marked: bool = False
    """The node set the record's ready_at itself (Target.record)."""


def probe_cmd(port: int, host: str, key_file: str | None, body: dict[str, Any] | None = None) -> str:
    """node/probe.py on the serving node: HOST:PORT as the server binds it, with the server's key
    (its node file, read by the probe) when it has one; with BODY one chat completion."""
    from orchestrator.engines.apikey import probe_host

    words = ["--at", str(port), probe_host(host), key_file or ""]
    if body is not None:
        words.append(json.dumps(body))
    return f"python3 -c {quote(script('probe.py'))} {join(words)}"


def wait_cmd(seconds: float, container: str, seen: str, port: int, host: str,
             key_file: str | None, record: str = "", first: dict[str, Any] | None = None) -> str:
    """node/probe.py --wait: the look of probe_cmd repeated on the node until its /health
    code differs from SEEN (what the controller saw last; "-" at first: until the model is
    listed), CONTAINER stops or SECONDS pass; once ready, RECORD's ready_at set and FIRST (a
    chat completion's body) sent. The node stamps ready_at as this controller time plus the
    seconds it waited by its own clock: when it saw the server ready, whatever its clock says."""
    from orchestrator.engines.apikey import probe_host
    from orchestrator.engines.liveness import ready_now

    words = ["--wait", f"{seconds:g}", container, seen, str(port), probe_host(host), key_file or ""]
    if record:
        words += [record, ready_now()] + ([json.dumps(first)] if first is not None else [])
    return f"python3 -c {quote(script('probe.py'))} {join(words)}"


def running_cmd(container: str) -> str:
    return f"{ContainerCommands(container).running_cmd()} 2>/dev/null || echo gone"


def parse_lines(out: str) -> dict[str, Any]:
    """`running=`, `fired=` lines and the probe's JSON line, as one dict."""
    state: dict[str, Any] = {}
    for line in out.splitlines():
        if line.startswith("running="):
            state["running"] = line.partition("=")[2].strip() == "true"
        elif line.startswith("fired="):
            state["fired"] = line.partition("=")[2].strip() not in ("", "0")
        elif line.startswith("{"):
            try:
                state.update(json.loads(line))
            except ValueError:
                continue
    return state


def poll(transports: dict[str, Transport], target: Target, readiness: Readiness,
         wait: float = 0.0, seen: Poll | None = None) -> Poll:
    """The first node's answers, and which ranks died, as the readiness's dead-rank check says.
    WAIT > 0: the first node looks for up to WAIT seconds itself, until its answer differs from
    SEEN (the last poll) (one round trip per change; not for an engine whose readiness needs
    its log line)."""
    first = transports[target.first]
    if readiness.dead_ranks == "launcher":
        from orchestrator.engines.serverctl import node_call

        status = node_call(first, target.container, timeout=120, action="status",
                           port=target.port, deep=True,
                           generate="/health_generate" in readiness.paths, run=target.run_dir,
                           ours=list(target.ours), main=target.main)
        alive = bool(((status.get("pids") or {}).get(target.main) or {}).get("alive"))
        codes = {"/health": status.get("health"), "/health_generate": status.get("health_generate")}
        return Poll(alive, [], codes, [m for m in status.get("models") or [] if m],
                    bool(status.get("ready_log")))
    waited = wait > 0 and not readiness.needs_ready_line
    if waited:
        last = "-" if seen is None else str(seen.codes.get("/health"))  # "-": the first look
        body = target.first_request.body if target.first_request is not None else None
        command = wait_cmd(wait, target.container, last, target.port, target.host,
                           target.key_file, target.record, body)
    else:
        fired = quote(readiness.ready_line.replace("!", "[!]"))
        log = ContainerCommands(target.container).logs_cmd()
        command = (f"echo \"running=$({running_cmd(target.container)})\"; "
                   + (f"echo \"fired=$({log} 2>&1 | grep -c {fired})\"; "
                      if readiness.needs_ready_line else "")
                   + probe_cmd(target.port, target.host, target.key_file))
    state = parse_lines(first.run(command, sudo=True, timeout=120 + wait,
                                  display=f"{target.container}: /health").stdout)
    dead = [n for n in target.nodes[1:] if n in transports and "true" not in transports[n].run(
        running_cmd(target.container), sudo=True, timeout=60,
        display=f"{target.container} running?").stdout]
    if "first" in state and target.first_request is not None and not dead:
        target.first_request.answer = state["first"]
    return Poll(bool(state.get("running")), dead, {"/health": state.get("health")},
                [m for m in state.get("models") or [] if m], bool(state.get("fired")), waited,
                marked=bool(state.get("ready_at")))


def stop_and_fail(transports: dict[str, Transport], inventory: Inventory, name: str,
                  nodes: list[str], note: Note, reason: str, details: str) -> NoReturn:
    """A server that did not come up: stop it (its containers and record on every node, other
    servers untouched) and raise LaunchFailed with its log tails (DETAILS)."""
    from orchestrator.engines.servers import stop_server, unrecorded

    note(f"{reason}; stopping {name}")
    left = ""
    try:
        stop_server(transports, inventory, unrecorded(name, "", nodes))
    except SparkctlError as exc:
        left = f" (could not stop it: {exc})"
    raise LaunchFailed(f"{reason}; {name} stopped{left} (log tails below)", details)


def stage(state: Poll, readiness: Readiness) -> str:
    for index, path in enumerate(readiness.paths):
        if state.codes.get(path) != 200:
            doing = "loading" if index == 0 else "warming up"
            return f"{doing} ({path} {state.codes.get(path) or 'no answer'})"
    if readiness.needs_ready_line and not state.logged_ready:
        return f"warming up (not yet \"{readiness.ready_line}\")"
    return f"listing models ({MODELS})"


def ready_note(readiness: Readiness) -> str:
    said = [*readiness.paths, MODELS]
    text = f"ready: {', '.join(said[:-1])} and {said[-1]} answer"
    return text + (f", and \"{readiness.ready_line}\" logged" if readiness.needs_ready_line else "")


def wait_until_ready(transports: dict[str, Transport], target: Target, readiness: Readiness,
                     timeout: float, note: Note) -> Ready:
    """Probe until the server serves; a dead launcher or rank, or the deadline, fails it."""
    started = time.monotonic()
    deadline = started + timeout
    last_stage, last_print = "", 0.0
    state: Poll | None = None
    try:
        if readiness.initial_delay:
            time.sleep(readiness.initial_delay)
        while True:
            # other nodes' ranks are looked at between the first node's waits: as often as before
            slice_ = WAIT_SLICE if len(target.nodes) == 1 else readiness.poll_seconds
            slice_ = min(slice_, FIRST_LOOK) if state is None else slice_
            state = poll(transports, target, readiness,
                         max(0.0, min(slice_, deadline - time.monotonic())), state)
            elapsed = time.monotonic() - started
            if not state.running:
                why = "; ".join(target.why_dead(transports))
                target.fail(transports, note, f"{target.launcher} exited on {target.first} while "
                            f"loading (after {elapsed:.0f}s)" + (f": {why}" if why else ""))
            if state.dead:
                target.fail(transports, note, f"{target.ranks} exited on {', '.join(state.dead)} "
                            f"while {target.first} loaded (after {elapsed:.0f}s)")
            now = stage(state, readiness)
            if now.startswith("listing") and target.model in state.models:
                note(f"[{elapsed:6.1f}s] {ready_note(readiness)}")
                return Ready(elapsed, state.models, marked=state.marked)
            if time.monotonic() > deadline:
                target.fail(transports, note, f"{target.name} was not ready within {timeout:.0f}s "
                            f"(--timeout); last state: {now}")
            if now != last_stage or time.monotonic() - last_print > PRINT_EVERY:
                note(f"[{elapsed:6.1f}s] {target.name} on {target.first}: {now}; deadline in "
                     f"{deadline - time.monotonic():.0f}s")
                last_stage, last_print = now, time.monotonic()
            if not state.waited:
                time.sleep(readiness.poll_seconds)
    except KeyboardInterrupt:
        raise SparkctlError(
            f"stopped waiting; {target.name} keeps loading on {target.first}. Follow it with "
            f"`sparkctl logs --server {target.name}` or `sparkctl status`; stop it with "
            f"`sparkctl down --server {target.name}`", EXIT_INTERRUPTED) from None
