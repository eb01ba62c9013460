"""`launch R --rolling` relaunches each replica as it was launched (issue 41): its host, its
API key (read back from its node, never the rolling command's lack of one) and --persist; a
rolling command naming other ones is refused before any replica is touched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import as_servers

from orchestrator.cli import rolling

OPTS: dict[str, Any] = {
    "rolling": True, "allow_downtime": False, "placed": (), "name": None, "port": None,
    "dry_run": False, "recipe_name": "qwen3-8b", "inventory_path": None, "timeout": 60.0,
    "host": "127.0.0.1", "drop_caches": False, "hf_token_file": None, "trust_new_hosts": False,
    "break_lock": False, "ignore_memory": False, "guard_min_available_gb": None,
    "persist": False, "distribute_image": False, "api_key_file": None,
}
KEYED, OPEN = as_servers([
    {"name": "r-a", "node": "spark-a", "nodes": ["spark-a"], "port": 30001,
     "host": "192.168.200.12", "api_key_file": "/run/sparkctl/servers/r-a/api_key",
     "persistent": True},
    {"name": "r-b", "node": "spark-b", "nodes": ["spark-b"], "port": 30002}])


class Node:
    node = "spark-a"

    def run(self, command: str, **kwargs: Any) -> Any:
        assert command.startswith("cat ") and kwargs.get("sudo")
        return type("Result", (), {"ok": True, "stdout": "sk-recorded-key-1\n", "stderr": ""})()


def roll(monkeypatch: pytest.MonkeyPatch, opts: dict[str, Any]) -> list[dict[str, Any]]:
    launched: list[dict[str, Any]] = []

    def fake_launch(*args: Any, early: bool = True) -> int:
        assert not early  # each replica's run differs: nothing started from a kept request
        key_file = args[20]
        launched.append({"host": args[7], "name": args[15], "port": args[16],
                         "persist": args[18],
                         "key": Path(key_file).read_text().strip() if key_file else None})
        return 0

    def fake_rolling(recipe: str, inventory: Any, downtime: bool, relaunch: Any,
                     check: Any = None) -> int:
        for server in (KEYED, OPEN):
            check(server)
        for server in (KEYED, OPEN):
            assert relaunch(server, Node()) == 0
        return 0

    monkeypatch.setattr(rolling, "rolling", fake_rolling)
    with pytest.raises(SystemExit) as done:
        rolling.rolling_launch(dict(opts), fake_launch)
    launched.append({"exit": done.value.code})
    return launched


def test_each_replica_comes_back_with_its_own_host_key_and_persist(
        monkeypatch: pytest.MonkeyPatch) -> None:
    keyed, open_one, done = roll(monkeypatch, OPTS)
    assert done == {"exit": 0}
    assert keyed == {"host": "192.168.200.12", "name": "r-a", "port": 30001, "persist": True,
                     "key": "sk-recorded-key-1"}
    assert open_one == {"host": "127.0.0.1", "name": "r-b", "port": 30002, "persist": False,
                        "key": None}


@pytest.mark.parametrize(("over", "words"), [
    ({"host": "0.0.0.0"}, "--host 0.0.0.0 (it binds 192.168.200.12)"),
    ({"persist": True}, "--persist (it is not persistent)"),
])
def test_a_rolling_command_with_other_options_is_refused(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        over: dict[str, Any], words: str) -> None:
    launched = roll(monkeypatch, {**OPTS, **over})
    assert launched == [{"exit": 2}]
    assert words in capsys.readouterr().err
