"""Issue 37's gateway traffic and transfers on `sparkctl dashboard`: the relays count requests
and errors (a real relay process and a real socket engine), the dashboard rates them between
looks on the page and in /metrics; a launch's downloads and copies leave progress records that
the dashboard shows as rows and events, and removes when they end."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient
from test_dashboard import IDLE, Looks, look_of
from test_gateway import free_port, wait_for

from orchestrator.core.transfers import Transfers, read_transfers
from orchestrator.dashboard.app import build_app
from orchestrator.dashboard.watch import Watcher
from orchestrator.node import script
from orchestrator.phases.fanout import FanoutProgress

MODEL = "Qwen/Qwen3-8B"


def test_a_relay_counts_requests_and_the_answers_that_failed(tmp_path: Path) -> None:
    engine = socket.socket()
    engine.bind(("127.0.0.1", 0))
    engine.listen(4)
    answers = [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
               b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n",
               b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\n\r\n"]

    def serve() -> None:  # one kept-alive connection, three exchanges
        inner, _ = engine.accept()
        with inner:
            for answer in answers:
                inner.recv(4096)
                inner.sendall(answer)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    port, state = free_port(), tmp_path / "relay.json"
    args = {"listen": "127.0.0.1", "port": port, "target": engine.getsockname()[1],
            "state": str(state), "pidfile": str(tmp_path / "relay.pid"), "allow": None}
    relay = subprocess.Popen([sys.executable, "-c", script("relay.py"), json.dumps(args)])
    try:
        assert wait_for(state, lambda s: s["accepting"])["requests"] == 0
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            for answer in answers:
                client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
                got = b""
                while len(got) < len(answer):
                    got += client.recv(4096)
        server.join(5)
        engine.close()  # no engine any more: the next request is an error too
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            client.sendall(b"GET /health HTTP/1.1\r\n\r\n")
            client.recv(16)
        counted = wait_for(state, lambda s: s["requests"] == 4)
        assert counted["errors"] == 3  # the 500, the 429 and the missing engine
    finally:
        relay.terminate()
        relay.wait(10)
        engine.close()


def with_traffic(requests: int, errors: int, model: str = MODEL) -> dict[str, Any]:
    look = look_of(IDLE)
    look["gateway"]["models"][MODEL].update(requests=requests, errors=errors)
    look["gateway"]["relays"] = {"spark-a/qwen": {"model": model, "requests": requests,
                                                  "errors": errors}}
    return look


def test_requests_and_errors_per_second_come_from_the_relay_counters_between_looks() -> None:
    clock = iter((1000.0, 1004.0, 1008.0))
    watcher = Watcher(Looks(with_traffic(10, 1), with_traffic(50, 3), with_traffic(2, 0)), 4.0,
                      clock=lambda: next(clock))
    client = TestClient(build_app(watcher))
    watcher.look_once()
    assert client.get("/api/state").json()["gateway"]["requests_per_s"] is None
    watcher.look_once()
    gateway = client.get("/api/state").json()["gateway"]
    assert gateway["requests_per_s"] == 10 and gateway["errors_per_s"] == 0.5
    assert gateway["rates"][MODEL] == {"requests_per_s": 10, "errors_per_s": 0.5}
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    assert families["sparkctl_gateway_requests_per_second"].samples[0].value == 10
    assert families["sparkctl_gateway_errors_per_second"].samples[0].value == 0.5
    assert families["sparkctl_gateway_requests"].samples[0].value == 50  # a counter: _total
    assert families["sparkctl_gateway_errors"].samples[0].labels == {"model": MODEL}
    watcher.look_once()  # the relay started again (counters back to 2): no rate from it
    assert client.get("/api/state").json()["gateway"]["requests_per_s"] == 0


def test_a_download_and_a_copy_leave_records_while_they_run(tmp_path: Path) -> None:
    now = [100.0]
    board = Transfers("lab-b2b", tmp_path, clock=lambda: now[0])
    board.update("download", "spark-a", MODEL, line="starting")
    board.update("download", "spark-a", MODEL, line="model.safetensors:  40%|####  | 2.1G/5.2G")
    assert read_transfers("lab-b2b", tmp_path)[0].percent is None  # not a second yet: unwritten
    now[0] = 101.5
    board.update("download", "spark-a", MODEL, line="model.safetensors:  40%|####  | 2.1G/5.2G")
    bar = FanoutProgress(lambda _line: None, on_update=lambda peer, done, total, rate: board.update(
        "copy", peer, f"spark-a -> {peer}", done=done, total=total, rate=rate))
    bar.start("spark-b", 4_000_000_000)
    bar.update("spark-b", 1_000_000_000, 4_000_000_000, 2e9)
    found = {t.kind: t for t in read_transfers("lab-b2b", tmp_path)}
    assert found["download"].percent == 40 and found["download"].node == "spark-a"
    assert found["copy"].node == "spark-b" and found["copy"].total_bytes == 4_000_000_000
    assert found["copy"].done_bytes == 0  # the 1 GB update came within the second
    now[0] = 103.0
    bar.update("spark-b", 4_000_000_000, 4_000_000_000, 2e9)  # reaching the total: written
    assert {t.kind: t for t in read_transfers("lab-b2b", tmp_path)}["copy"].percent == 100
    assert read_transfers("another", tmp_path) == []
    board.close()
    assert read_transfers("lab-b2b", tmp_path) == [] and not list(tmp_path.rglob("*.json"))


def test_a_killed_runs_record_is_not_shown_and_the_next_run_removes_it(tmp_path: Path) -> None:
    board = Transfers("lab", tmp_path)
    board.update("download", "spark-a", MODEL, line="10%")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    record = next((tmp_path / "transfers" / "lab").glob("*.json"))
    doc = json.loads(record.read_text())
    (record.parent / "left.json").write_text(json.dumps({**doc, "pid": dead.pid, "what": "x"}))
    assert [t.what for t in read_transfers("lab", tmp_path)] == [MODEL]
    Transfers("lab", tmp_path)  # the next run's
    assert not (record.parent / "left.json").exists() and record.exists()
    assert doc["pid"] == os.getpid()


def test_transfers_show_on_the_page_in_metrics_and_as_events(tmp_path: Path) -> None:
    board = Transfers("lab", tmp_path)
    clock = iter((1000.0, 1005.0, 1010.0))
    watcher = Watcher(Looks(look_of(IDLE)), 5.0, clock=lambda: next(clock),
                      transfers=lambda: read_transfers("lab", tmp_path))
    client = TestClient(build_app(watcher))
    watcher.look_once()
    board.update("copy", "spark-b", "spark-a -> spark-b", done=3_000_000_000,
                 total=4_000_000_000, rate=1.5e9)
    watcher.look_once()
    view = client.get("/api/state").json()
    row = view["transfers"][0]
    assert row["kind"] == "copy" and row["percent"] == 75 and row["bytes_per_s"] == 1.5e9
    assert view["events"][0]["text"] == "copy of spark-a -> spark-b started"
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    sample = families["sparkctl_transfer_progress_ratio"].samples[0]
    assert sample.value == 0.75 and sample.labels["node"] == "spark-b"
    board.close()
    watcher.look_once()
    view = client.get("/api/state").json()
    assert view["transfers"] == []
    assert view["events"][0]["text"] == "copy of spark-a -> spark-b ended at 75 %"
