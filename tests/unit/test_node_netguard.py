"""orchestrator/node/netguard.py, the netplan rollback guard, in-process: its state folder and the
netplan file moved into a tmp dir, and `netplan`/`ip`/`ping` answered by a fake `run` (the
machine's network is never touched). The detached guard process becomes a thread."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from nodescript import run_node_script


class Guard:
    """The loaded script's namespace plus its moved paths and the commands it ran."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("PATH", os.environ.get("PATH", "/usr/bin:/bin"))  # the script appends sbin
        self.base = tmp_path / "state"
        self.netplan = tmp_path / "etc" / "40-sparkctl-fabric.yaml"
        self.netplan.parent.mkdir()
        ran = run_node_script("netguard.py", ["no-such-mode"], monkeypatch, replace={
            '"/var/lib/sparkctl"': repr(str(self.base)),
            '"/etc/netplan/40-sparkctl-fabric.yaml"': repr(str(self.netplan)),
        })
        self.loaded = ran
        self.ns = ran.namespace
        self.state = self.base / "netguard"
        self.calls: list[list[str]] = []
        self.answers: dict[str, Any] = {}  # argv[0] -> (rc, out, err) or fn(argv)
        self.real_run = self.ns["run"]
        self.ns["run"] = self.fake_run
        self.monkeypatch = monkeypatch

    def fake_run(self, argv: list[str], timeout: float = 120) -> tuple[int, str, str]:
        self.calls.append(list(argv))
        answer = self.answers.get(argv[0], (0, "", ""))
        return answer(argv) if callable(answer) else answer  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return self.ns[name]

    def call(self, name: str, *args: Any) -> tuple[Any, Any]:
        """NAME(*args) with stdout captured: (return value, the last JSON line printed or None)."""
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            value = self.ns[name](*args)
        lines = out.getvalue().strip().splitlines()
        return value, (json.loads(lines[-1]) if lines else None)

    def main(self, *argv: str) -> tuple[Any, Any]:
        self.monkeypatch.setattr(sys, "argv", ["netguard.py", *argv])
        return self.call("main")

    def write(self, name: str, text: str = "") -> None:
        (self.state / name).write_text(text)

    def ours(self, text: str) -> None:
        """The netplan file as sparkctl wrote it: on disk and in the ledger (node/ledger.py)."""
        self.netplan.write_text(text)
        self.base.mkdir(exist_ok=True)
        Path(self.LEDGER).write_text(json.dumps({str(self.netplan): {
            "sha256": hashlib.sha256(text.encode()).hexdigest(), "before": {"kind": "absent"}}}))

    def ledger(self) -> Any:
        return json.loads(Path(self.LEDGER).read_text())

    def result(self) -> Any:
        return json.loads((self.state / "result.json").read_text())

    def spawn_guard(self) -> Callable[..., Any]:
        """A Popen that runs guard() in a thread instead of a detached process."""
        self.threads: list[threading.Thread] = []

        def popen(argv: list[str], **kwargs: Any) -> None:
            assert argv[1:] == [self.ns["__file__"], "guard"]
            assert kwargs["start_new_session"] is True
            thread = threading.Thread(target=self.ns["guard"], daemon=True)
            self.threads.append(thread)
            thread.start()
        return popen


@pytest.fixture
def guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Guard:
    return Guard(tmp_path, monkeypatch)


def fake_subprocess(popen: Callable[..., Any]) -> types.SimpleNamespace:
    return types.SimpleNamespace(Popen=popen, DEVNULL=subprocess.DEVNULL)


def test_unknown_mode_exits_2_after_making_its_state_folder(guard: Guard) -> None:
    assert guard.loaded.code == 2
    assert "unknown mode 'no-such-mode'" in guard.loaded.stderr
    assert guard.state.is_dir() and (guard.state.stat().st_mode & 0o777) == 0o700
    assert guard.ns["NETPLAN_FILE"] == str(guard.netplan)
    assert guard.ns["BACKUP"] == str(guard.base / "netplan-backup.yaml")
    assert os.environ["PATH"].endswith(":/usr/local/sbin:/usr/sbin:/sbin")


def test_run_reports_exit_output_and_failures_to_start(guard: Guard) -> None:
    run = guard.real_run
    assert run(["sh", "-c", "echo out; echo err >&2; exit 3"]) == (3, "out\n", "err\n")
    rc, out, err = run(["/no/such/tool"])
    assert (rc, out) == (127, "") and "/no/such/tool" in err
    rc, _, err = run(["sleep", "5"], timeout=0.1)
    assert rc == 127 and "timed out" in err


def test_json_helpers_and_decide_happen_once(guard: Guard, tmp_path: Path) -> None:
    target = str(tmp_path / "x.json")
    guard.write_json(target, {"a": 1})
    assert guard.read_json(target) == {"a": 1} and not os.path.exists(target + ".tmp")
    Path(target).write_text("{broken")
    assert guard.read_json(target) is None
    assert guard.read_json(str(tmp_path / "missing.json")) is None
    assert guard.decide() is True
    assert guard.decide() is False  # whoever decides first wins, never both
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    guard.remove(str(folder))
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "nowhere")
    guard.remove(str(link))
    guard.remove(str(tmp_path / "never-existed"))
    assert not folder.exists() and not os.path.lexists(link)


def test_rollback_restores_the_backup_and_undoes_addresses_and_mtus(guard: Guard) -> None:
    guard.ours("new: config\n")
    Path(guard.BACKUP).write_text("old: config\n")
    guard.answers["netplan"] = (1, "", "x" * 600 + "tail")
    cfg = {"added": [["enp1s0f1np1", "192.168.200.12/24"]],
           "previous_mtu": {"enp1s0f1np1": 1500, "enP2p1s0f1np1": None}}

    result = guard.rollback(cfg, "because")

    assert guard.netplan.read_text() == "old: config\n"
    assert (guard.netplan.stat().st_mode & 0o777) == 0o600
    assert guard.calls == [["netplan", "apply"],
                           ["ip", "addr", "del", "192.168.200.12/24", "dev", "enp1s0f1np1"],
                           ["ip", "link", "set", "dev", "enp1s0f1np1", "mtu", "1500"]]
    assert result["reason"] == "because" and result["restored"] == "restored the previous netplan file"
    assert result["apply_rc"] == 1
    assert len(result["apply_err"]) == 500 and result["apply_err"].endswith("tail")
    assert json.loads(Path(guard.ROLLED_BACK).read_text()) == result == guard.result()
    # the ledger now holds what is on disk: the restored file stays sparkctl's to manage
    assert guard.ledger()[str(guard.netplan)]["sha256"] == hashlib.sha256(b"old: config\n").hexdigest()

    # a file changed since sparkctl wrote it is never restored over
    guard.netplan.write_text("edited by hand\n")
    result = guard.rollback({}, "again")
    assert guard.netplan.read_text() == "edited by hand\n"
    assert result["restored"].startswith(f"left alone: {guard.netplan} is not the file sparkctl wrote")


def test_rollback_removes_a_file_that_was_not_there_before(guard: Guard) -> None:
    guard.ours("new: config\n")
    Path(guard.ABSENT).write_text("")
    result = guard.rollback({}, "r")
    assert not guard.netplan.exists()
    assert result["restored"] == "removed the sparkctl netplan file (there was none before)"
    assert guard.calls == [["netplan", "apply"]]
    assert guard.ledger() == {}  # nothing of sparkctl's stands there any more

    # not sparkctl's file (no ledger entry): left alone even with the marker
    guard.netplan.write_text("the user's own\n")
    assert guard.rollback({}, "r")["restored"].startswith("left alone:")
    assert guard.netplan.read_text() == "the user's own\n"

    os.unlink(guard.ABSENT)
    guard.ours("new: config\n")
    assert guard.rollback({}, "r")["restored"] == "no backup to restore"
    assert guard.netplan.read_text() == "new: config\n"


def test_guard_rolls_back_when_no_confirmation_comes_in_time(guard: Guard) -> None:
    guard.ours("new\n")
    Path(guard.BACKUP).write_text("old\n")
    guard.write_json(str(guard.state / "armed.json"), {"seconds": 0.3, "added": [["eth9", "10.0.0.1/24"]]})

    started = time.time()
    assert guard.guard() == 0

    assert 0.3 <= time.time() - started < 5
    assert (guard.state / "guard.pid").read_text() == f"{os.getpid()}\n"
    assert (guard.state / "ready").exists() and (guard.state / "decided").is_dir()
    assert guard.result()["reason"].startswith("no confirmation from the controller within 0.3s")
    assert guard.result()["restored"] == "restored the previous netplan file"
    assert guard.netplan.read_text() == "old\n"
    assert ["ip", "addr", "del", "10.0.0.1/24", "dev", "eth9"] in guard.calls


def test_guard_stands_down_on_confirmation_and_obeys_an_abort(guard: Guard) -> None:
    guard.write("confirmed")
    assert guard.guard() == 0
    assert guard.calls == [] and not (guard.state / "result.json").exists()

    os.unlink(guard.state / "confirmed")
    guard.write("abort", "")
    assert guard.guard() == 0
    assert guard.result()["reason"] == "rollback requested"

    # asked again after the decision was made: nothing more happens
    os.unlink(guard.state / "result.json")
    guard.write("abort", "peer unreachable")
    assert guard.guard() == 0
    assert not (guard.state / "result.json").exists()


def test_the_running_guard_is_recognised_by_its_command_line_and_stopped(guard: Guard) -> None:
    assert guard.guard_alive() is None  # no pid file
    guard.write("guard.pid", "garbage\n")
    assert guard.guard_alive() is None

    other = subprocess.Popen(["sleep", "30"])
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "netguard.py", "guard"])
    try:
        guard.write("guard.pid", f"{other.pid}\n")
        assert guard.guard_alive() is None  # a live PID, but not the guard's (a reused PID)
        guard.write("guard.pid", f"{proc.pid}\n")
        for _ in range(100):
            if guard.guard_alive() is not None:
                break
            time.sleep(0.02)
        assert guard.guard_alive() == proc.pid
        guard.stop_old_guard()
        assert proc.wait(5) == -15
        assert guard.guard_alive() is None
    finally:
        for started in (other, proc):
            if started.poll() is None:
                started.kill()
            started.wait(5)


def test_arm_then_confirm(guard: Guard) -> None:
    guard.write("decided")  # left over from the last apply: arm clears it
    guard.write("result.json", "{}")
    guard.ns["subprocess"] = fake_subprocess(guard.spawn_guard())
    cfg = {"seconds": 30, "added": [], "previous_mtu": {}}

    code, printed = guard.main("arm", json.dumps(cfg))

    assert (code, printed) == (0, {"applied": True, "seconds": 30})
    assert guard.calls == [["netplan", "apply"]]
    assert json.loads((guard.state / "armed.json").read_text()) == cfg
    assert not (guard.state / "decided").exists() and not (guard.state / "result.json").exists()
    Path(guard.ROLLED_BACK).write_text("{}")  # an earlier rollback, cleared by the confirmation

    guard.answers["ping"] = (0, "", "")
    checks = [{"interface": "enp1s0f1np1", "peer": "spark-b", "address": "192.168.200.13"}]
    code, printed = guard.main("confirm", json.dumps({"checks": checks, "sha": "abc", "seconds": 5}))

    assert (code, printed) == (0, {"outcome": "confirmed"})
    assert ["ping", "-c1", "-W1", "-I", "enp1s0f1np1", "192.168.200.13"] in guard.calls
    assert Path(guard.CONFIRMED_SHA).read_text() == "abc\n"
    assert not os.path.exists(guard.ROLLED_BACK)
    guard.threads[0].join(5)
    assert not guard.threads[0].is_alive()
    assert not (guard.state / "result.json").exists()  # the guard stood down


def test_arm_rolls_back_when_netplan_apply_fails(guard: Guard) -> None:
    Path(guard.ABSENT).write_text("")
    guard.ours("new\n")
    guard.ns["subprocess"] = fake_subprocess(lambda argv, **kw: (guard.state / "ready").write_text(""))
    guard.answers["netplan"] = (1, "", "Traceback ...\n  raise\nError: bad yaml\n")

    code, printed = guard.call("arm", {"seconds": 30})

    assert code == 1
    assert printed["applied"] is False and printed["error"] == "netplan apply exited 1"
    assert printed["rollback"]["reason"] == "netplan apply failed (exit 1): Error: bad yaml"
    assert printed["rollback"]["restored"] == "removed the sparkctl netplan file (there was none before)"
    assert not guard.netplan.exists()
    assert (guard.state / "abort").read_text() == "netplan apply failed (exit 1): Error: bad yaml"

    guard.answers["netplan"] = (2, "", "")
    os.rmdir(guard.state / "decided")
    _, printed = guard.call("arm", {})
    assert printed["rollback"]["reason"] == "netplan apply failed (exit 2): no output"


def test_arm_gives_up_when_the_guard_does_not_start(guard: Guard) -> None:
    guard.ns["subprocess"] = fake_subprocess(lambda argv, **kw: None)
    guard.ns["time"] = types.SimpleNamespace(time=time.time, sleep=lambda seconds: None)
    code, printed = guard.call("arm", {})
    assert code == 1 and printed == {"applied": False, "error": "the rollback guard did not start"}
    assert guard.calls == []  # netplan apply never ran


def test_confirm_rolls_back_when_a_peer_does_not_answer(guard: Guard) -> None:
    Path(guard.BACKUP).write_text("old\n")
    tries: dict[str, int] = {}

    def ping(argv: list[str]) -> tuple[int, str, str]:
        tries[argv[-1]] = tries.get(argv[-1], 0) + 1
        if argv[-1] == "192.168.200.13":  # answers on the second try
            return (0 if tries[argv[-1]] > 1 else 1), "", ""
        return 1, "", ""
    guard.answers["ping"] = ping
    checks = [{"interface": "enp1s0f1np1", "peer": "spark-b", "address": "192.168.200.13"},
              {"interface": "enP2p1s0f1np1", "peer": "spark-c", "address": "192.168.201.14"}]

    code, printed = guard.main("confirm", json.dumps({"checks": checks, "sha": "abc", "seconds": 0.5}))

    assert code == 1 and printed["outcome"] == "rolled-back"
    assert printed["failures"] == [checks[1]]
    reason = "spark-c unreachable at 192.168.201.14 on enP2p1s0f1np1"
    assert printed["rollback"]["reason"] == reason == guard.result()["reason"]
    assert tries["192.168.200.13"] == 2 and tries["192.168.201.14"] >= 2
    assert guard.netplan.read_text() == "old\n"
    assert not os.path.exists(guard.CONFIRMED_SHA)


def test_a_confirmation_after_the_rollback_is_late(guard: Guard) -> None:
    guard.write("decided")
    guard.write("result.json", json.dumps({"reason": "timeout"}))
    code, printed = guard.main("confirm", json.dumps({"checks": []}))
    assert code == 1 and printed == {"outcome": "late", "rollback": {"reason": "timeout"}}
    assert not (guard.state / "confirmed").exists()


def test_abort_mode_and_waiting_for_a_live_guard(guard: Guard) -> None:
    code, printed = guard.main("abort", json.dumps({"reason": "operator said so"}))
    assert code == 0 and printed["outcome"] == "rolled-back"
    assert printed["rollback"]["reason"] == "operator said so"

    # a live guard decides: abort waits for its result
    os.rmdir(guard.state / "decided")
    os.unlink(guard.state / "result.json")
    guard.ns["guard_alive"] = lambda: 4242
    timer = threading.Timer(0.3, lambda: guard.write_json(str(guard.state / "result.json"), {"reason": "g"}))
    timer.start()
    assert guard.abort("x") == {"reason": "g"}
    timer.join()

    # the guard dies without a result
    os.unlink(guard.state / "result.json")
    alive: Iterator[int | None] = iter([4242, None])
    guard.ns["guard_alive"] = lambda: next(alive)
    assert guard.abort("y", wait=5) == {"reason": "y", "restored": "unknown (guard gone)"}

    # and the wait has an end
    guard.ns["guard_alive"] = lambda: 4242
    assert guard.abort("z", wait=0.1) == {"reason": "z", "restored": "unknown (guard gone)"}
    assert guard.calls == [["netplan", "apply"]]  # only the first abort rolled back itself


def test_guard_mode_through_main(guard: Guard) -> None:
    guard.write("confirmed")
    assert guard.main("guard") == (0, None)
