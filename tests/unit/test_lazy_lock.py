"""Issue 40: a run that changes nothing takes no cluster lock, so a no-change `up` costs one
command per node (the facts gathering, which only looks at the lock) and no release. A run
that changes something takes the lock before its first change, only if nobody took it since
it looked (the head's lock-generation counter); a lock held by another run is still refused
before anything changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import facts_request
from test_node_gather import gather
from test_runner import Touch, touched

from orchestrator.core import runner
from orchestrator.core.lock import LOCK_DIR, ClusterLock
from orchestrator.core.step import Phase, Plan
from orchestrator.errors import LockError, SparkctlError

OTHER = {"command": "launch", "user": "bob", "controller": "laptop", "pid": 42}


def two_phases() -> Plan:
    """Two phases: the executor gathers every phase's facts up front in one round trip."""
    return Plan("up", [Phase(name, [Touch()], lambda inv, node: {"node": node.name})
                       for name in ("p1", "p2")])


def head_facts(done: bool, peek: dict[str, Any] | None = None,
               take: dict[str, Any] | None = None) -> Any:
    def answer(request: dict[str, Any]) -> dict[str, Any]:
        facts: dict[str, Any] = {"files": {"/x": {"exists": done}}}
        if "lock" in request:
            facts["lock"] = take or {"held": True}
        elif request.get("lock_peek"):
            facts["lock"] = peek or {"free": True, "generation": 7}
        return facts
    return answer


@pytest.fixture
def run(fake_cluster: Any, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    def go(done: bool, **head: Any) -> Any:
        cluster = fake_cluster(facts={"spark-a": head_facts(done, **head),
                                      "spark-b": head_facts(done)})
        monkeypatch.setattr("orchestrator.remote.connect.connect_all", cluster.connect_all)
        code = runner.execute(runner.RunRequest(command="up", inventory=cluster.inventory,
                                                build=lambda s: two_phases(), yes=True))
        return code, cluster
    return go


def lock_requests(cluster: Any, node: str = "spark-a") -> list[dict[str, Any]]:
    return [r for r in (facts_request(c) for c in cluster.commands(node)) if r and "lock" in r]


def test_a_no_change_run_costs_one_command_per_node_and_no_lock(run: Any) -> None:
    code, cluster = run(done=True)
    assert code == 0
    for node in ("spark-a", "spark-b"):
        assert len(cluster.commands(node)) == 1, cluster.commands(node)  # the facts only
    (gathering,) = [facts_request(c) for c in cluster.commands("spark-a")]
    assert gathering is not None and gathering["lock_peek"] is True and "lock" not in gathering
    assert not any(LOCK_DIR in c for c in cluster.commands())  # nothing to release


def test_a_changing_run_takes_the_lock_before_its_first_change(run: Any) -> None:
    code, cluster = run(done=False)
    assert code == 0 and set(touched(cluster)) == {"spark-a", "spark-b"}
    commands = cluster.commands("spark-a")
    take = next(i for i, c in enumerate(commands) if (facts_request(c) or {}).get("lock"))
    assert take < commands.index("touch /x")
    (owner,) = [r["lock"] for r in lock_requests(cluster)]
    assert owner["generation"] == 7  # on condition that nobody took it since the look
    assert f"rm -rf {LOCK_DIR}" in commands[-1]  # released at the end


def test_a_lock_held_by_another_run_is_refused_before_anything(run: Any) -> None:
    with pytest.raises(LockError, match="launch by bob@laptop"):
        run(done=False, peek={"free": False, "holder": OTHER, "generation": 3})


def test_a_lock_taken_by_another_run_since_the_look_changes_nothing(run: Any) -> None:
    code, cluster = run(done=False, take={"held": False, "moved": True, "generation": 8})
    assert code == 1 and touched(cluster) == []
    assert not any(f"rm -rf {LOCK_DIR}" in c for c in cluster.commands())


def test_the_head_counts_takes_and_refuses_a_stale_look(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    assert gather({"lock_peek": True}, tmp_path, monkeypatch)["lock"] == {"free": True,
                                                                          "generation": 0}
    assert gather({"lock": {"token": "t1", "generation": 0}}, tmp_path, monkeypatch)["lock"] == {
        "held": True}
    peek = gather({"lock_peek": True}, tmp_path, monkeypatch)["lock"]
    assert peek["free"] is False and peek["holder"]["token"] == "t1" and peek["generation"] == 1
    (tmp_path / "state" / "lock" / "owner").unlink()
    (tmp_path / "state" / "lock").rmdir()  # t1 released
    stale = gather({"lock": {"token": "t2", "generation": 0}}, tmp_path, monkeypatch)["lock"]
    assert stale == {"held": False, "moved": True, "generation": 1}
    assert not (tmp_path / "state" / "lock").exists()  # not left taken
    fresh = gather({"lock": {"token": "t3", "generation": 1}}, tmp_path, monkeypatch)["lock"]
    assert fresh == {"held": True}


def test_the_peek_judgement(fake_transport: Any) -> None:
    lock = ClusterLock("spark-a", fake_transport("spark-a"), "up")
    lock.judge_peek({"free": True, "generation": 4})
    assert lock.request()["lock"]["generation"] == 4 and not lock.held
    with pytest.raises(LockError, match="launch by bob@laptop"):
        lock.judge_peek({"free": False, "holder": OTHER, "generation": 4})
    ClusterLock("spark-a", fake_transport("spark-a"), "up", break_lock=True).judge_peek(
        {"free": False, "holder": OTHER, "generation": 4})  # --break-lock takes it later
    with pytest.raises(SparkctlError, match=r"took the cluster lock .* after this one looked"):
        lock.accept({"held": False, "moved": True, "generation": 5})
