"""status and every listed server: a dead, stalled or guard-stopped server of any engine is a
problem on its first node (exit 1, named), and the header lists the servers."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import as_servers

from orchestrator.status.server import add_server_problems, server_state

GUARD = {"node": "spark-b", "available_gb": 0.8, "min_available_gb": 4.0, "total_gb": 128.0,
         "time": "2026-11-25T16:00:00Z", "state": "stopped"}


def entry(state: str, **over: Any) -> dict[str, Any]:
    return {"name": "q", "engine": "sglang", "recipe": "qwen3.6-27b", "model": "M",
            "nodes": ["spark-b"], "node": "spark-b", "port": 30000, "state": state, **over}


def result(*servers: dict[str, Any]) -> dict[str, Any]:
    nodes = {n: {"problems": [], "state": "up"} for n in ("spark-a", "spark-b")}
    return {"ok": True, "state": "serving", "nodes": nodes, "servers": list(servers)}


@pytest.mark.parametrize(("state", "words"), [
    ("dead", ["server q (sglang", "is dead", "--nodes spark-b"]),
    ("stalled", ["is stalled", "restarts it"]),
    ("guard-stopped", ["stopped by the memory guard at 0.8 GB available", "free memory there"]),
])
def test_a_server_that_does_not_serve_fails_status_naming_it(state: str, words: list[str]) -> None:
    found = result(entry("healthy", name="other", nodes=["spark-a"]),
                   entry(state, memguard=GUARD if state == "guard-stopped" else None))
    add_server_problems(found)
    assert found["ok"] is False and found["state"] == "degraded"
    assert found["nodes"]["spark-a"]["problems"] == []
    [problem] = found["nodes"]["spark-b"]["problems"]
    for word in words:
        assert word in problem


def test_healthy_and_loading_servers_and_the_assessed_single_record_add_nothing() -> None:
    found = result(entry("healthy"), entry("loading"), entry("stopped", legacy=True))
    add_server_problems(found)
    assert found["ok"] is True and all(not n["problems"] for n in found["nodes"].values())


def test_a_guard_record_of_a_gone_server_is_guard_stopped() -> None:
    gone, guarded = as_servers([{"name": "q", "port": 1, "alive": False},
                                {"name": "q", "port": 1, "alive": False, "memguard": GUARD}])
    assert server_state(guarded) == "guard-stopped"
    assert server_state(gone) == "dead"


def test_a_migrated_server_not_assessed_in_full_is_judged_like_any_other() -> None:
    """(status reads the old single record only when the read that migrated it saw it too)"""
    dead = entry("dead", legacy=True)
    found = result(dict(dead))
    found["server"] = None
    add_server_problems(found)
    assert found["ok"] is False and "is dead" in found["nodes"]["spark-b"]["problems"][0]


def test_the_header_lists_the_servers(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.status.render import servers_line

    line = servers_line("servers", [entry("healthy"), entry("dead", name="b", engine="vllm")])
    assert line.startswith("servers: 2: q (sglang on spark-b,") and "b (vllm on spark-b," in line


def test_the_relaunch_hint_starts_the_server_as_it_was_recorded() -> None:
    # issue 41: the hint omitted the recorded --port (and host, key, persist): following it
    # started the server on the recipe's port, open, and not persistent
    found = result(entry("dead", port=30123, host="192.168.200.12",
                         api_key_file="/run/k", persistent=True))
    add_server_problems(found)
    [problem] = found["nodes"]["spark-b"]["problems"]
    assert ("`sparkctl launch qwen3.6-27b --name q --nodes spark-b --port 30123 --host "
            "192.168.200.12 --api-key-file FILE --persist` starts it again") in problem


@pytest.mark.parametrize(("keyless", "words", "problem"), [
    (401, ", 192.168.200.12 with API key)", False),
    (200, "API key NOT enforced", True),
    (None, "API key set (not verified", False),
])
def test_status_says_with_api_key_only_when_the_server_refuses_without_it(
        keyless: int | None, words: str, problem: bool) -> None:
    # issue 41: a `#` key made llama-server run with no key while status said "with API key"
    from orchestrator.status.render import servers_line

    server = entry("healthy", host="192.168.200.12", api_key_file="/run/k", keyless=keyless)
    assert words in servers_line("servers", [server])
    found = result(server)
    add_server_problems(found)
    assert (found["ok"] is False) is problem
    if problem:
        assert "answers /v1/models without it" in found["nodes"]["spark-b"]["problems"][0]


def test_the_listed_address_is_where_the_server_binds(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli.status import _render_servers

    _render_servers([{**entry("healthy"), "host": "192.168.200.12"}])
    assert "192.168.200.12:30000" in capsys.readouterr().out
