"""`sparkctl dashboard` without a browser: one look shared by every reader, events between
looks, the page's data, /metrics read back with prometheus_client's parser, the API key (401
without it), read-only routes, the CLI's bind rule and its message without the web extra, and
`--help` never importing the web stack."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import cluster_of
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient
from test_status import INVENTORY, node_facts
from test_status_gpu import with_gpu

from orchestrator.cli import cli
from orchestrator.commands import Secret
from orchestrator.dashboard.app import authorized, build_app
from orchestrator.dashboard.watch import Watcher
from orchestrator.errors import TransportError
from orchestrator.status import assess as status

ROOT = Path(__file__).resolve().parents[2]
IDLE = "[N/A], [N/A], 3, 2418, 3003, 41, 4.12, 0x0000000000000001"
STUCK = "[N/A], [N/A], 97, 702, 3003, 58, 31.05, 0x0000000000000000"
SERVER = {"name": "qwen", "engine": "sglang", "model": "Qwen/Qwen3-8B", "nodes": ["spark-a"],
          "recipe": "qwen3-8b", "ranks": 1,
          "node": "spark-a", "host": "127.0.0.1", "port": 30000, "state": "healthy",
          "metrics": {"ok": True, "requests_running": 2.0, "requests_waiting": 1.0,
                      "kv_cache_usage": 0.25}}


def look_of(b_gpu: str, server_state: str = "healthy") -> dict[str, Any]:
    """What gather_status returns: the assessment of both nodes' facts, servers, gateway."""
    facts = {"spark-a": with_gpu(node_facts("spark-a"), IDLE),
             "spark-b": with_gpu(node_facts("spark-b"), b_gpu)}
    facts["spark-a"]["commands"]["model_cache"] = {"rc": 0, "out": "812345678901\n"}
    facts["spark-a"]["commands"]["ethtool:enp1s0f1np1"] = {
        "rc": 0, "out": "Settings for enp1s0f1np1:\n\tSpeed: 200000Mb/s\n\tDuplex: Full\n"}
    result = status.assess(INVENTORY, cluster_of(facts), {})
    result["servers"] = [{**SERVER, "state": server_state}]
    result["gateway"] = {"running": True, "node": "spark-a", "host": "127.0.0.1", "port": 4000,
                         "key": False, "live": True,
                         "models": {"Qwen/Qwen3-8B": {"replicas": 1, "in_rotation": 1}}}
    return result


class Looks:
    """A scripted cluster: each look returns the next answer (or raises it)."""

    def __init__(self, *answers: Any) -> None:
        self.answers, self.count = list(answers), 0

    def __call__(self) -> dict[str, Any]:
        answer = self.answers[min(self.count, len(self.answers) - 1)]
        self.count += 1
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]


def test_looks_are_shared_and_changes_become_events() -> None:
    looks = Looks(look_of(IDLE, "loading"), look_of(STUCK),
                  TransportError("spark-b: connection refused"), look_of(IDLE))
    clock = iter(range(1000, 2000, 5))
    watcher = Watcher(looks, 5.0, clock=lambda: float(next(clock)))
    client = TestClient(build_app(watcher))
    assert client.get("/api/state").json()["state"] == "looking"  # no look yet: nothing asked
    assert looks.count == 0
    watcher.look_once()
    for _ in range(3):  # any number of readers: still one look
        client.get("/api/state")
        client.get("/metrics")
    assert looks.count == 1
    watcher.look_once()
    view = client.get("/api/state").json()
    b = next(n for n in view["nodes"] if n["name"] == "spark-b")
    assert b["gpu_problems"] == ["stuck-clock"] and b["sm_clock_mhz"] == 702
    assert b["max_sm_clock_mhz"] == 3003 and b["temperature_c"] == 58 and b["power_w"] == 31.05
    assert view["servers"][0]["figures"] == {"requests_running": 2, "requests_waiting": 1,
                                             "kv_cache_usage": 0.25}
    assert view["servers"][0]["recipe"] == "qwen3-8b" and view["servers"][0]["ranks"] == 1
    texts = [(e["subject"], e["text"]) for e in view["events"]]
    assert ("qwen", "server healthy (was loading)") in texts
    assert any(s == "spark-b" and t.startswith("GPU clock stuck at 702") for s, t in texts)
    assert [p["sm_clock_mhz"]["spark-b"] for p in view["history"]] == [2418, 702]
    watcher.look_once()  # a failed look: shown, the last good figures stay charted
    view = client.get("/api/state").json()
    assert view["error"] == "spark-b: connection refused" and len(view["history"]) == 2
    assert view["events"][0]["text"] == "could not look: spark-b: connection refused"
    watcher.look_once()
    texts = [e["text"] for e in client.get("/api/state").json()["events"]]
    assert "looking works again" in texts and any(t.startswith("cleared: GPU clock stuck")
                                                  for t in texts)


def test_metrics_parse_with_the_reference_parser_and_carry_node_and_server_series() -> None:
    watcher = Watcher(Looks(look_of(STUCK)), 5.0)
    watcher.look_once()
    answer = TestClient(build_app(watcher)).get("/metrics")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(answer.text) for s in family.samples}
    assert samples[("sparkctl_node_gpu_sm_clock_hertz", (("node", "spark-b"),))] == 702e6
    assert samples[("sparkctl_node_gpu_sm_clock_max_hertz", (("node", "spark-a"),))] == 3003e6
    assert samples[("sparkctl_node_gpu_temperature_celsius", (("node", "spark-b"),))] == 58
    assert samples[("sparkctl_node_gpu_guard_problem", (("kind", "stuck-clock"), ("node", "spark-b")))] == 1
    assert samples[("sparkctl_node_up", (("node", "spark-a"),))] == 1
    assert samples[("sparkctl_node_model_cache_free_bytes", (("node", "spark-a"),))] == 812.3e9
    assert ("sparkctl_node_model_cache_free_bytes", (("node", "spark-b"),)) not in samples
    a_link = (("interface", "enp1s0f1np1"), ("node", "spark-a"))
    assert samples[("sparkctl_node_link_speed_bits_per_second", a_link)] == 200e9
    assert samples[("sparkctl_node_link_ok", a_link)] == 1
    assert ("sparkctl_node_link_speed_bits_per_second", (("interface", "enp1s0f1np1"),
                                                         ("node", "spark-b"))) not in samples
    assert samples[("sparkctl_server_requests_running", (("server", "qwen"),))] == 2
    assert samples[("sparkctl_server_healthy", (("server", "qwen"),))] == 1
    assert samples[("sparkctl_gateway_replicas_in_rotation", (("model", "Qwen/Qwen3-8B"),))] == 1
    assert samples[("sparkctl_look_ok", ())] == 1


def test_the_page_and_its_files_are_served_from_the_package_read_only() -> None:
    client = TestClient(build_app(Watcher(Looks(look_of(IDLE)), 5.0)))
    page = client.get("/")
    assert page.status_code == 200 and "/static/plotly.min.js" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert "<script>" not in page.text  # no inline script: the policy forbids it
    charts = client.get("/static/plotly.min.js")
    assert charts.status_code == 200 and len(charts.content) > 1_000_000  # plotly's own build
    assert client.get("/static/dashboard.js").status_code == 200
    for method in ("post", "put", "delete"):
        assert getattr(client, method)("/api/state").status_code == 405


def test_with_a_key_every_route_needs_it() -> None:
    client = TestClient(build_app(Watcher(Looks(look_of(IDLE)), 5.0), Secret("s3cret-key")))
    for path in ("/", "/api/state", "/metrics", "/static/plotly.min.js"):
        refused = client.get(path)
        assert refused.status_code == 401 and "s3cret" not in refused.text
        assert refused.headers["www-authenticate"].startswith('Basic realm="sparkctl dashboard"')
    assert client.get("/metrics", headers={"Authorization": "Bearer s3cret-key"}).status_code == 200
    basic = base64.b64encode(b"anyone:s3cret-key").decode()
    assert client.get("/", headers={"Authorization": f"Basic {basic}"}).status_code == 200
    assert client.get("/", headers={"Authorization": "Bearer s3cret-kez"}).status_code == 401
    assert not authorized("Basic !!!", Secret("k")) and not authorized("Digest k", Secret("k"))


@pytest.fixture
def inventory_file(tmp_path: Path) -> Path:
    path = tmp_path / "inv.yml"
    path.write_text("cluster: {name: two, ssh_key: /k}\nfabric: {interfaces: [enp1s0f1np1]}\n"
                    "nodes:\n  - {name: spark-a, host: a}\n")
    return path


def test_beyond_loopback_needs_a_key_file_only_you_can_read(tmp_path: Path, inventory_file: Path) -> None:
    runner = CliRunner()
    refused = runner.invoke(cli, ["dashboard", "-i", str(inventory_file), "--host", "0.0.0.0"])
    assert refused.exit_code == 2 and "--api-key-file" in refused.output
    key = tmp_path / "key"
    key.write_text("s3cret-key\n")
    key.chmod(0o644)
    loose = runner.invoke(cli, ["dashboard", "-i", str(inventory_file), "--host", "0.0.0.0",
                                "--api-key-file", str(key)])
    assert loose.exit_code == 2 and "chmod 600" in loose.output and "s3cret" not in loose.output
    named = runner.invoke(cli, ["dashboard", "-i", str(inventory_file), "--host", "spark.lan"])
    assert named.exit_code == 2 and "not an IP address" in named.output


def test_without_the_web_extra_it_says_how_to_install_it(
        inventory_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "uvicorn" else real(name, *a))
    result = CliRunner().invoke(cli, ["dashboard", "-i", str(inventory_file)])
    assert result.exit_code == 2
    assert "pip install 'dgx-sparkctl[dashboard]'" in result.output and "uvicorn" in result.output


def test_help_never_imports_the_web_stack() -> None:
    code = ("import sys\nfrom orchestrator.cli import cli\n"
            "for args in (['--help'], ['dashboard', '--help']):\n"
            "    try:\n        cli(args, prog_name='sparkctl')\n    except SystemExit:\n        pass\n"
            "heavy = sorted(m for m in ('starlette', 'uvicorn', 'plotly', 'orchestrator.dashboard')"
            " if m in sys.modules)\nprint('IMPORTED', heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert "A live web page (and /metrics)" in out and "--api-key-file" in out
    assert out.strip().endswith("IMPORTED []")


def test_the_sample_grafana_dashboard_asks_only_for_series_the_dashboard_serves() -> None:
    import json
    import re

    watcher = Watcher(Looks(look_of(STUCK)), 5.0)
    watcher.look_once()
    served = {f.name for f in text_string_to_metric_families(
        TestClient(build_app(watcher)).get("/metrics").text)}
    grafana = json.loads((ROOT / "docs/grafana-dashboard.json").read_text())
    asked = {name for panel in grafana["panels"] for target in panel["targets"]
             for name in re.findall(r"sparkctl_[a-z_]+", target["expr"])}
    assert asked and asked <= served, asked - served


def test_decode_and_prefill_rates_come_from_the_counters_between_looks() -> None:
    def with_tokens(generated: float, prompted: float) -> dict[str, Any]:
        look = look_of(IDLE)
        look["servers"][0]["metrics"] = {**SERVER["metrics"], "generation_tokens": generated,
                                         "prompt_tokens": prompted, "ttft_p50_s": 0.05,
                                         "ttft_p95_s": 0.25}
        return look

    clock = iter((1000.0, 1004.0, 1008.0))
    watcher = Watcher(Looks(with_tokens(100, 50), with_tokens(300, 250), with_tokens(10, 5)),
                      4.0, clock=lambda: next(clock))
    client = TestClient(build_app(watcher))
    watcher.look_once()
    assert "decode_tokens_per_s" not in client.get("/api/state").json()["servers"][0]["figures"]
    watcher.look_once()
    figures = client.get("/api/state").json()["servers"][0]["figures"]
    assert figures["decode_tokens_per_s"] == 50 and figures["prefill_tokens_per_s"] == 50
    metrics = client.get("/metrics").text
    assert 'sparkctl_server_decode_tokens_per_second{server="qwen"} 50.0' in metrics
    assert 'sparkctl_server_time_to_first_token_seconds{quantile="0.95",server="qwen"} 0.25' in metrics
    watcher.look_once()  # counters went back (a restarted server): no rate, not a negative one
    assert "decode_tokens_per_s" not in client.get("/api/state").json()["servers"][0]["figures"]


def test_a_taken_port_is_named_before_anything_serves() -> None:
    import socket

    from orchestrator.dashboard.app import listening_socket
    from orchestrator.errors import SparkctlError

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        with pytest.raises(SparkctlError, match=f"cannot listen on 127.0.0.1:{port}: .*pick another --port"):
            listening_socket("127.0.0.1", port)
    finally:
        holder.close()
    free = listening_socket("127.0.0.1", 0)
    assert free.getsockname()[1] > 0
    free.close()


def test_the_command_loads_the_inventory_binds_and_serves_what_it_built(
        inventory_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.dashboard import app as web
    from orchestrator.dashboard import watch

    served: list[Any] = []
    monkeypatch.setattr(web, "serve", lambda app, sock: served.append((app, sock.getsockname())))
    monkeypatch.setattr(watch.Watcher, "start", lambda self: served.append(("start", self.interval)))
    monkeypatch.setattr(watch.Watcher, "stop", lambda self: served.append("stop"))
    result = CliRunner().invoke(cli, ["dashboard", "-i", str(inventory_file), "--port", "0",
                                      "--interval", "3"])
    assert result.exit_code == 0, result.output
    assert "sparkctl dashboard: http://127.0.0.1:" in result.output and "every 3s" in result.output
    assert served[0] == ("start", 3.0) and served[-1] == "stop"
    app, (host, port) = served[1]
    assert isinstance(app, web.KeyGuard) and app.key is None and host == "127.0.0.1" and port > 0
    missing = CliRunner().invoke(cli, ["dashboard", "-i", str(inventory_file.with_name("none.yml"))])
    assert missing.exit_code == 2 and "inventory file not found" in missing.output


def test_the_fabric_section_shows_the_last_netcheck_of_this_cluster(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from orchestrator.advise.fabric import save_last
    from orchestrator.dashboard.view import last_netcheck
    from orchestrator.netcheck.results import CheckResult

    checks = [CheckResult("speed", "spark-a", "pass", "ok", interface="enp1s0f1np1",
                          value=200000, unit="Mb/s"),
              CheckResult("latency", "spark-a", "warn", "slow", peer="spark-b", value=0.41, unit="ms"),
              CheckResult("ssh", "spark-a", "pass", "reached")]  # measured nothing: left out
    doc = {"command": "netcheck", "ok": True, "checks": [c.to_json() for c in checks]}
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(tmp_path))
    save_last(doc, INVENTORY)  # netcheck's own writer
    watcher = Watcher(Looks(look_of(IDLE)), 5.0)
    client = TestClient(build_app(watcher, None, lambda: last_netcheck(tmp_path, "two-sparks")))
    shown = client.get("/api/state").json()["netcheck"]
    figures = [(f["check"], f["value"], f["unit"], f["status"]) for f in shown["figures"]]
    assert shown["saved"] and figures == [("speed", 200000, "Mb/s", "pass"),
                                          ("latency", 0.41, "ms", "warn")]
    assert last_netcheck(tmp_path, "another-cluster").figures == []
    (tmp_path / "netcheck-last.json").write_text("{not json")
    assert last_netcheck(tmp_path, "two-sparks") == last_netcheck(tmp_path / "none", "two-sparks")
    assert json.loads(TestClient(build_app(watcher)).get("/api/state").text)["netcheck"]["saved"] == ""
