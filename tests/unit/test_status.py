"""status (facts in, assessment out) and logs (commands, line tagging, merging)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from conftest import cluster_of

from orchestrator.errors import InputError
from orchestrator.inventory_checks import inventory_from_data
from orchestrator.paths import NETPLAN_FILE, SERVER_JSON
from orchestrator.status import assess as status
from orchestrator.status import logs
from orchestrator.status import render as status_render

INVENTORY = inventory_from_data(
    {
        "cluster": {"name": "two-sparks", "ssh_key": "/k"},
        "fabric": {"interfaces": ["enp1s0f1np1"], "mtu": 9000},
        "nodes": [
            {"name": "spark-a", "host": "a", "addresses": {"enp1s0f1np1": "192.168.200.12/24"}},
            {"name": "spark-b", "host": "b", "addresses": {"enp1s0f1np1": "192.168.200.13/24"}},
        ],
    },
    "inv.yml",
)
NOW = 1_750_000_000.0


def node_facts(name: str, *, configured: bool = True, container: str | None = "running",
               link: str = "Up", server: dict[str, Any] | None = None,
               probe: dict[str, Any] | None = None, pids: dict[str, Any] | None = None) -> dict[str, Any]:
    address = "192.168.200.12/24" if name == "spark-a" else "192.168.200.13/24"
    facts: dict[str, Any] = {
        "time": NOW,
        "files": {NETPLAN_FILE: {"exists": configured}},
        "links": {"enp1s0f1np1": {"operstate": link.upper(), "mtu": 9000,
                                  "addresses": [address] if configured else []}},
        "ibdev2netdev": {"devices": {"enp1s0f1np1": {"device": "rocep1s0f1", "state": link}}},
        "containers": {"trtllm-multinode": None},
        "images": {INVENTORY.container.image: {"Id": "sha256:img", "RepoDigests": ["x@sha256:d1"]}},
        "commands": {},
    }
    if container:
        facts["containers"]["trtllm-multinode"] = {
            "Image": "sha256:img",
            "Config": {"Labels": {"sparkctl.managed": "true", "sparkctl.cluster": "two-sparks",
                                  "sparkctl.config-hash": "h"}},
            "State": {"Status": container, "Running": container == "running", "ExitCode": 0,
                      "StartedAt": "2025-06-15T14:00:00.123456789Z"},
        }
    if server is not None:
        facts["files"][SERVER_JSON] = {"exists": True, "content": json.dumps(server)}
        facts["commands"]["probe"] = {"rc": 0, "out": json.dumps(probe or {})}
        facts["commands"]["server_log"] = {"rc": 0, "out": "loading...\nTraceback: boom\n"}
    if pids is not None:
        facts["commands"]["processes"] = {"rc": 0, "out": json.dumps({"pids": pids})}
    return facts


SERVER = {"recipe": "qwen3", "model": "Qwen/Qwen3", "port": 8355, "started": "2025-06-15T14:00:00+00:00"}


def test_nothing_set_up_is_healthy() -> None:
    result = status.assess(INVENTORY, cluster_of({n: node_facts(n, configured=False, container=None)
                                       for n in ("spark-a", "spark-b")}), {})
    assert result["ok"] and result["state"] == "not-set-up"
    assert result["server"] is None


def test_up_and_serving() -> None:
    facts = {"spark-a": node_facts("spark-a", server=SERVER, probe={"/health": 200, "/health_generate": 200}),
             "spark-b": node_facts("spark-b")}
    result = status.assess(INVENTORY, cluster_of(facts), {})
    assert result["ok"], result
    assert result["state"] == "serving"
    assert result["server"]["uptime_seconds"] == int(NOW - 1749996000)
    assert result["nodes"]["spark-a"]["container"]["digest"] == "sha256:d1"


def test_a_crashed_server_is_unhealthy_and_shows_its_log() -> None:
    facts = {"spark-a": node_facts("spark-a", server=SERVER, probe={"/health": "Connection refused"},
                                   pids={"mpirun.pid": {"pid": 7, "alive": False}}),
             "spark-b": node_facts("spark-b", pids={"rank-1.pid": {"pid": 9, "alive": False}})}
    result = status.assess(INVENTORY, cluster_of(facts), {})
    assert not result["ok"]
    assert result["server"]["state"] == "down"
    assert "Traceback: boom" in result["server"]["log_tail"]
    assert any("mpirun (pid 7)" in p for p in result["nodes"]["spark-a"]["problems"])
    assert any("rank-1 (pid 9)" in p for p in result["nodes"]["spark-b"]["problems"])


def test_a_loading_server_is_starting() -> None:
    facts = {"spark-a": node_facts("spark-a", server=SERVER, probe={"/health": 503}),
             "spark-b": node_facts("spark-b")}
    result = status.assess(INVENTORY, cluster_of(facts), {})
    assert result["server"]["state"] == "starting" and not result["ok"]


def test_a_dead_rank_shows_as_failing_health_generate() -> None:
    facts = {"spark-a": node_facts("spark-a", server=SERVER, probe={"/health": 200, "/health_generate": 500}),
             "spark-b": node_facts("spark-b")}
    assert status.assess(INVENTORY, cluster_of(facts), {})["server"]["state"] == "unhealthy"


def test_an_unreachable_node_is_reported_and_fails() -> None:
    result = status.assess(INVENTORY, cluster_of({"spark-a": node_facts("spark-a")}),
                           {"spark-b": "connection refused"})
    assert not result["ok"]
    assert result["state"] == "degraded"
    assert result["nodes"]["spark-b"]["state"] == "unreachable"
    assert "connection refused" in result["nodes"]["spark-b"]["problems"][0]


def test_link_down_on_a_configured_fabric_is_a_problem() -> None:
    facts = {"spark-a": node_facts("spark-a", link="Down"), "spark-b": node_facts("spark-b")}
    problems = status.assess(INVENTORY, cluster_of(facts), {})["nodes"]["spark-a"]["problems"]
    assert any("enp1s0f1np1 is Down" in p for p in problems)


def test_exited_container_and_half_set_up_cluster() -> None:
    facts = {"spark-a": node_facts("spark-a", container="exited"),
             "spark-b": node_facts("spark-b", container=None)}
    result = status.assess(INVENTORY, cluster_of(facts), {})
    assert any("is exited" in p for p in result["nodes"]["spark-a"]["problems"])
    facts = {"spark-a": node_facts("spark-a"), "spark-b": node_facts("spark-b", container=None)}
    result = status.assess(INVENTORY, cluster_of(facts), {})
    assert any("no container here" in p for p in result["nodes"]["spark-b"]["problems"])


def test_foreign_container_is_flagged() -> None:
    facts = {"spark-a": node_facts("spark-a"), "spark-b": node_facts("spark-b")}
    facts["spark-b"]["containers"]["trtllm-multinode"]["Config"]["Labels"] = {}
    result = status.assess(INVENTORY, cluster_of(facts), {})
    assert result["nodes"]["spark-b"]["container"]["status"] == "foreign"


def test_status_request_probes_only_on_the_head() -> None:
    head = status.status_facts(INVENTORY, INVENTORY.node("spark-a"))
    worker = status.status_facts(INVENTORY, INVENTORY.node("spark-b"))
    assert "probe" in head["commands"] and "probe" not in worker["commands"]
    assert SERVER_JSON in head["files"]


def test_human_duration() -> None:
    seconds = (5, 125, 7300, 90000, None)
    assert [status_render.human_duration(s) for s in seconds] == ["5s", "2m", "2h01m", "1d1h", "?"]


def test_render_does_not_crash(capsys: pytest.CaptureFixture[str]) -> None:
    facts = {"spark-a": node_facts("spark-a", server=SERVER, probe={"/health": 503})}
    status_render.render_status({**status.assess(INVENTORY, cluster_of(facts), {"spark-b": "down"}),
                                 "seconds": 1.0})
    out = capsys.readouterr().out
    assert "spark-b" in out and "UNHEALTHY" in out and "loading" in out


# ------------------------------------------------------------------ logs

def test_parse_since() -> None:
    assert logs.parse_since("10m", now=1000.0) == 400.0
    assert logs.parse_since("1700000000") == 1700000000.0
    assert logs.parse_since("2025-01-01T00:00:00Z") == 1735689600.0
    with pytest.raises(InputError):
        logs.parse_since("yesterday")


def test_rank_files_follow_hostfile_order() -> None:
    assert logs.expected_files(INVENTORY, INVENTORY.node("spark-a")) == [
        "/var/lib/sparkctl/run/server.log", "/var/lib/sparkctl/run/rank-0.log"]
    assert logs.expected_files(INVENTORY, INVENTORY.node("spark-b")) == ["/var/lib/sparkctl/run/rank-1.log"]


def test_commands_follow_and_limit() -> None:
    command = logs.container_log_cmd(INVENTORY, follow=True, since=100.0, tail=5)
    assert "docker logs --since 100 --tail 5 --follow trtllm-multinode" in command
    files = logs.file_log_cmd(["/var/lib/sparkctl/run/rank-1.log"], follow=True, since=None, tail=5)
    assert "tail -v -n 5 -F" in files
    assert "-F" not in logs.file_log_cmd(["/x.log"], follow=False, since=None, tail=None)


def test_tagger_uses_tail_headers_and_drops_tail_noise() -> None:
    tagger = logs.LineTagger("files")
    raw = ["==> /var/lib/sparkctl/run/server.log <==\n", "a\r\n", "\n",
           "==> /var/lib/sparkctl/run/rank-0.log <==\n", "b\n", "tail: 'x' has appeared\n", "\n", "c\n"]
    tagged = [pair for line in raw for pair in tagger.feed(line)]
    assert tagged == [("server", "a"), ("rank-0", "b"), ("rank-0", ""), ("rank-0", "c")]
    # a named server's files carry its name: several servers each have a rank-0.log
    named = [pair for line in ["==> /var/lib/sparkctl/run/servers/gpt2/rank-0.log <==\n", "d\n"]
             for pair in tagger.feed(line)]
    assert named == [("gpt2/rank-0", "d")]


def test_logs_read_every_servers_files_and_one_servers_with_server() -> None:
    import subprocess

    every = logs.file_log_cmd(logs.expected_files(INVENTORY, INVENTORY.node("spark-b")),
                              follow=False, since=None, tail=5)
    assert "/var/lib/sparkctl/run/servers/*/*.log" in every
    (container, files) = logs.sources_for(INVENTORY, INVENTORY.node("spark-b"), False, None, 5,
                                          server="gpt2")
    assert "label=sparkctl.server=gpt2" in container.command
    assert "/var/lib/sparkctl/run/servers/gpt2/*.log" in files.command
    assert "servers/*/" not in files.command
    # no file at all, followed: nothing to tail (tail would read its stdin and never end)
    followed = logs.file_log_cmd([], True, None, 5, ("/nonexistent-sparkctl/*.log",))
    assert subprocess.run(["sh", "-c", followed], timeout=10).returncode == 0


class FakeStream:
    def __init__(self, transport: Any, command: str, terminal: bool) -> None:
        self.command = command

    def lines(self) -> Any:
        yield from (f"{self.command} line {i}\n" for i in range(2))

    def close(self) -> None:
        pass


def test_stream_merges_every_source_with_prefixes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "Stream", FakeStream)
    sources = [logs.LogSource("spark-a", "container", "A"), logs.LogSource("spark-b", "files", "B"),
               logs.LogSource("spark-b", "container", f"{logs.NOTE_PREFIX}no container")]
    out, err = io.StringIO(), io.StringIO()
    code = logs.stream_logs(INVENTORY, {"spark-a": None, "spark-b": None}, sources,  # type: ignore[dict-item]
                            follow=False, out=out, err=err)
    lines = out.getvalue().splitlines()
    assert code == 0
    assert sorted(lines) == sorted([
        "spark-a container | A line 0", "spark-a container | A line 1",
        "spark-b files     | B line 0", "spark-b files     | B line 1"])
    assert "spark-b: no container" in err.getvalue()


def test_a_vllm_workers_exited_container_is_known_at_once_not_after_ray_notices(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 27: for ~25 s after a Ray worker's container died, status repeated Ray ("ray: 2/2
    node(s) alive", the worker "up"); docker's exit is a fact of the same round trip."""
    vllm = {**SERVER, "engine": "vllm", "main": "vllm.pid", "container": "sparkctl-vllm",
            "nodes": ["spark-a", "spark-b"], "port": 8000}
    ray = {"nodes": [{"host": "spark-a", "ip": "192.168.200.12", "alive": True},
                     {"host": "spark-b", "ip": "192.168.200.13", "alive": True}]}  # Ray's stale view
    facts = {"spark-a": node_facts("spark-a", server=vllm, probe={"/health": 200, "/v1/models": 200},
                                   pids={"vllm.pid": {"pid": 9, "alive": True}}),
             "spark-b": node_facts("spark-b")}
    facts["spark-a"]["commands"]["ray"] = {"rc": 0, "out": json.dumps(ray)}
    facts["spark-a"]["commands"]["managed"] = {"rc": 0, "out": "trtllm-multinode\trunning\n"
                                                             "sparkctl-vllm\trunning\n"}
    facts["spark-b"]["commands"]["managed"] = {"rc": 0, "out": "trtllm-multinode\trunning\n"
                                                             "sparkctl-vllm\texited\n"}
    result = status.assess(INVENTORY, cluster_of(facts), {})
    assert not result["ok"]
    worker = result["nodes"]["spark-b"]
    assert worker["state"] == "problem"
    assert worker["problems"][0].startswith("the server's container sparkctl-vllm is exited here")
    server = result["server"]
    assert server["state"] == "unhealthy"
    assert "the server's container sparkctl-vllm is not running on spark-b (exited)" in server["problem"]
    assert (server["ray"]["alive"], server["ray"]["expected"]) == (1, 2)
    status_render.render_status(result)
    out = capsys.readouterr().out
    assert "ray: 1/2 node(s) alive" in out and "its container is not running on spark-b" in out
    # both containers running: Ray's count stands and nothing is said
    facts["spark-b"]["commands"]["managed"]["out"] = "sparkctl-vllm\trunning\n"
    again = status.assess(INVENTORY, cluster_of(facts), {})
    assert again["ok"], again["nodes"]
    assert again["server"]["state"] == "healthy" and again["server"]["ray"]["alive"] == 2


def test_stream_as_json_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "Stream", FakeStream)
    sources = [logs.LogSource("spark-a", "container", "A"), logs.LogSource("spark-b", "files", "B")]
    out, err = io.StringIO(), io.StringIO()
    code = logs.stream_logs(INVENTORY, {"spark-a": None, "spark-b": None}, sources,  # type: ignore[dict-item]
                            follow=False, out=out, err=err, as_json=True)
    found = [json.loads(line) for line in out.getvalue().splitlines()]
    assert code == 0 and len(found) == 4
    assert {"node": "spark-b", "source": "files", "line": "B line 1"} in found
