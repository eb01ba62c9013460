"""Benchmark helpers: medians, targets, tables, trace summaries, floor scripts (no timing)."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest

from benchmarks import floor, tracing
from benchmarks.stats import Measurement, Target, median, results_table, targets_table
from orchestrator.remote import transport


def test_median_ignores_failed_runs() -> None:
    assert median([3.0, None, 1.0, 2.0]) == 2.0
    assert median([None, None]) is None
    assert median([]) is None


def test_round_trips_are_commands_plus_connections() -> None:
    row = Measurement("up", runs=[1.0], connections=2, commands=17)
    assert row.round_trips == 19
    assert Measurement("x").round_trips is None


def rows(**values: float | None) -> dict[str, Measurement]:
    return {name: Measurement(name, runs=[v]) for name, v in values.items()}


@pytest.mark.parametrize(("value", "status"), [(0.9, "pass"), (1.0, "pass"), (1.1, "miss")])
def test_absolute_target(value: float, status: str) -> None:
    assert Target("t", "a", 1.0).evaluate(rows(a=value))[0] == status


def test_relative_target_scales_the_other_row() -> None:
    target = Target("t", "cold", 1.5, relative_to="floor")
    assert target.evaluate(rows(cold=5.9, floor=4.0)) == ("pass", 5.9, 6.0)
    assert target.evaluate(rows(cold=6.1, floor=4.0))[0] == "miss"
    assert target.evaluate(rows(cold=6.1))[0] == "n/a"


def test_at_least_target() -> None:
    target = Target("t", "copy", 0.7, relative_to="raw", at_least=True)
    assert target.evaluate(rows(copy=80.0, raw=100.0))[0] == "pass"
    assert target.evaluate(rows(copy=60.0, raw=100.0))[0] == "miss"


def test_tables_show_values_and_verdicts() -> None:
    data = {"up": Measurement("up", runs=[0.5, 0.7, 0.6], connections=1, commands=8)}
    text = results_table(list(data.values()))
    assert "| up " in text and "0.600 s" in text and "| 9 " in text
    verdicts = targets_table([Target("fast up", "up", 0.55), Target("gone", "nope", 1.0)], data)
    assert "MISS" in verdicts and "N/A" in verdicts


def test_union_counts_overlaps_once() -> None:
    assert tracing.union_seconds([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0)]) == 3.0
    assert tracing.union_seconds([]) == 0.0


def test_summary_counts_per_node() -> None:
    records = [
        {"event": "connect", "node": "a", "start": 0.0, "end": 0.1},
        {"event": "command", "node": "a", "start": 0.1, "end": 0.3, "command": "python3 -"},
        {"event": "command", "node": "a", "start": 0.3, "end": 0.4, "command": "tar x | ssh"},
        {"event": "connect", "node": "b", "start": 0.0, "end": 0.1},
        {"event": "connect", "node": "b", "start": 0.5, "end": 0.6},
    ]
    summary = tracing.summarize(records)
    assert summary.commands == {"a": 2, "b": 0}
    assert summary.max_connections == 2 and summary.max_commands == 2
    assert [r["command"] for r in summary.commands_matching("tar ")] == ["tar x | ssh"]
    assert summary.span_seconds == pytest.approx(0.6)


def test_trace_hook_writes_one_line_per_event(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                               ) -> None:
    path = tmp_path / "trace.jsonl"
    transport.trace_event("command", "a", 1.0, 2.0, command="x")  # unset: nothing written
    assert not path.exists()
    monkeypatch.setenv(transport.TRACE_ENV, str(path))
    local = transport.LocalTransport("a", "nobody", transport.SudoPassword(prompt=False))
    local.run("cat", stdin="a secret on stdin")
    record = json.loads(path.read_text())
    assert record["event"] == "command" and record["node"] == "a" and record["exit"] == 0
    assert record["stdin_bytes"] == len("a secret on stdin")
    assert "secret" not in path.read_text()


def test_floor_script_replays_commands_with_their_stdin(tmp_path: Path) -> None:
    capture = [
        {"command": "cat > " + str(tmp_path / "out"), "stdin": base64.b64encode(b"hello\n").decode()},
        {"command": "false", "stdin": ""},
        {"command": "cat " + str(tmp_path / "out"), "stdin": ""},
    ]
    script = floor.render_script(capture)
    proc = subprocess.run(["bash", "-s"], input=script, capture_output=True, text=True, check=False)
    assert proc.stdout == "hello\n"
    assert proc.stderr.splitlines() == ["floor-rc 0 0", "floor-rc 1 1", "floor-rc 2 0"]


def test_floor_seeds_the_recorded_host_key_and_waits_for_peers() -> None:
    keygen = {"command": f"sudo -n -- sh -c 'rm -f k && {floor.KEYGEN_MARK} -f k'", "stdin": ""}
    mpirun = {"command": "docker exec c mpirun -np 2 hostname", "stdin": ""}
    script = floor.render_script([keygen, mpirun], host_key="PRIVATE", peers=["10.0.0.2"])
    assert floor.KEYGEN_MARK not in script
    assert base64.encodebytes(b"PRIVATE").decode().strip() in script
    assert script.index("/dev/tcp/$ip/2233") < script.index("mpirun")


def test_a_phase_lasts_as_long_as_its_slowest_node() -> None:
    from benchmarks.engines import phase_seconds

    report = {"hosts": {
        "spark-a": {"steps": [{"phase": "ray", "seconds": 6.5}, {"phase": "ray", "seconds": 1.5},
                              {"phase": "serve", "seconds": 3.0}]},
        "spark-b": {"steps": [{"phase": "ray", "seconds": 4.0}]}}}
    assert phase_seconds(report, "ray") == 8.0
    assert phase_seconds(report, "serve") == 3.0
    assert phase_seconds(report, "models") is None  # (did not run)
    assert phase_seconds({}, "ray") is None


def test_the_fanout_rate_is_read_from_the_reports_figures() -> None:
    """The bench reads the launch's JSON report (`fanout`, phases/fanout.py PeerCopy.figures):
    a change in those keys must fail here, not silently empty the fan-out rows."""
    from benchmarks import fanout
    from benchmarks.labctl import Timed
    from orchestrator.phases.fanout import PeerCopy

    copy = PeerCopy("spark-b", total=810_000_000, sent=810_000_000, seconds=0.59, wire=0.56,
                    cpu_busy=0.97)
    report = {"fanout": {"spark-b": copy.figures()}}
    copied = fanout.fanout_rate(Timed(1.0, 0, report, tracing.summarize([]), ""), "spark-b")
    assert copied is not None
    assert (copied.mb, copied.seconds, copied.wire, copied.cpu_busy) == (810.0, 0.59, 0.56, 97.0)
    assert round(copied.mb_per_s) == 1373
    had = {"fanout": {"spark-b": PeerCopy("spark-b", total=810_000_000).figures()}}
    for nothing in ({}, had):  # no copy at all, or nothing to send to the peer
        assert fanout.fanout_rate(Timed(1.0, 0, nothing, tracing.summarize([]), ""), "spark-b") is None


def test_the_verified_ceiling_adds_hashing_to_what_moving_the_bytes_cost() -> None:
    from benchmarks.fanout_probe import ceiling

    # 2 CPUs 93 % busy moving 2800 MB/s unverified: 0.664 ms of CPU per MB; sha256 at 1580 MB/s
    # adds 0.633 ms: 2 CPUs then verify at most ~1542 MB/s
    assert round(ceiling(2, 2800, 93, 1580)) == 1542
    assert ceiling(2, 2800, 93, 1e12) == pytest.approx(2800 / 0.93)  # free hashing
    assert ceiling(4, 2800, 93, 1580) > ceiling(2, 2800, 93, 1580)  # hashing on more cores


def test_the_paired_ratio_cancels_a_load_that_changes_between_rounds(tmp_path: Path) -> None:
    from benchmarks.llamacpp_benchy import compare

    def result(*rates: float) -> dict[str, object]:
        return {"tg_throughput": {"values": list(rates)}}

    # the machine got 3x slower for the last two rounds, both clients alike, ours 10 % slower
    ours = [result(27.0, 27.0), result(9.0, 9.0), result(9.0, 9.0)]
    theirs = [result(30.0, 30.0), result(30.0, 30.0), result(10.0, 10.0)]
    doc = compare(ours, theirs, tmp_path, tg=64, pp=128, runs=2)
    assert doc["round_ratios"] == [0.9, 0.3, 0.9]
    assert doc["paired_ratio"] == 0.9  # pooled medians would say 9 / 30 = 0.3
    assert doc["sparkctl_tg_median"] / doc["llama_benchy_tg_median"] == 0.3
