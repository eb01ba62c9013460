"""mpi phase: when mpirun runs, what it runs, and how its failures read."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.core.step import Change, RunOptions
from orchestrator.engines.trtllm import mpi
from orchestrator.errors import SparkctlError

FACTS = {"spark-a": {"hostname": "spark-a"}, "spark-b": {"hostname": "spark-b"}}


@pytest.fixture
def run(inventory: Any, context: Any, fake_transport: Any) -> Any:
    def run_(answer: tuple[int, str, str], changes: list[str] | None = None,
             verify: bool = False) -> tuple[str | None, Any]:
        transport = fake_transport("spark-a", [answer])
        shared = {"changed_steps": changes} if changes else {}
        ctx = context(inventory(), "spark-a", FACTS, shared=shared, transports={"spark-a": transport},
                      options=RunOptions(verify=verify))
        return mpi.MpirunHostname().apply(ctx, Change("verify")), transport
    return run_


def test_not_rerun_when_nothing_changed(run: Any) -> None:
    message, transport = run((0, "", ""))
    assert "not re-run" in (message or "") and transport.calls == []


def test_runs_after_a_change_and_sees_every_host(run: Any) -> None:
    message, transport = run((0, "spark-b\nspark-a\n", ""), changes=["spark-b: x"])
    assert message == "mpirun -np 2 hostname reached spark-a, spark-b"
    assert transport.calls[0]["command"] == (
        "docker exec trtllm-multinode timeout -k 5 60 mpirun -np 2 hostname")


def test_verify_forces_a_run_and_a_missing_host_fails(run: Any) -> None:
    with pytest.raises(SparkctlError, match="but not spark-b"):
        run((0, "spark-a\nspark-a\n", ""), verify=True)


def test_hang_becomes_a_failure_with_the_hostfile_hint(run: Any) -> None:
    with pytest.raises(SparkctlError, match="hostfile IPs must be fabric IPs"):
        run((124, "", ""), verify=True)


def test_publickey_failure_gets_a_hint(run: Any) -> None:
    with pytest.raises(SparkctlError, match="cluster key is not authorized"):
        run((1, "", "root@192.168.200.13: Permission denied (publickey)."), verify=True)


def test_step_shape(inventory: Any) -> None:
    phase = mpi.phase(inventory())
    step = phase.steps[0]
    assert (step.kind, step.scope, phase.head_only) == ("verify", "head", False)
    assert mpi.missing_hostnames("a\n b \n", ["a", "b", "c"]) == ["c"]
