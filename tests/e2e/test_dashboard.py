"""`sparkctl dashboard` as a person sees it: Debian's chromium, headless, opens the page of a
2-node lab and reads it over the DevTools protocol, never reloading it. The page shows both
nodes with memory, GPU clock and temperature, then the server once `launch` has started it;
`lab fault gpu-throttle --node spark-b` is flagged on the open page within 10 s and makes
`status` exit 1 with what to do; a hot GPU is flagged as a thermal throttle; /metrics parses
with prometheus_client; `--host 0.0.0.0` without a key exits 2, with one answers 401 without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from chromium import Browser, chromium_path
from conftest import REPO, Lab, Sparkctl, e2e_state, fresh_up
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.lab

STATE = "dashboard"
SERVER = "qwen3-8b"
# a look every second (`status --watch 1`'s pace): this shared 2-core machine takes 2-5 s per
# look (one `status`); the test prints the time from the fault to the flag (target 10 s)
INTERVAL = "1"


sparkctl = Sparkctl(STATE)

class Dashboard:
    """`sparkctl dashboard --port 0` started here (stopped by its PID), and its URL."""

    def __init__(self, lab: Lab, *args: str) -> None:
        env = {**os.environ, "SPARKCTL_STATE_DIR": e2e_state(STATE)}
        self.process = subprocess.Popen(
            [str(REPO / ".venv/bin/sparkctl"), "dashboard", "--inventory", str(lab.inventory),
             "--port", "0", "--interval", INTERVAL, *args],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert self.process.stderr is not None
        line = self.process.stderr.readline()  # printed once it listens
        assert "sparkctl dashboard: http://" in line, line
        self.url = line.split()[2].replace("0.0.0.0", "127.0.0.1")

    def get(self, path: str, key: str | None = None) -> tuple[int, str]:
        request = urllib.request.Request(self.url.rstrip("/") + path, headers={
            "Authorization": f"Bearer {key}"} if key else {})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as refused:
            return refused.code, refused.read().decode()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def page(lab_session: list[Lab]) -> Iterator[tuple[Lab, Dashboard, Browser]]:
    if chromium_path() is None:
        pytest.fail("chromium is not installed: `make install` installs it (APT_PACKAGES)")
    lab = fresh_up(lab_session, sparkctl)
    inventory = ["--inventory", str(lab.inventory)]
    dashboard = Dashboard(lab)
    browser = Browser(dashboard.url)
    try:
        yield lab, dashboard, browser
    finally:
        browser.close()
        dashboard.stop()
        lab.cli("fault", "restore")
        sparkctl("down", *inventory, "--yes")


def card_text(browser: Browser, node: str) -> str:
    return str(browser.evaluate(f"(document.getElementById('node-{node}') || {{}}).innerText || ''"))


def test_the_page_shows_both_nodes_then_the_server_once_launched(
        page: tuple[Lab, Dashboard, Browser], tmp_path: Path) -> None:
    lab, _, browser = page
    browser.wait_for("document.querySelectorAll('.card').length === 2", 60)
    for node in lab.nodes:
        text = card_text(browser, node)
        assert node in text and "GB available" in text, text
        assert "2418 of 3003 MHz" in text and "41 °C" in text and "W" in text, text
    assert browser.evaluate("document.getElementById('no-servers').hidden") is False
    launched = sparkctl("launch", SERVER, "--inventory", str(lab.inventory), "--yes", "--timeout", "240")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    row, _ = browser.wait_for(f"document.getElementById('server-{SERVER}') && document."
                              f"getElementById('server-{SERVER}').innerText.includes('healthy') && "
                              f"document.getElementById('server-{SERVER}').innerText", 30)
    assert SERVER in row and "Qwen/Qwen3-8B" in row and "sglang" in row
    chat = sparkctl("chat", "Hello", "--inventory", str(lab.inventory), "--server", SERVER,
                    "--max-tokens", "16")
    assert chat.returncode == 0, chat.stdout + chat.stderr
    # the engine's TTFT and inter-token histograms, read from its /metrics by the next look
    ttft = f"document.querySelector('#server-{SERVER} td:nth-child(12)').innerText"
    shown, _ = browser.wait_for(f"{ttft}.endsWith(' ms') && {ttft}", 30)
    assert "/" in shown
    assert browser.evaluate("typeof Plotly") == "object"  # the charts' library, from plotly
    assert browser.evaluate("document.querySelectorAll('.js-plotly-plot').length") == 3
    browser.screenshot(tmp_path / "dashboard.png")
    assert (tmp_path / "dashboard.png").read_bytes()[:4] == b"\x89PNG"


def test_the_gateways_requests_show_on_the_open_page(
        page: tuple[Lab, Dashboard, Browser], tmp_path: Path) -> None:
    """Requests through the gateway are counted by the replica's relay and shown as requests
    (and requests/s) on the open page and in /metrics."""
    lab, dashboard, browser = page
    key = tmp_path / "gateway.key"
    key.write_text(f"sk-dash-e2e-{os.getpid()}-{time.time_ns()}\n")
    key.chmod(0o600)
    inventory = ["--inventory", str(lab.inventory)]
    try:
        up = sparkctl("gateway", "up", *inventory, "--host", "0.0.0.0", "--api-key-file",
                      str(key), timeout=400)
        assert up.returncode == 0, up.stdout + up.stderr
        body = json.dumps({"model": "Qwen/Qwen3-8B", "max_tokens": 4,
                           "messages": [{"role": "user", "content": "Hello"}]}).encode()
        for _ in range(3):
            request = urllib.request.Request(
                f"http://{lab.hosts[lab.nodes[0]]}:4000/v1/chat/completions", data=body,
                headers={"Content-Type": "application/json",
                         "Authorization": f"Bearer {key.read_text().strip()}"})
            with urllib.request.urlopen(request, timeout=120) as answer:
                assert answer.status == 200
        gateway = "document.getElementById('gateway').innerText"
        shown, _ = browser.wait_for(f"Number(({gateway}.match(/\\((\\d+) requests/) || [])[1]) >= 3"
                                    f" && {gateway}", 30)
        assert "requests/s" in shown and "errors/s" in shown, shown
        status, text = dashboard.get("/metrics")
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert status == 200 and families["sparkctl_gateway_requests"].samples[0].value >= 3
    finally:
        sparkctl("gateway", "down", *inventory)


def test_a_stuck_gpu_clock_is_flagged_on_the_open_page_without_a_reload(
        page: tuple[Lab, Dashboard, Browser]) -> None:
    lab, _, browser = page
    _, worker = lab.nodes
    flag = f"document.querySelector('#node-{worker} [data-flag=stuck-clock]') !== null"
    assert browser.evaluate(flag) is False
    lab.cli("fault", "gpu-throttle", "--node", worker, check=True)
    started = time.monotonic()  # the fault is in place: the node's nvidia-smi answers 702 MHz
    # the 10 s target is a figure (printed, docs/dashboard.md), not an assertion: under a loaded
    # CI a look alone can take longer; the test proves the open page updates by itself
    browser.wait_for(flag, 30)
    took = browser.evaluate("document.getElementById('updated').innerText")
    print(f"flagged {time.monotonic() - started:.1f} s after the fault ({took})")
    text = card_text(browser, worker)
    assert "702 of 3003 MHz" in text and "GPU clock stuck" in text and "power-cycle" in text
    status = sparkctl("status", "--inventory", str(lab.inventory))
    assert status.returncode == 1, status.stdout
    assert f"{worker}: GPU clock stuck at 702 of 3003 MHz" in status.stdout
    assert "unplug the power adapter" in status.stdout
    lab.cli("fault", "restore", "--node", worker, check=True)
    browser.wait_for(f"!({flag})", 20)  # and the page says so once it is over
    events = str(browser.evaluate("document.getElementById('events').innerText"))
    assert "cleared: GPU clock stuck" in events


def test_a_hot_gpu_is_flagged_and_named_by_status(page: tuple[Lab, Dashboard, Browser]) -> None:
    lab, _, browser = page
    head, _ = lab.nodes
    lab.cli("fault", "gpu-hot", "--node", head, check=True)
    browser.wait_for(f"document.querySelector('#node-{head} [data-flag=thermal-throttle]') !== null", 20)
    assert "93 °C" in card_text(browser, head)
    status = sparkctl("status", "--inventory", str(lab.inventory), "--json")
    assert status.returncode == 1
    assert json.loads(status.stdout)["nodes"][head]["gpu_problems"] == ["thermal-throttle"]
    lab.cli("fault", "restore", "--node", head, check=True)


def test_metrics_parse_with_prometheus_client(page: tuple[Lab, Dashboard, Browser]) -> None:
    lab, dashboard, _ = page
    code, text = dashboard.get("/metrics")
    assert code == 200
    samples = [(s.name, s.labels) for f in text_string_to_metric_families(text) for s in f.samples]
    for node in lab.nodes:
        for name in ("sparkctl_node_memory_available_bytes", "sparkctl_node_gpu_sm_clock_hertz",
                     "sparkctl_node_gpu_temperature_celsius", "sparkctl_node_gpu_power_watts"):
            assert (name, {"node": node}) in samples, (name, node)
    assert any(n == "sparkctl_server_info" and labels["server"] == SERVER for n, labels in samples)
    assert ("sparkctl_server_healthy", {"server": SERVER}) in samples


def test_beyond_loopback_needs_a_key_and_answers_401_without_it(
        page: tuple[Lab, Dashboard, Browser], tmp_path: Path) -> None:
    lab, _, _ = page
    refused = sparkctl("dashboard", "--inventory", str(lab.inventory), "--host", "0.0.0.0")
    assert refused.returncode == 2 and "--api-key-file" in refused.stderr
    key = tmp_path / "dashboard.key"
    key.write_text("e2e-dashboard-key-5120\n")
    key.chmod(0o600)
    keyed = Dashboard(lab, "--host", "0.0.0.0", "--api-key-file", str(key))
    try:
        for path in ("/", "/api/state", "/metrics"):
            code, body = keyed.get(path)
            assert code == 401 and "e2e-dashboard-key" not in body
        assert keyed.get("/metrics", key="e2e-dashboard-key-5120")[0] == 200
    finally:
        keyed.stop()
