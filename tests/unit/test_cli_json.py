"""--json where it was missing: `recipes list` (one object) and `tunnel` (one line once the
forward listens, for scripts). `logs --json` (JSON lines) is in test_status/test_cli."""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import as_servers

from orchestrator.cli import cli


def test_recipes_list_json_has_every_builtin() -> None:
    from orchestrator.engines import builtin_names

    result = CliRunner().invoke(cli, ["recipes", "list", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["command"] == "recipes list" and doc["ok"] is True
    assert [r["name"] for r in doc["recipes"]] == builtin_names()
    qwen = next(r for r in doc["recipes"] if r["name"] == "qwen3-8b")
    assert qwen["engine"] == "sglang" and qwen["drafting"] is None and qwen["fits"] is True
    assert qwen["port"] == 30000 and qwen["memory_gb"] > 0
    drafting = {r["name"]: r["drafting"] for r in doc["recipes"]}
    assert (drafting["qwen3-235b"], drafting["qwen3.6-27b"]) == ("Eagle 3", "NEXTN 5")


def test_recipes_list_names_a_llama_draft_and_keeps_its_columns_aligned() -> None:
    from orchestrator.cli.recipes import recipe_table
    from orchestrator.engines import load_recipe
    from orchestrator.engines.llamacpp.recipe import Draft

    recipe = load_recipe("lab-tiny-llama").model_copy(
        update={"draft": Draft(model="sparklab/tiny-draft", gguf="d.gguf")})
    assert recipe.drafting == "draft tiny-draft"
    rows = [{"name": "a-much-longer-recipe-name", "engine": "llamacpp", "model": "m/x",
             "nodes": 2, "drafting": recipe.drafting, "port": 8080, "fits": True},
            {"name": "b", "engine": "vllm", "model": "org/a-longer-model", "nodes": 1,
             "drafting": None, "port": 8000, "fits": False}]
    lines = recipe_table(rows).splitlines()
    assert lines[0].index("m/x") == lines[1].index("org/a-longer-model")
    assert lines[0].index("nodes") == lines[1].index("nodes")
    assert "draft tiny-draft" in lines[0] and "no draft" in lines[1] and "DOES NOT FIT" in lines[1]


def test_tunnel_json_says_where_to_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.cli import launch

    @contextmanager
    def session() -> Any:
        yield object()

    remote: list[str] = []

    class Forwarder:
        def __init__(self, transport: Any, port: int, local: int, remote_host: str) -> None:
            self.local_port = 40123
            remote.append(remote_host)

        def __enter__(self) -> Any:
            return self

        def __exit__(self, *exc: object) -> None: ...

    class Event:
        def wait(self) -> None:
            raise KeyboardInterrupt

    monkeypatch.setattr(launch, "_server_on_head", lambda path, command: (session(), object()))
    (server,) = as_servers([{
        "port": 8000, "node": "spark-a", "model": "m", "name": "srv", "host": "10.0.0.5",
        "api_key_file": "/var/lib/sparkctl/run/servers/srv/api_key"}])
    monkeypatch.setattr(launch, "_running_server", lambda s, inv, name: (None, server))
    monkeypatch.setattr("orchestrator.remote.tunnel.Forwarder", Forwarder)
    monkeypatch.setattr("threading.Event", Event)
    result = CliRunner().invoke(cli, ["tunnel", "--json", "--local-port", "0"])
    assert result.exit_code == 130
    line = json.loads(result.stdout.splitlines()[0])
    assert line == {"command": "tunnel", "ok": True, "url": "http://127.0.0.1:40123",
                    "base_url": "http://127.0.0.1:40123/v1", "local_port": 40123,
                    "node": "spark-a", "port": 8000, "model": "m", "server": "srv",
                    "api_key": True}
    # the forward reaches the server where it binds; the key is said to be needed, never shown
    assert remote == ["10.0.0.5"]
    assert "Authorization: Bearer <key>" in result.stderr and "/servers/srv/api_key" in result.stderr
