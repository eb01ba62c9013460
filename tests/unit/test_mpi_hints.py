"""The mpi phase's failure hints: each common mpirun/ssh failure names its likely fix."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.core.step import Change, RunOptions
from orchestrator.engines.trtllm import mpi
from orchestrator.errors import SparkctlError

FACTS = {"spark-a": {"hostname": "spark-a"}, "spark-b": {"hostname": "spark-b"}}


@pytest.mark.parametrize(("stderr", "hint"), [
    ("Host key verification failed.", "host key is not the pinned one"),
    ("@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @", "host key is not the pinned one"),
    ("ssh: connect to host 192.168.200.13 port 2233: Connection refused", "sshd is not listening"),
    ("Error response from daemon: container abc is not running", "not running on the head"),
    ("Error: No such container: trtllm-multinode", "not running on the head"),
])
def test_each_failure_gets_its_hint(stderr: str, hint: str, inventory: Any, context: Any,
                                    fake_transport: Any) -> None:
    transport = fake_transport("spark-a", [(1, "line\n" * 20, stderr)])
    ctx = context(inventory(), "spark-a", FACTS, transports={"spark-a": transport},
                  options=RunOptions(verify=True))
    with pytest.raises(SparkctlError) as raised:
        mpi.MpirunHostname().apply(ctx, Change("verify"))
    text = str(raised.value)
    assert "exited 1. Hint:" in text and hint in text
    assert text.endswith(stderr)
    assert text.count("line") == 7  # the tail: the last 8 lines of output


def test_an_unknown_failure_has_no_hint() -> None:
    assert mpi._hint("something else") == ""
    assert mpi._tail("a\nb\nc\n", lines=2) == "b\nc"


def test_every_node_answers_the_empty_request(inventory: Any) -> None:
    inv = inventory()
    assert mpi.facts(inv, inv.node("spark-b")) == {}
