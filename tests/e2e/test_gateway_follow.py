"""The gateway follows the servers (issues 29, 40), on the simulated lab with the REAL SGLang
Model Gateway (sglang-router 0.3.2): with the gateway up in front of one replica, `launch
--nodes spark-b --name b` adds a replica (`POST /workers`, the router not restarted) that then
serves requests through it; `down --server b` under load at concurrency 4 removes it with no
failed request; a replica joining AND leaving while a bounded load runs through the router
fails none of its requests; `gateway up`/`down` wait for the cluster lock; `sparkctl down`
leaves no router, config or relay process on any node, and says so.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest
from conftest import Lab, healthy_lab
from test_gateway import Load, inv, key_file, sparkctl

pytestmark = pytest.mark.lab

RELAYS = "grep -lsa -- '/run/gateway/relay[-]' /proc/[0-9]*/cmdline | cut -d/ -f3"
ROUTERS = "grep -lsa -- '/run/gateway/router[.]pid' /proc/[0-9]*/cmdline | cut -d/ -f3"


def router_pid(lab: Lab) -> str:
    """The router's pid (the same all along: nothing restarts it)."""
    return lab.exec(lab.nodes[0], "cat /var/lib/sparkctl/run/gateway/router.pid").stdout.strip()


@pytest.fixture(scope="module")
def gated(lab_session: list[Lab], tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[Lab, str]]:
    lab = healthy_lab(lab_session)
    sparkctl("gateway", "down", *inv(lab))
    sparkctl("down", *inv(lab), "--yes")
    up = sparkctl("up", *inv(lab), "--yes")
    assert up.returncode == 0, up.stdout + up.stderr
    launch = sparkctl("launch", "qwen3-8b", *inv(lab), "--nodes", lab.nodes[0], "--name", "a",
                      "--yes", "--timeout", "240")
    assert launch.returncode == 0, launch.stdout + launch.stderr
    secret = f"sk-e2e-follow-{os.getpid()}-{time.time_ns()}"
    key = key_file(tmp_path_factory.mktemp("follow"), "key", secret + "\n")
    gw = sparkctl("gateway", "up", *inv(lab), "--host", "0.0.0.0", "--api-key-file", str(key))
    assert gw.returncode == 0, gw.stdout + gw.stderr
    yield lab, secret
    sparkctl("gateway", "down", *inv(lab))
    sparkctl("down", *inv(lab), "--yes")


def table(lab: Lab) -> dict[str, str]:
    doc = json.loads(sparkctl("gateway", "status", *inv(lab), "--json").stdout)
    return {r["server"]: r["node"] for r in doc["replicas"]}


def chats_served(lab: Lab, node: str, server: str) -> int:
    """Chat completions the engine of SERVER answered so far (its access log)."""
    out = lab.exec(node, f"docker logs sparkctl-sglang-{server} 2>&1 | grep -c "
                   "'POST /v1/chat/completions'", check=False)
    return int(out.stdout.strip() or 0)


def test_a_launched_replica_joins_and_serves(gated: tuple[Lab, str]) -> None:
    lab, secret = gated
    assert table(lab) == {"a": lab.nodes[0]}
    pid = router_pid(lab)
    launch = sparkctl("launch", "qwen3-8b", *inv(lab), "--nodes", lab.nodes[1], "--name", "b",
                      "--yes", "--timeout", "240")
    assert launch.returncode == 0, launch.stdout + launch.stderr
    assert "b joined the router" in launch.stderr, launch.stderr
    assert router_pid(lab) == pid  # added at runtime: no restart
    assert table(lab) == {"a": lab.nodes[0], "b": lab.nodes[1]}
    before = chats_served(lab, lab.nodes[1], "b")
    # least busy: at concurrency 4 both replicas serve
    with Load(lab, secret) as load:
        time.sleep(8)
    assert load.failed == [] and load.ok > 0, (load.ok, load.failed[:5])
    assert chats_served(lab, lab.nodes[1], "b") > before  # b answered some through the gateway
    # a relaunch in place keeps the table and the router as they are
    again = sparkctl("launch", "qwen3-8b", *inv(lab), "--nodes", lab.nodes[1], "--name", "b",
                     "--replace", "--yes", "--timeout", "240")
    assert again.returncode == 0 and "joins" not in again.stderr, again.stderr


def test_a_downed_replica_leaves_without_a_failed_request(gated: tuple[Lab, str]) -> None:
    lab, secret = gated
    with Load(lab, secret) as load:
        time.sleep(3)
        down = sparkctl("down", "--server", "b", *inv(lab), "--yes")
        time.sleep(8)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "b left the router" in down.stderr, down.stderr
    assert load.failed == [] and load.ok > 0, (load.ok, load.failed[:5])
    assert table(lab) == {"a": lab.nodes[0]}
    assert lab.exec(lab.nodes[1], RELAYS, check=False).stdout.strip() == ""


def test_a_replica_joins_and_leaves_under_load_with_no_failure(gated: tuple[Lab, str]) -> None:
    """Issue 40's goal: a bounded load (concurrency 4) through the router while c joins and
    leaves: no restart, no refused connection, no failed request."""
    lab, secret = gated
    pid = router_pid(lab)
    with Load(lab, secret) as load:
        time.sleep(3)
        joined = sparkctl("launch", "qwen3-8b", *inv(lab), "--nodes", lab.nodes[1], "--name",
                          "c", "--yes", "--timeout", "240")
        served = table(lab)
        time.sleep(5)
        left = sparkctl("down", "--server", "c", *inv(lab), "--yes")
        time.sleep(5)
    assert joined.returncode == 0, joined.stdout + joined.stderr
    assert left.returncode == 0, left.stdout + left.stderr
    assert served == {"a": lab.nodes[0], "c": lab.nodes[1]} and table(lab) == {"a": lab.nodes[0]}
    assert load.failed == [] and load.ok > 0, (load.ok, load.failed[:5])
    assert router_pid(lab) == pid


def test_gateway_commands_wait_for_the_cluster_lock(gated: tuple[Lab, str]) -> None:
    lab, _ = gated
    head = lab.nodes[0]
    lab.exec(head, "mkdir /var/lib/sparkctl/lock && echo '{\"token\": \"x\", \"user\": \"other\","
             " \"controller\": \"elsewhere\", \"pid\": 1, \"command\": \"launch\", \"started\":"
             " \"2099-01-01T00:00:00+00:00\"}' > /var/lib/sparkctl/lock/owner")
    try:
        for args in (("gateway", "down"), ("gateway", "up")):
            result = sparkctl(*args, *inv(lab))
            assert result.returncode != 0 and "locked by another sparkctl run" in result.stderr, (
                result.stdout + result.stderr)
    finally:
        lab.exec(head, "rm -rf /var/lib/sparkctl/lock")
    assert table(lab) == {"a": lab.nodes[0]}  # nothing changed meanwhile


def test_down_leaves_no_relay(gated: tuple[Lab, str]) -> None:
    lab, _ = gated
    assert lab.exec(lab.nodes[0], RELAYS, check=False).stdout.strip() != ""  # a's relay runs
    assert lab.exec(lab.nodes[0], ROUTERS, check=False).stdout.strip() != ""  # the router
    down = sparkctl("down", *inv(lab), "--yes", "--json")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "gateway relay" in down.stdout  # the step said what it stopped
    for node in lab.nodes:
        assert lab.exec(node, RELAYS, check=False).stdout.strip() == ""
        assert lab.exec(node, ROUTERS, check=False).stdout.strip() == ""
