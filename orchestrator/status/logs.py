"""`sparkctl logs`: every node's container and server logs, interleaved, optionally followed.

Per node, one channel per source over the node's single SSH connection: `docker logs` of the
container, and one `tail -v` over the run directory's log files (server.log on the head,
rank-N.log on every node; tail's `==> file <==` headers tell which file a line came from).
Lines are printed as they arrive, each prefixed with its node and source.

Following: a remote `tail -F` or `docker logs -f` would outlive a closed SSH channel (sshd
sends no signal to a command without a terminal, even when the controller dies), so followed
commands run on a pseudo-terminal: when the channel or the whole connection goes, sshd closes
the terminal and the kernel hangs up every process on it. Ctrl-C closes every channel:
nothing is left running on the nodes (checked in tests/e2e/test_status_down.py).
"""

from __future__ import annotations

import json
import queue
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TextIO

from orchestrator.commands import docker_cmd, quote
from orchestrator.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, InputError
from orchestrator.inventory import Inventory, Node
from orchestrator.paths import RUN_DIR
from orchestrator.remote.container import ContainerCommands
from orchestrator.remote.stream import Stream
from orchestrator.remote.transport import Transport

HEADER = re.compile(r"^==> (.+) <==$")
DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
NOTE_PREFIX = "sparkctl-note: "
"""Lines our own remote commands print about a source (not log lines): shown on stderr."""


@dataclass(frozen=True)
class LogSource:
    node: str
    label: str
    """What the lines are: "container", or a file name; tail headers may rename it."""
    command: str


def parse_since(text: str, now: float | None = None) -> float:
    """10s / 5m / 2h / 1d ago, an ISO time, or a Unix time -> Unix time."""
    now = time.time() if now is None else now
    match = DURATION.match(text.strip())
    if match:
        return now - float(match.group(1)) * UNITS[match.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            f"--since {text!r}: give a duration (30s, 10m, 2h, 1d), an ISO time "
            "(2025-06-01T12:00:00) or a Unix time"
        ) from None
    return parsed.timestamp()


def rank_of(inventory: Inventory, node: Node) -> int:
    """MPI rank of a node: hostfile order, head first, one slot per node."""
    return [n.name for n in inventory.ordered_nodes()].index(node.name)


def expected_files(inventory: Inventory, node: Node) -> list[str]:
    files = [f"{RUN_DIR}/rank-{rank_of(inventory, node)}.log"]
    if node.name == inventory.head_name:
        files.insert(0, f"{RUN_DIR}/server.log")
    return files


def container_log_cmd(inventory: Inventory, follow: bool, since: float | None, tail: int | None
                      ) -> str:
    inside = ContainerCommands(inventory.container.name)
    return (f"{inside.inspect_cmd()} >/dev/null 2>&1 || "
            f"{{ echo {quote(NOTE_PREFIX + 'no container ' + inside.name + ' on this node')}; "
            "exit 0; }; " + inside.logs_cmd(tail, since, follow))


def engine_container_log_cmd(inventory: Inventory, engine: str, follow: bool, since: float | None,
                             tail: int | None, label: str = "engine") -> str:
    """`docker logs` of an engine's own server container (vLLM's: its Ray node), if any;
    label="server": the containers of the server named `engine` (SGLang's per-server ones)."""
    args: list[Any] = ["logs"]
    if since is not None:
        args += ["--since", f"{since:.0f}"]
    if tail is not None:
        args += ["--tail", tail]
    if follow:
        args.append("--follow")
    find = docker_cmd("ps", "-aq", "--filter", "label=sparkctl.managed=true", "--filter",
                      f"label=sparkctl.cluster={inventory.cluster.name}", "--filter",
                      f"label=sparkctl.{label}={engine}")
    return f'c=$({find} | head -n 1); [ -n "$c" ] || exit 0; {docker_cmd(*args)} "$c"'


SERVER_LOGS = f"{RUN_DIR}/servers/*/*.log"
"""Each named server's own log files (a process server's server.log and rank-N.log)."""


def file_log_cmd(files: list[str], follow: bool, since: float | None, tail: int | None,
                 globs: tuple[str, ...] = (f"{RUN_DIR}/*.log", SERVER_LOGS)) -> str:
    """tail -v over the expected files plus any other *.log already in the run directory and
    the servers' directories (or only those GLOBS)."""
    listed = quote(" ".join(files))  # our paths hold no spaces: a word list for the shell
    where = " ".join(globs)  # (globs the shell expands: our paths and server names hold no spaces)
    pick = (
        f"files={listed}; for f in {where}; do [ -e \"$f\" ] || continue; "
        f"case \" $files \" in *\" $f \"*) ;; *) files=\"$files $f\";; esac; done; "
    )
    if since is not None:
        # log files carry no timestamps: keep the files written to since then
        pick += (
            f"keep=; for f in $files; do [ ! -e \"$f\" ] && {{ [ {int(follow)} = 1 ] && keep=\"$keep $f\"; "
            f"continue; }}; [ -n \"$(find \"$f\" -newermt @{since:.0f} 2>/dev/null)\" ] && "
            "keep=\"$keep $f\"; done; files=$keep; [ -n \"$files\" ] || exit 0; "
        )
    elif not follow:
        pick += "keep=; for f in $files; do [ -e \"$f\" ] && keep=\"$keep $f\"; done; " \
                "files=$keep; [ -n \"$files\" ] || exit 0; "
    lines = "+1" if tail is None else str(tail)
    pick += "[ -n \"$files\" ] || exit 0; "  # (no file at all: tail would read stdin)
    return pick + f"tail -v -n {lines}{' -F' if follow else ''} -- $files"


def server_files_cmd(server: str, follow: bool, tail: int | None) -> str:
    """tail -v over the *.log files a server keeps beside its record (vLLM's server.log of the
    process it started in its container), on the nodes that have them."""
    from orchestrator.engines.servers import record_dir

    where = quote(record_dir(server))
    lines = "+1" if tail is None else str(tail)
    return (f"files=$(ls -d -- {where}/*.log {where}/*/*.log 2>/dev/null); "
            f"[ -n \"$files\" ] || exit 0; tail -v -n {lines}{' -F' if follow else ''} -- $files")


def sources_for(inventory: Inventory, node: Node, follow: bool, since: float | None,
                tail: int | None, server: str | None = None) -> list[LogSource]:
    if server:  # one server's own containers (on each of its nodes), and its log files
        return [LogSource(node.name, server, engine_container_log_cmd(
            inventory, server, follow, since, tail, label="server") + " 2>&1"),
                LogSource(node.name, "files", server_files_cmd(server, follow, tail) + " 2>&1")]
    return [
        LogSource(node.name, "container", container_log_cmd(inventory, follow, since, tail) + " 2>&1"),
        LogSource(node.name, "files", file_log_cmd(expected_files(inventory, node), follow, since, tail)
                  + " 2>&1"),
        # each engine's own server containers (Engine.log_label: vLLM's Ray nodes, SGLang's ranks)
        *(LogSource(node.name, label, engine_container_log_cmd(inventory, name, follow, since, tail)
                    + " 2>&1") for name, label in engine_log_labels()),
    ]


def engine_log_labels() -> list[tuple[str, str]]:
    """(engine, the label its containers' lines get) for engines with server containers."""
    from orchestrator.engines import REGISTRY, get_engine
    from orchestrator.engines.capabilities import log_label

    return [(name, log_label(get_engine(name))) for name in sorted(REGISTRY)
            if log_label(get_engine(name))]


class LineTagger:
    """Turns the raw lines of one source into (label, line), using tail's file headers."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.held_blank = False

    def feed(self, raw: str) -> list[tuple[str, str]]:
        line = raw.rstrip("\r\n")
        header = HEADER.match(line)
        if header:
            self.held_blank = False
            parts = header.group(1).split("/")
            name = parts[-1].removesuffix(".log")
            # a named server's file: its name too (several servers each have a rank-0.log)
            self.label = f"{parts[-2]}/{name}" if parts[-3:-2] == ["servers"] else name
            return []
        if line.startswith("tail: "):  # "file appeared", "cannot open": noise here
            return []
        if line == "":
            # tail prints a blank line before each header after the first: hold it back
            if self.held_blank:
                return [(self.label, "")]
            self.held_blank = True
            return []
        out = [(self.label, "")] if self.held_blank else []
        self.held_blank = False
        return [*out, (self.label, line)]


def stream_logs(inventory: Inventory, transports: dict[str, Transport], sources: list[LogSource],
                follow: bool, out: TextIO | None = None, err: TextIO | None = None,
                as_json: bool = False) -> int:
    """Print every source's lines as they arrive (with as_json: one {"node", "source", "line"}
    object per line, JSON lines); returns the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    lines: queue.Queue[tuple[str, str, str] | tuple[str, None, str]] = queue.Queue()
    streams: list[Stream] = []
    node_width = max(len(n.name) for n in inventory.nodes)
    failed = False

    def pump(source: LogSource, stream: Stream) -> None:
        tagger = LineTagger(source.label)
        try:
            for raw in stream.lines():
                for label, line in tagger.feed(raw):
                    lines.put((source.node, label, line))
        except Exception as exc:  # a broken connection ends this source, not the others
            lines.put((source.node, None, f"stream ended: {exc}"))
            return
        lines.put((source.node, None, ""))

    threads = []
    for source in sources:
        try:
            stream = Stream(transports[source.node], source.command, terminal=follow)
        except Exception as exc:
            err.write(f"{source.node}: cannot open a log stream: {exc}\n")
            failed = True
            continue
        streams.append(stream)
        thread = threading.Thread(target=pump, args=(source, stream), daemon=True)
        thread.start()
        threads.append(thread)
    live = len(threads)
    try:
        while live:
            try:
                node, label, line = lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if label is not None and line.startswith(NOTE_PREFIX):
                err.write(f"{node}: {line.removeprefix(NOTE_PREFIX)}\n")
                continue
            if label is None:
                live -= 1
                if line:
                    failed = True
                    err.write(f"{node}: {line}\n")
                continue
            if as_json:
                out.write(json.dumps({"node": node, "source": label, "line": line}) + "\n")
            else:
                out.write(f"{node:<{node_width}} {label:<9} | {line}\n")
            out.flush()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        for stream in streams:
            stream.close()
    return EXIT_FAILED if failed else EXIT_OK


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM ends a follow as cleanly as Ctrl-C does."""
    raise KeyboardInterrupt


def run_logs(inventory: Inventory, node_names: list[str], follow: bool, since: str | None,
             tail: int | None, server: str | None = None, as_json: bool = False) -> int:
    from orchestrator.core.session import open_session

    nodes = [inventory.node(name) for name in node_names] if node_names else inventory.ordered_nodes()
    since_time = parse_since(since) if since else None
    code = EXIT_OK
    with open_session(inventory, "logs", nodes=nodes, quiet=True) as session:
        for name, host in session.report.hosts.items():
            if host.error:
                sys.stderr.write(f"{name}: unreachable, no logs: {host.error}\n")
                code = EXIT_FAILED
        sources = [s for n in nodes if n.name in session.transports
                   for s in sources_for(inventory, n, follow, since_time, tail, server)]
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            result = stream_logs(inventory, session.transports, sources, follow, as_json=as_json)
        finally:
            signal.signal(signal.SIGTERM, previous)
    return result if result != EXIT_OK else code
