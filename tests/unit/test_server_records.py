"""Server records read once into typed records (orchestrator/records.py): what every engine
writes reads back unchanged, and a damaged record is refused naming the node, the server and
the key (never a traceback, never a guess)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import cluster_of
from test_serve import INVENTORY

from orchestrator.engines import load_recipe, servers
from orchestrator.engines.trtllm.serve import LaunchSpec
from orchestrator.recipe import LaunchOptions
from orchestrator.records import RecordError, ServerRecord, read_server

WRITTEN = LaunchSpec(load_recipe("gpt-oss-120b").model_copy(update={"placement": ["spark-a"]}),
                     INVENTORY, LaunchOptions()).record(started="2026-11-28T06:00:00+00:00")


def answer(*records: Any) -> dict[str, Any]:
    members = {r["name"]: {"running": True} for r in records if isinstance(r, dict)}
    out = json.dumps({"servers": list(records), "members": members})
    return {"commands": {"servers": {"rc": 0, "out": out, "err": ""}}}


def test_what_an_engine_writes_reads_back_typed_and_unchanged() -> None:
    record = ServerRecord.from_dict(WRITTEN)
    assert (record.name, record.engine, record.nodes, record.main, record.tp_size) == (
        "gpt-oss-120b", "trtllm", ["spark-a"], "mpirun.pid", 1)
    assert record.to_dict() == WRITTEN  # engine-specific figures kept, flat, in their places


def test_a_listed_server_is_its_record_and_what_the_node_saw() -> None:
    (server,) = servers.from_facts(cluster_of({"spark-a": answer(
        {**WRITTEN, "alive": True, "health": 200, "ready_log": False})}))
    assert (server.name, server.node, server.alive, server.health, server.migrated) == (
        "gpt-oss-120b", "spark-a", True, 200, False)
    assert server.record.port == 8000 and server.record.config_hash == WRITTEN["config_hash"]


@pytest.mark.parametrize(("change", "said"), [
    ({"port": "eighty"}, "spark-a: server gpt-oss-120b: key 'port' is 'eighty', not a port number"),
    ({"nodes": "spark-a"}, "key 'nodes' is 'spark-a', not a list of node names"),
    ({"memory_gb": True}, "key 'memory_gb' is True, not a number of GB"),
    ({"nodes": None}, "spark-a: server gpt-oss-120b: key 'nodes' is missing"),
])
def test_a_damaged_record_is_refused_naming_node_server_and_key(change: dict[str, Any],
                                                                 said: str) -> None:
    damaged = {**WRITTEN, **change, "alive": True}
    with pytest.raises(RecordError, match="the record was damaged") as refused:
        servers.from_facts(cluster_of({"spark-a": answer(damaged)}))
    assert said in str(refused.value)
    assert "`sparkctl down --server NAME` removes it" in str(refused.value)


def test_an_entry_that_is_not_an_object_is_refused_naming_the_node() -> None:
    with pytest.raises(RecordError, match=r"spark-b: a server record is list, not an object"):
        read_server([1, 2], "spark-b")
