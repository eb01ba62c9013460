"""How failures are named (issue #20): full disks with node, path and free space, never as a
lock held by another run; status says "unknown: why" instead of "none" when it could not look;
a `docker exec` into a missing container says to run `sparkctl up` first."""

from __future__ import annotations

import pytest
from conftest import as_servers, cluster_of
from conftest import node_facts as as_facts
from test_status import INVENTORY, SERVER, node_facts

from orchestrator.core.disks import describe_os_error, space_problems
from orchestrator.core.lock import ClusterLock
from orchestrator.errors import CommandError, LockError, SparkctlError
from orchestrator.status import assess as status

FULL = {"/var/lib/sparkctl": {"free_bytes": 0, "checked": "/var/lib/sparkctl", "readonly": False},
        "/etc/sparkctl": {"free_bytes": 10**9, "checked": "/etc/sparkctl", "readonly": False}}


def test_a_lock_that_cannot_be_written_names_the_full_disk() -> None:
    lock = ClusterLock("spark-a", None, "up")  # type: ignore[arg-type]
    answer = {"held": False, "error": {"error": "No space left on device", "errno": 28,
                                       "path": "/var/lib/sparkctl/lock", "free_bytes": 0}}
    with pytest.raises(SparkctlError) as caught:
        lock.accept(answer)
    assert not isinstance(caught.value, LockError)
    text = caught.value.message
    assert "spark-a" in text and "/var/lib/sparkctl/lock" in text and "0 bytes free" in text
    assert "another sparkctl run" not in text


def test_space_problems_name_path_and_free_space_and_read_only() -> None:
    assert space_problems(as_facts({"space": FULL})) == [
        "disk full: 0 bytes free on the filesystem of /var/lib/sparkctl (/var/lib/sparkctl)"]
    readonly = {"/etc/netplan": {"free_bytes": 10**9, "checked": "/etc", "readonly": True}}
    assert "read-only" in space_problems(as_facts({"space": readonly}))[0]
    assert "read-only" in describe_os_error({"errno": 30, "path": "/etc/x", "error": "Read-only"})


def test_status_with_a_full_disk_says_unknown_not_none() -> None:
    head = node_facts("spark-a", container=None)
    head["space"] = FULL
    result = status.assess(INVENTORY, cluster_of({"spark-a": head, "spark-b": node_facts("spark-b")}), {})
    node = result["nodes"]["spark-a"]
    assert node["container"]["status"] == "unknown" and "disk full" in node["container"]["why"]
    assert any("disk full" in p for p in node["problems"])
    assert result["server"] is None and "disk full" in result["server_unknown"]
    assert not result["ok"]


def test_status_with_the_head_unreachable_says_the_server_is_unknown() -> None:
    result = status.assess(INVENTORY, cluster_of({"spark-b": node_facts("spark-b")}), {"spark-a": "refused"})
    assert "spark-a is unreachable" in result["server_unknown"]


def test_server_endpoint_is_a_url_and_the_node_a_field() -> None:
    facts = {"spark-a": node_facts("spark-a", server=SERVER, probe={"/health": 200, "/health_generate": 200}),
             "spark-b": node_facts("spark-b")}
    server = status.assess(INVENTORY, cluster_of(facts), {})["server"]
    assert server["endpoint"] == "http://127.0.0.1:8355" and server["node"] == "spark-a"


@pytest.mark.parametrize("stderr", ["Error response from daemon: No such container: trtllm-multinode",
                                    "Error response from daemon: Container trtllm-multinode is not running"])
def test_docker_exec_into_a_missing_container_says_run_up(stderr: str) -> None:
    error = CommandError("spark-a", "docker exec trtllm-multinode python3 -c <x>", 1, stderr)
    assert error.message == ("the container trtllm-multinode is not running on spark-a: "
                             "run `sparkctl up` first")
    assert "exited" in CommandError("spark-a", "ls", 1, "No such container: x").message


@pytest.mark.parametrize("argv", [["status", "--json", "--inventory", "/nonexistent.yml"],
                                  ["down", "--json", "--bogus-option"],
                                  ["launch", "/dev/zero", "--json"]])
def test_json_errors_are_an_object_on_stdout(argv: list[str]) -> None:
    import json
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "orchestrator.cli", *argv], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    answer = json.loads(result.stdout)
    assert answer["ok"] is False and answer["exit_code"] == 2 and answer["error"]
    assert answer["command"] == argv[0]


def test_tunnel_exits_130_on_ctrl_c(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib
    import threading
    from types import SimpleNamespace

    from click.testing import CliRunner

    from orchestrator.cli import cli
    from orchestrator.cli import launch as launch_cli
    from orchestrator.remote import tunnel

    class Forwarder:
        def __init__(self, *args: object, **kwargs: object) -> None:
            self.local_port = 1

        def __enter__(self) -> Forwarder:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    def interrupted(self: object, timeout: float | None = None) -> bool:
        raise KeyboardInterrupt

    inventory = SimpleNamespace(head_name="spark-a")
    monkeypatch.setattr(launch_cli, "_server_on_head",
                        lambda *a: (contextlib.nullcontext(None), inventory))
    (server,) = as_servers([{"name": "s", "port": 8355, "model": "m"}])
    monkeypatch.setattr(launch_cli, "_running_server", lambda *a: (None, server))
    monkeypatch.setattr(tunnel, "Forwarder", Forwarder)
    monkeypatch.setattr(threading.Event, "wait", interrupted)
    result = CliRunner().invoke(cli, ["tunnel"])
    assert result.exit_code == 130, result.output


def test_netcheck_names_a_full_disk() -> None:
    from orchestrator.netcheck.checks import check_disk

    results = check_disk(INVENTORY, INVENTORY.node("spark-a"), as_facts({"space": FULL}))
    assert [(r.check, r.status) for r in results] == [("disk", "fail")]
    assert "0 bytes free" in results[0].message and "/var/lib/sparkctl" in results[0].message
