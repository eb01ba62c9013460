"""docker pull's output read into layers and bytes (phases/pull_progress.py), and the heartbeat
that fills a long wait's silences (core/progress.py)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from orchestrator.core.progress import Heartbeat, elapsed_text
from orchestrator.phases.pull_progress import PullEvent, PullReport, PullState, parse_line, pull_cmd

# docker pull on a terminal: cursor moves around each redrawn layer line
TERMINAL = [
    "1.3.0rc12: Pulling from nvidia/tensorrt-llm/release",
    "4f4fb700ef54: Pulling fs layer",
    "a1b2c3d4e5f6: Pulling fs layer",
    "a1b2c3d4e5f6: Waiting",
    "\x1b[2A\x1b[2K\r4f4fb700ef54: Downloading [=====>          ]  12.3MB/45.6MB\x1b[2B",
    "\x1b[1A\x1b[2K\ra1b2c3d4e5f6: Downloading [>               ]  1.5GB/4.21GB\x1b[1B",
    "4f4fb700ef54: Verifying Checksum",
    "4f4fb700ef54: Download complete",
    "4f4fb700ef54: Extracting [==>     ]  32.8kB/45.6MB",
    "4f4fb700ef54: Pull complete",
    "Digest: sha256:" + "7" * 64,
    "Status: Downloaded newer image for nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12",
]


def test_a_downloading_line_gives_layer_status_and_bytes() -> None:
    event = parse_line(TERMINAL[4])
    assert event == PullEvent("4f4fb700ef54", "Downloading", 12_300_000, 45_600_000)
    assert parse_line("a1b2c3d4e5f6: Already exists") == PullEvent("a1b2c3d4e5f6", "Already exists")
    assert parse_line("0123456789ab: Extracting [=>  ]  32.8kB/1.2GB") == \
        PullEvent("0123456789ab", "Extracting", 32_800, 1_200_000_000)


def test_lines_about_the_image_have_no_layer() -> None:
    assert parse_line("Digest: sha256:ab") == PullEvent(None, "Digest: sha256:ab")
    assert parse_line("latest: Pulling from library/ubuntu").layer is None
    assert parse_line("  \x1b[1A  ") is None


def test_state_counts_layers_and_bytes() -> None:
    state = PullState()
    for line in TERMINAL[:6]:
        event = parse_line(line)
        assert event is not None
        state.add(event)
    assert state.bytes() == (12_300_000 + 1_500_000_000, 45_600_000 + 4_210_000_000)
    assert state.summary().startswith("0/2 layers done, ")
    for line in TERMINAL[6:]:
        event = parse_line(line)
        assert event is not None
        state.add(event)
    # a layer downloaded counts all its bytes, even when the last bar line was not seen
    assert state.bytes() == (45_600_000 + 1_500_000_000, 45_600_000 + 4_210_000_000)
    assert state.done() == 1 and state.digest == "sha256:" + "7" * 64
    assert state.status is not None and state.status.startswith("Downloaded newer image")


def test_off_a_terminal_the_summary_has_layers_but_no_bytes() -> None:
    state = PullState()
    for line in ("aaaaaaaaaaaa: Pulling fs layer", "aaaaaaaaaaaa: Pull complete",
                 "bbbbbbbbbbbb: Waiting"):
        event = parse_line(line)
        assert event is not None
        state.add(event)
    assert state.summary() == "1/2 layers done"
    assert PullState().summary() == "no layer listed yet"


def test_report_says_each_finished_layer_and_throttles_the_bars() -> None:
    said: list[str] = []
    report = PullReport(said.append, "spark-a", "img:1", every=3600)
    for line in TERMINAL:
        report.line(line)
    # the first bar line speaks (nothing said yet), later bars wait for the throttle
    bars = [line for line in said if "downloading;" in line]
    assert len(bars) == 1
    assert any("4f4fb700ef54 pull complete; 1/2 layers done" in line for line in said)
    assert said[-1].strip().startswith("spark-a: Status: Downloaded newer image")


def test_pull_runs_on_a_pseudo_terminal_when_script_exists() -> None:
    command = pull_cmd("nvcr.io/x/y:1")
    assert "script -qefc 'docker pull nvcr.io/x/y:1' /dev/null" in command
    assert command.endswith("else docker pull nvcr.io/x/y:1; fi")


def test_heartbeat_speaks_in_a_silence_with_what_and_detail() -> None:
    said: list[str] = []
    spoke = threading.Event()

    def note(line: str) -> None:
        said.append(line)
        spoke.set()

    with Heartbeat(note, "spark-a: docker pull img", every=0.0, detail=lambda: "1/4 layers done"):
        assert spoke.wait(30)
    assert "spark-a: docker pull img: waiting, " in said[0] and said[0].endswith("1/4 layers done")


def test_elapsed_text() -> None:
    assert elapsed_text(7.9) == "7s"
    assert elapsed_text(125) == "2m05s"


def test_a_silent_readiness_wait_still_says_what_it_waits_for(
        monkeypatch: pytest.MonkeyPatch, inventory: Any, context: Any) -> None:
    """engines/verify.py's WaitReady: an engine that prints nothing while it loads still gets
    a line naming what is awaited (and the engine's own lines pass through)."""
    from orchestrator.core import progress
    from orchestrator.core.step import Change, RunOptions
    from orchestrator.engines.base import Ready
    from orchestrator.engines.verify import WaitReady

    monkeypatch.setattr(progress, "HEARTBEAT_SECONDS", 0.0)
    said: list[str] = []
    beat = threading.Event()

    def note(line: str) -> None:
        said.append(line)
        if "waiting" in line:
            beat.set()

    def wait(transports: Any, timeout: float, say: Any) -> Ready:
        say("[  0.5s] loading (/health 503)")
        assert beat.wait(30), said  # silent until the heartbeat spoke
        return Ready(models=["m"], seconds=1.0)

    inv = inventory()
    ctx = context(inv, "spark-a", {"spark-a": {}},
                  options=RunOptions(command="launch", progress_note=note))
    message = WaitReady(wait, 60, "vLLM").apply(ctx, Change("verify"))
    assert message is not None and message.startswith("answering: m")
    assert said[0] == "[  0.5s] loading (/health 503)"
    assert any("… vLLM on spark-a to answer: waiting, " in line for line in said)
