"""`docker pull` as it goes: layers and bytes in the progress stream and the run log.

Docker's CLI prints a pull as one line per layer event (`<id>: Pulling fs layer`, `Waiting`,
`Download complete`, `Pull complete`, `Already exists`), then `Digest: ...` and `Status: ...`.
On a terminal it also redraws `<id>: Downloading [==>   ]  12.3MB/45.6MB` bars with cursor
moves; off a terminal it leaves the bytes out. So the pull runs under `script` (util-linux: a
pseudo-terminal for docker alone, while sudo's password still comes on a plain stdin) and the
parser drops the escape sequences. `PullState` keeps each layer's latest state; `PullReport`
prints a line when a layer completes or at most every few seconds, and the heartbeat
(core/progress.py) fills any silence.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.commands import docker_cmd, quote
from orchestrator.core.progress import Heartbeat
from orchestrator.core.step import NodeContext
from orchestrator.phases.fanout import gb
from orchestrator.remote.stream import ssh_connection, stream_run
from orchestrator.remote.transport import SUDO_PASSWORD_NEEDED

ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]")
LAYER = re.compile(r"^([0-9a-f]{12,64}): (.*)$")
WORDS = re.compile(r"[A-Za-z][A-Za-z ]*[A-Za-z]")
BYTES = re.compile(r"([\d.]+)\s*([kKMGTP]?B)\s*/\s*([\d.]+)\s*([kKMGTP]?B)")
UNITS = {"B": 1, "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15}
"""Docker prints sizes in decimal units (go-units HumanSize: kB, MB, GB)."""
DONE = ("Pull complete", "Already exists")
FETCHED = ("Download complete", "Verifying Checksum", "Extracting", *DONE)
EVERY_SECONDS = 5.0


def size(number: str, unit: str) -> int:
    return int(float(number) * UNITS.get(unit, UNITS.get(unit.upper(), 1)))


@dataclass(frozen=True)
class PullEvent:
    """One line of `docker pull`: a layer's status (with bytes while downloading), or a line
    about the whole image (`layer` None: `Digest: ...`, `Status: ...`, `latest: Pulling from`)."""

    layer: str | None
    status: str
    current: int | None = None
    total: int | None = None


def parse_line(raw: str) -> PullEvent | None:
    """A line of docker's pull output (terminal or not); None for an empty line."""
    line = ESCAPE.sub("", raw).strip()
    if not line:
        return None
    found = LAYER.match(line)
    if found is None:
        return PullEvent(None, line)
    layer, rest = found.group(1), found.group(2).strip()
    words = WORDS.match(rest)
    status = words.group(0) if words else rest
    amounts = BYTES.search(rest)
    if amounts is None:
        return PullEvent(layer, status)
    return PullEvent(layer, status, size(*amounts.group(1, 2)), size(*amounts.group(3, 4)))


@dataclass
class Layer:
    status: str
    current: int = 0
    total: int | None = None


@dataclass
class PullState:
    """Every layer's latest status, the digest and docker's last word."""

    layers: dict[str, Layer] = field(default_factory=dict)
    digest: str | None = None
    status: str | None = None

    def add(self, event: PullEvent) -> None:
        if event.layer is None:
            if event.status.startswith("Digest: "):
                self.digest = event.status.removeprefix("Digest: ").strip()
            elif event.status.startswith("Status: "):
                self.status = event.status.removeprefix("Status: ").strip()
            return
        layer = self.layers.setdefault(event.layer, Layer(event.status))
        layer.status = event.status
        if event.total is not None and event.status.startswith("Downloading"):
            layer.current, layer.total = event.current or 0, event.total
        elif event.status.startswith(FETCHED) and layer.total is not None:
            layer.current = layer.total

    def done(self) -> int:
        return sum(1 for layer in self.layers.values() if layer.status.startswith(DONE))

    def bytes(self) -> tuple[int, int]:
        """Downloaded and total bytes over the layers whose size docker said."""
        sized = [layer for layer in self.layers.values() if layer.total]
        return sum(layer.current for layer in sized), sum(layer.total or 0 for layer in sized)

    def summary(self) -> str:
        if not self.layers:
            return "no layer listed yet"
        text = f"{self.done()}/{len(self.layers)} layers done"
        current, total = self.bytes()
        if total:
            text += f", {gb(current)} of {gb(total)} downloaded"
        return text


class PullReport:
    """Feeds docker's lines to a PullState and says, throttled: a layer done, or the totals
    at most every EVERY_SECONDS while bytes move."""

    def __init__(self, say: Callable[[str], None], node: str, image: str,
                 every: float = EVERY_SECONDS) -> None:
        self.say, self.node, self.image, self.every = say, node, image, every
        self.state = PullState()
        self.last: float | None = None  # nothing said yet: the first line speaks

    def line(self, raw: str) -> None:
        event = parse_line(raw)
        if event is None:
            return
        self.state.add(event)
        now = time.monotonic()
        if event.layer is None:
            if event.status.startswith(("Status: ", "Digest: ")):
                self.say(f"          {self.node}: {event.status}")
            return
        done = event.status.startswith(DONE)
        moving = event.total is not None  # bytes: only on a terminal, throttled
        if done or (moving and (self.last is None or now - self.last >= self.every)):
            self.last = now
            self.say(f"          {self.node}: {self.image}: {event.layer[:12]} "
                     f"{event.status.lower()}; {self.state.summary()}")


def pull_cmd(image: str) -> str:
    """`docker pull` on a pseudo-terminal where `script` exists (bytes per layer), else plain."""
    pull = docker_cmd("pull", image)
    return (f"if command -v script >/dev/null 2>&1; then script -qefc {quote(pull)} /dev/null "
            f"</dev/null; else {pull}; fi")


def run_pull(ctx: NodeContext, image: str, timeout: float) -> tuple[int, str]:
    """Pull on the node, its progress in the progress stream and the run log: (exit, output)."""
    note = ctx.options.note
    node = ctx.node.name
    command = pull_cmd(image)
    with Heartbeat(note, f"{node}: docker pull {image}") as beat:
        report = PullReport(beat.say, node, image)
        beat.detail = report.state.summary
        beat.say(f"        ↓ {node}: docker pull {image}")
        transport = ctx.transport
        wrap = getattr(transport, "_command", None)
        if transport is not None and ssh_connection(transport) is not None and wrap is not None:
            wrapped, payload, _ = wrap(command, True, b"")
            status, tail = stream_run(transport, wrapped, report.line, timeout,
                                      f"docker pull {image}", stdin=payload)
            if status == 0 or not any(m in tail for m in SUDO_PASSWORD_NEEDED):
                return status, tail
            # sudo wants a password this transport has not learned yet: the plain run asks
        result = ctx.run(command, sudo=True, timeout=timeout, display=f"docker pull {image}")
        for line in (result.stdout + result.stderr).replace("\r", "\n").splitlines():
            report.line(line)
        return result.exit_status, result.stdout + result.stderr
