"""remote/keeper.py and keeper_process.py against test_connect's real paramiko SSH server: a
kept connection carries a run's commands (same exit status, stdout, stderr, stdin) with no new
SSH connection; a dead one, a changed file and keeping turned off all connect directly; the
keeper process a run starts when it ends holds the route, and `sparkctl disconnect` ends it."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_connect import SSHServer, setup

from orchestrator.cli import cli
from orchestrator.errors import TransportError
from orchestrator.remote import connect, keeper, keeper_process, sshkeys
from orchestrator.remote.sshconfig import Route, resolve
from orchestrator.remote.transport import SSHTransport, SudoPassword


@pytest.fixture(autouse=True)
def keeping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path) -> Iterator[None]:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setattr(sshkeys, "KEYS", sshkeys.KeyStore(prompt=False))
    monkeypatch.setenv(keeper.PERSIST_ENV, "30")
    monkeypatch.setattr(keeper, "_asked", {})  # (one run: a fresh question per test)
    monkeypatch.setattr(keeper, "_to_keep", {})
    yield
    keeper.stop()


@pytest.fixture
def server() -> Iterator[SSHServer]:
    s = SSHServer()
    yield s
    s.close()


class InProcessKeeper:
    """The keeper's own loop, in a thread of the test."""

    def __init__(self) -> None:
        folder = keeper.directory()
        folder.mkdir(parents=True)
        listening = keeper_process.listen(folder)
        assert listening is not None
        self.me = keeper_process.Keeper(folder, 30)
        self.lock_fd = listening[1]
        self.thread = threading.Thread(target=self.me.loop, args=(listening[0],), daemon=True)
        self.thread.start()

    def hold(self, route: Route) -> None:
        self.me.keep([route.record()])
        assert self.me.have([keeper.route_key(route)], 10) == [keeper.route_key(route)]

    def close(self) -> None:
        self.me.stopping.set()
        self.thread.join(5)
        os.close(self.lock_fd)


@pytest.fixture
def kept() -> Iterator[InProcessKeeper]:
    k = InProcessKeeper()
    yield k
    k.close()


def route_of(tmp_path: Path, server: SSHServer) -> Route:
    inv, _ = setup(tmp_path, server.port, known=server.host_key)
    return resolve(inv, inv.node("spark-a"))


def connect_one(route: Route) -> Any:
    transports, errors = connect.connect_routes([route], 30, SudoPassword(prompt=False))
    assert not errors, errors
    return transports["spark-a"]


def through_keeper(tmp_path: Path, server: SSHServer, kept: InProcessKeeper) -> Any:
    """A run's transport to the server, the keeper holding the route."""
    route = route_of(tmp_path, server)
    kept.hold(route)
    return connect_one(route)


def reboot(server: SSHServer) -> None:
    """Every connection the server holds ends (as when the node reboots)."""
    for ssh in server.transports:
        ssh.close()
    time.sleep(0.2)


def test_a_kept_connection_carries_the_run_without_a_new_ssh_connection(
        tmp_path: Path, server: SSHServer, kept: InProcessKeeper) -> None:
    route = route_of(tmp_path, server)
    kept.hold(route)
    assert server.connections == 1  # the keeper's
    transport = connect_one(route)
    assert isinstance(transport, keeper.KeptTransport)
    result = transport.run("cat exit 3", stdin=b"the input\n")
    assert (result.exit_status, result.stdout, result.stderr) == (
        3, "ran: cat exit 3\nthe input\n", "on stderr\n")
    assert transport.run("true").ok
    assert server.connections == 1 and keeper._to_keep == {}
    transport.close()


def test_a_connection_that_died_is_replaced_by_a_direct_one(
        tmp_path: Path, server: SSHServer, kept: InProcessKeeper) -> None:
    transport = through_keeper(tmp_path, server, kept)
    reboot(server)
    result = transport.run("echo after exit 0", stdin=b"x")
    assert result.ok and result.stdout == "ran: echo after exit 0\nx"
    assert server.connections == 2  # the run's own, opened when the keeper could not
    assert kept.me.kept == {}  # dropped
    transport.close()


def test_a_kept_connection_lost_mid_run_stops_the_run_as_its_own_would(
        tmp_path: Path, server: SSHServer, kept: InProcessKeeper) -> None:
    transport = through_keeper(tmp_path, server, kept)
    assert transport.run("first").ok  # the run's connection is the kept one from here on
    reboot(server)
    with pytest.raises(TransportError, match="spark-a: the SSH connection was lost"):
        transport.run("second")
    assert server.connections == 1  # never silently connected again mid-run
    transport.close()


def test_a_changed_known_hosts_file_is_connected_to_afresh(
        tmp_path: Path, server: SSHServer, kept: InProcessKeeper) -> None:
    route = route_of(tmp_path, server)
    kept.hold(route)
    known = route.pinned
    known.write_text(known.read_text() + "# edited\n")
    transport = connect_one(route)
    assert isinstance(transport, SSHTransport) and server.connections == 2
    assert list(keeper._to_keep) == ["spark-a"]  # the keeper gets it at the run's end
    transport.close()


def test_keeping_turned_off_never_asks_the_keeper(
        tmp_path: Path, server: SSHServer, kept: InProcessKeeper,
        monkeypatch: pytest.MonkeyPatch) -> None:
    route = route_of(tmp_path, server)
    kept.hold(route)
    monkeypatch.setenv(keeper.PERSIST_ENV, "0")
    transport = connect_one(route)
    assert isinstance(transport, SSHTransport) and keeper._to_keep == {}
    transport.close()


def test_streams_and_forwards_get_a_direct_connection_of_their_own(
        tmp_path: Path, server: SSHServer, kept: InProcessKeeper) -> None:
    transport = through_keeper(tmp_path, server, kept)
    assert transport.client.get_transport().is_active()
    assert server.connections == 2
    assert transport.run("true").ok and server.connections == 2  # (direct from now on)
    transport.close()


def test_a_run_ending_starts_a_keeper_that_holds_its_routes_until_disconnect(
        tmp_path: Path, server: SSHServer) -> None:
    route = route_of(tmp_path, server)
    direct = connect_one(route)
    assert isinstance(direct, SSHTransport)
    direct.close()
    keeper.hand_over()  # (what the run's exit does)
    deadline, status = time.monotonic() + 20, None
    while time.monotonic() < deadline:
        status = keeper.status()
        if status and status["nodes"] == ["spark-a"]:
            break
        time.sleep(0.2)
    assert status is not None and status["nodes"] == ["spark-a"], status
    pid = int(status["pid"])
    assert (keeper.directory() / "keeper.pid").read_text().strip() == str(pid)
    assert oct(keeper.directory().stat().st_mode & 0o777) == "0o700"
    keeper._asked.clear()
    again = connect_one(route)
    assert isinstance(again, keeper.KeptTransport) and again.run("true").ok
    assert server.connections == 2  # the run's, then the keeper's: none for the second run
    out = CliRunner().invoke(cli, ["disconnect", "--json"])
    assert out.exit_code == 0 and json.loads(out.output)["closed"] == ["spark-a"], out.output
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}") or "zombie" in Path(f"/proc/{pid}/status").read_text()
    assert "no connections were kept" in CliRunner().invoke(cli, ["disconnect"]).output
    log = (keeper.directory() / "keeper.log").read_text()
    assert "spark-a: connected" in log and "stopped" in log


def test_a_second_keeper_hands_its_routes_to_the_first(tmp_path: Path, server: SSHServer,
                                                       kept: InProcessKeeper) -> None:
    assert keeper_process.listen(keeper.directory()) is None  # the folder is held
    route = route_of(tmp_path, server)
    keeper.remember(route)
    keeper.hand_over()  # a keeper answers: it takes the route, nothing is started
    assert kept.me.have([keeper.route_key(route)], 10) == [keeper.route_key(route)]
    assert keeper.status() == {"pid": os.getpid(), "nodes": ["spark-a"], "seconds": 30.0}


@pytest.mark.parametrize(("value", "seconds"), [("", 60.0), ("0", 0.0), ("off", 0.0),
                                                ("120", 120.0), ("soon", 60.0)])
def test_persist_seconds_reads_the_environment(value: str, seconds: float,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(keeper.PERSIST_ENV, value)
    assert keeper.persist_seconds() == seconds
