"""remote/stream.py: streams over a local process (the controller is the node) and over an SSH
session channel (a fake paramiko channel), and stream_run's line splitting, tail and timeout."""

from __future__ import annotations

import io
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import SparkctlError
from orchestrator.remote.stream import Stream, stream_run
from orchestrator.remote.transport import LocalTransport, SudoPassword


def local() -> LocalTransport:
    return LocalTransport("spark-a", "nvidia", SudoPassword(prompt=False), default_timeout=10)


class FakeChannel:
    """paramiko.Channel as stream.py uses it: output in chunks, then an exit status. `fileno` is a
    pipe kept readable, so select() never waits."""

    def __init__(self, chunks: list[bytes], status: int = 0, finishes: bool = True) -> None:
        self.chunks = list(chunks)
        self.output = b"".join(chunks)
        self.status = status
        self.finishes = finishes
        self.events: list[Any] = []
        self.closed = False
        self._r, self._w = os.pipe()
        os.write(self._w, b"x")

    def fileno(self) -> int:
        return self._r

    def set_combine_stderr(self, combine: bool) -> None:
        self.events.append(("combine", combine))

    def get_pty(self, term: str, width: int) -> None:
        self.events.append(("pty", term, width))

    def exec_command(self, command: str) -> None:
        self.events.append(("exec", command))

    def sendall(self, data: bytes) -> None:
        self.events.append(("stdin", len(data)))

    def shutdown_write(self) -> None:
        self.events.append("eof")

    def makefile(self, mode: str) -> io.BytesIO:
        return io.BytesIO(self.output)

    def recv_ready(self) -> bool:
        return bool(self.chunks)

    def recv(self, size: int) -> bytes:
        return self.chunks.pop(0)

    def exit_status_ready(self) -> bool:
        return self.finishes and not self.chunks

    def recv_exit_status(self) -> int:
        return self.status

    def close(self) -> None:
        self.closed = True
        os.close(self._r)
        os.close(self._w)


class FakeSSH:
    def __init__(self, channel: FakeChannel) -> None:
        self.channel = channel

    def open_session(self) -> FakeChannel:
        return self.channel


class SSHNode:
    """An SSH transport as far as stream.py looks: `client.get_transport()` and `node`."""

    node = "spark-b"

    def __init__(self, channel: FakeChannel) -> None:
        ssh = FakeSSH(channel)
        self.client = type("Client", (), {"get_transport": lambda _self: ssh})()


def test_a_local_stream_reads_lines_and_close_ends_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    stream = Stream(local(), f"echo one; echo two >&2; sleep 30 & echo $! > {pidfile}; wait",
                    terminal=False)
    lines = stream.lines()
    assert next(lines) == "one\n" and next(lines) == "two\n"  # stderr merged into the stream
    for _ in range(100):
        if pidfile.exists() and pidfile.read_text().strip():
            break
        time.sleep(0.02)
    child = int(pidfile.read_text())

    stream.close()

    assert stream.closed.is_set()
    assert stream._process is not None and stream._process.returncode == -15
    for _ in range(100):  # the backgrounded sleep went with its group
        try:
            state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            break
        if state in ("Z", "X"):
            break
        time.sleep(0.02)
    else:
        pytest.fail(f"the stream's child {child} survived close()")
    assert list(lines) == []
    stream.close()  # closing twice is harmless


def test_close_kills_a_local_command_that_ignores_sigterm(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = Stream(local(), "trap '' TERM; echo ready; while :; do sleep 0.1; done", terminal=False)
    assert next(stream.lines()) == "ready\n"
    process = stream._process
    assert process is not None
    real_wait = process.wait

    def impatient(timeout: float | None = None) -> int:
        if timeout == 5:  # the grace close() gives: don't wait 5 s in a unit test
            real_wait(timeout=0.3)
        return real_wait(timeout=timeout)
    monkeypatch.setattr(process, "wait", impatient)

    stream.close()

    assert process.wait(5) == -9


def test_a_stream_over_ssh_uses_a_session_channel() -> None:
    channel = FakeChannel([b"a\nb\xff\n"])
    stream = Stream(SSHNode(channel), "journalctl -f", terminal=True)  # type: ignore[arg-type]

    assert list(stream.lines()) == ["a\n", "b\ufffd\n"]
    assert channel.events == [("combine", True), ("pty", "dumb", 500), ("exec", "journalctl -f")]
    stream.close()
    assert channel.closed

    quiet = FakeChannel([])
    Stream(SSHNode(quiet), "cat log", terminal=False)  # type: ignore[arg-type]
    assert quiet.events == [("combine", True), ("exec", "cat log")]


def test_a_read_error_ends_the_lines_quietly_only_after_close() -> None:
    class Broken(io.BytesIO):
        def readline(self, *args: Any) -> bytes:
            raise OSError("socket closed")

    channel = FakeChannel([])
    stream = Stream(SSHNode(channel), "x", terminal=False)  # type: ignore[arg-type]
    stream._reader = Broken()
    with pytest.raises(OSError, match="socket closed"):
        list(stream.lines())
    stream.close()
    assert list(stream.lines()) == []


def test_stream_run_locally_runs_once_and_hands_over_the_last_lines() -> None:
    seen: list[str] = []
    status, err = stream_run(local(), "for i in 1 2 3 4 5 6; do echo line$i; done; echo oops >&2; exit 4",
                             seen.append, timeout=10, display="download")
    assert status == 4 and err == "oops\n"
    assert seen == ["line3", "line4", "line5", "line6", "oops"]


def test_stream_run_over_ssh_splits_progress_and_keeps_a_tail() -> None:
    channel = FakeChannel([b"Downloading 10%\r", b"Downloading 50%\rDownl", b"oading 100%\n\n  \nDone\n",
                           b"partial"], status=3)
    seen: list[str] = []

    status, tail = stream_run(SSHNode(channel), "hf download", seen.append,  # type: ignore[arg-type]
                              timeout=30, display="download")

    assert status == 3
    assert seen == ["Downloading 10%", "Downloading 50%", "Downloading 100%", "Done"]
    assert tail == "\nDownloading 10%\nDownloading 50%\nDownloading 100%\nDone\npartial"  # no blanks
    assert channel.events == [("combine", True), ("exec", "hf download"), "eof"]
    assert channel.closed


def test_stream_run_over_ssh_is_one_traced_command_and_never_its_stdin(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SPARKCTL_TRACE counts every round trip (the benchmarks' cmds/node): a streamed `docker
    pull` was missing from it, and from the floor's replay, which then had no image."""
    import json

    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("SPARKCTL_TRACE", str(trace))
    channel = FakeChannel([b"pulled\n"], status=0)
    stream_run(SSHNode(channel), "sudo -S -p '' -- docker pull x", lambda line: None,  # type: ignore[arg-type]
               timeout=30, display="docker pull x", stdin=b"sudo-secret\n")
    (record,) = [json.loads(line) for line in trace.read_text().splitlines()]
    assert record["event"] == "command" and record["node"] == "spark-b"
    assert record["command"] == "docker pull x" and record["exit"] == 0 and record["sudo"] is True
    assert record["stdin_bytes"] == 12 and "sudo-secret" not in trace.read_text()


def test_stream_run_over_ssh_times_out() -> None:
    channel = FakeChannel([b"still going\n"], finishes=False)
    seen: list[str] = []
    with pytest.raises(SparkctlError, match=r"spark-b: `download` did not finish in 0s"):
        stream_run(SSHNode(channel), "hf download", seen.append,  # type: ignore[arg-type]
                   timeout=0.2, display="download")
    assert seen == ["still going"] and channel.closed


def test_subprocess_is_what_runs_local_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[list[str]] = []
    real = subprocess.Popen

    def spy(argv: list[str], **kwargs: Any) -> Any:
        started.append(argv)
        assert kwargs["start_new_session"] is True and kwargs["stderr"] == subprocess.STDOUT
        return real(argv, **kwargs)
    monkeypatch.setattr(subprocess, "Popen", spy)
    stream = Stream(local(), "echo hi", terminal=True)
    assert list(stream.lines()) == ["hi\n"]
    stream.close()
    assert started == [["sh", "-c", "echo hi"]]


def test_a_remote_process_started_without_stdin_waits_for_feed() -> None:
    """The fan-out starts its sender before the receiver is ready: the process runs, reads
    nothing until `feed`, then gets the whole text and EOF (and never sees it in argv)."""
    from orchestrator.remote.pipe import RemoteProcess

    proc = RemoteProcess(local(), "echo started; cat; echo done", display="cat <job>")
    assert proc.readline() == "started\n"  # running already, its stdin still open
    proc.feed('{"token": "secret"}\n')
    assert proc.readline() == '{"token": "secret"}\n' and proc.readline() == "done\n"
    assert proc.wait(timeout=10) == 0
    proc.close()


def test_a_remote_process_over_ssh_writes_stdin_only_when_fed() -> None:
    from orchestrator.remote.pipe import RemoteProcess

    class Channel(FakeChannel):
        def sendall(self, data: bytes) -> None:
            self.events.append(("stdin", data))

        def makefile_stderr(self, mode: str) -> io.BytesIO:
            return io.BytesIO(b"")

    channel = Channel([b"ok\n"])
    proc = RemoteProcess(SSHNode(channel), "python3 -c <send>", display="send")  # type: ignore[arg-type]
    assert channel.events == [("exec", "python3 -c <send>")]  # nothing written yet
    proc.feed("job")
    assert channel.events[1:] == [("stdin", b"job"), "eof"]
    assert proc.readline() == "ok\n"


def test_stdin_fed_but_left_open_ends_when_the_process_is_closed() -> None:
    """The fan-out's node scripts get one line and watch the rest of stdin: it must stay open
    after feed(close=False), and end (EOF) when the controller closes the process."""
    from orchestrator.remote.pipe import RemoteProcess

    class Channel(FakeChannel):
        def sendall(self, data: bytes) -> None:
            self.events.append(("stdin", data))

        def makefile_stderr(self, mode: str) -> io.BytesIO:
            return io.BytesIO(b"")

    channel = Channel([])
    proc = RemoteProcess(SSHNode(channel), "recv", display="recv")  # type: ignore[arg-type]
    proc.feed("plan\n", close=False)
    assert channel.events == [("exec", "recv"), ("stdin", b"plan\n")]  # no EOF yet
    assert not channel.closed
    proc.close()  # over SSH: the channel closes, and sshd ends the command's stdin
    assert channel.closed
    # locally: the process (e.g. the `docker exec` client, whose end is the script's EOF)
    # waits on its open stdin until close() ends it
    local_proc = RemoteProcess(local(), "read line; echo got $line; cat", display="watch")
    local_proc.feed("plan\n", close=False)
    assert local_proc.readline() == "got plan\n"
    assert local_proc.wait(timeout=0.3) == -1  # still running: stdin is open
    local_proc.close()
    assert local_proc.wait(timeout=5) != -1
