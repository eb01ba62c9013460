"""`sparkctl bench` figures against a fake server on loopback with known timing (SSE)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orchestrator.bench.client import Endpoint, RequestResult, run_batch
from orchestrator.bench.run import BenchConfig, Target, run_bench
from orchestrator.bench.stats import cell_figures, decode_tokens, peak_rate
from orchestrator.engines.trtllm.meter import TrtllmMeter

PREFILL_S = 0.20  # the fake server's time to first token
STEP_S = 0.02  # one event every 20 ms
TOKENS_PER_EVENT = 2  # each event carries 2 tokens (like accepted drafts)


class FakeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[dict] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        body = b'{"data": []}' if self.path == "/v1/models" else b"[]"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeHandler.seen.append(body)
        words = sum(len(m["content"].split()) for m in body["messages"])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        start = time.monotonic()

        def send(payload: object) -> None:
            self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
            self.wfile.flush()

        time.sleep(PREFILL_S)
        send({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
        send({"choices": [{"delta": {"content": "a"}}]})  # the first token
        sent = 1
        step = 0
        while sent < body["max_tokens"]:
            step += 1
            # absolute schedule: event k at PREFILL + k * STEP
            time.sleep(max(0.0, start + PREFILL_S + step * STEP_S - time.monotonic()))
            count = min(TOKENS_PER_EVENT, body["max_tokens"] - sent)
            send({"choices": [{"delta": {"content": " b" * count}}]})
            sent += count
        send({"choices": [], "usage": {"prompt_tokens": words, "completion_tokens": sent}})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


@pytest.fixture
def fake() -> Iterator[Endpoint]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHandler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    FakeHandler.seen = []
    yield Endpoint(server.server_address[1], "fake-model")
    server.shutdown()
    server.server_close()


def test_one_stream_measures_the_servers_pace(fake: Endpoint) -> None:
    [result] = run_batch(fake, [[{"role": "user", "content": "one two three four"}]], 41,
                         threading.Event())
    assert result.error is None
    assert result.completion_tokens == 41 and result.prompt_tokens == 4
    assert "return_token_ids" not in FakeHandler.seen[0]  # trtllm-serve refuses it
    figures = cell_figures([[result]], 4, latency=0.0, concurrency=1)
    # 40 tokens after the first over 20 events of 20 ms: 100 t/s
    assert figures["tg_throughput"]["mean"] == pytest.approx(100, rel=0.1)
    assert figures["e2e_ttft_ms"]["mean"] == pytest.approx(PREFILL_S * 1000, rel=0.25)
    assert figures["pp_throughput"]["mean"] == pytest.approx(4 / PREFILL_S, rel=0.25)


def test_concurrent_batch_throughput_is_the_sum(fake: Endpoint) -> None:
    prompts = [[{"role": "user", "content": "w " * 10}] for _ in range(3)]
    results = run_batch(fake, prompts, 21, threading.Event())
    figures = cell_figures([results], 10, latency=0.0, concurrency=3)
    # each request: 20 tokens after the first in 10 events of 20 ms = 100 t/s; batch: ~300
    assert figures["tg_req_throughput"]["mean"] == pytest.approx(100, rel=0.15)
    assert figures["tg_throughput"]["mean"] == pytest.approx(300, rel=0.2)
    assert figures["requests"] == 3 and figures["error_count"] == 0


def test_latency_is_subtracted_from_ttft() -> None:
    r = RequestResult(start=10.0, first_response=10.5, first_token=10.5, end=11.0,
                      chunks=[(10.5, "a", None), (11.0, "b", None)], prompt_tokens=100,
                      completion_tokens=2)
    figures = cell_figures([[r]], 100, latency=0.1, concurrency=1)
    assert figures["e2e_ttft_ms"]["mean"] == pytest.approx(500)
    assert figures["ttft_ms"]["mean"] == pytest.approx(400)
    assert figures["pp_throughput"]["mean"] == pytest.approx(100 / 0.4)


def test_prompt_tokens_from_usage_only_when_close_to_expected() -> None:
    def result(reported: int) -> RequestResult:
        return RequestResult(start=0.0, first_response=1.0, first_token=1.0, end=2.0,
                             chunks=[(1.0, "a", None)], prompt_tokens=reported, completion_tokens=1)

    assert cell_figures([[result(110)]], 100, 0.0, 1)["pp_throughput"]["mean"] == pytest.approx(110)
    assert cell_figures([[result(500)]], 100, 0.0, 1)["pp_throughput"]["mean"] == pytest.approx(100)


def test_token_timestamps_follow_llama_benchy() -> None:
    spread = RequestResult(start=0.0, first_token=1.0, chunks=[(1.0, "a", None), (2.0, "b", None)],
                           completion_tokens=5)
    assert spread.token_timestamps() == [1.0, 1.25, 1.5, 1.75, 2.0]
    ids = RequestResult(start=0.0, first_token=1.0, chunks=[(1.0, "a", [1]), (2.0, "bc", [2, 3])])
    assert ids.token_timestamps() == [1.0, 1.5, 2.0]
    no_usage = RequestResult(chunks=[(1.0, "a", None), (3.0, "b", None)])
    assert no_usage.token_timestamps() == [1.0, 3.0]
    assert decode_tokens([1.0, 1.0, 2.0]) == 1


def test_peak_uses_a_one_second_window() -> None:
    assert peak_rate([0.0, 0.1, 0.2, 0.3, 5.0, 5.5]) == 4  # 4 tokens inside one second
    assert peak_rate([0.0, 0.25, 0.5]) == pytest.approx(6)  # burst shorter than 1 s: 3/0.5
    assert peak_rate([]) == 0.0


def test_failed_requests_are_counted_not_averaged() -> None:
    ok = RequestResult(start=0.0, first_response=0.5, first_token=0.5, end=1.5,
                       chunks=[(0.5, "a", None), (1.5, "b", None)], prompt_tokens=10,
                       completion_tokens=11)
    figures = cell_figures([[ok, RequestResult(error="HTTP 400: nope")]], 10, 0.0, 2)
    assert figures["error_count"] == 1 and figures["errors"] == ["HTTP 400: nope"]
    assert figures["tg_req_throughput"]["mean"] == pytest.approx(10)


def test_run_bench_covers_every_cell_and_reports_progress(fake: Endpoint) -> None:
    lines: list[str] = []
    target = Target(fake, TrtllmMeter(lambda: "[]"), lambda: {"spark-a": {"power_w": 4.0}},
                    lines.append)
    config = BenchConfig(tg=[5], pp=[8], depth=[0, 16], concurrency=[1, 2], runs=1, warmup=False)
    doc = run_bench(config, target)
    assert [(c["depth"], c["concurrency"]) for c in doc["cells"]] == [(0, 1), (0, 2), (16, 1), (16, 2)]
    assert all(c["figures"]["tg_throughput"] for c in doc["cells"])
    assert doc["cells"][0]["nodes"] == {"spark-a": {"power_w": 4.0}}
    first = doc["cells"][0]
    assert first["spec_decoding"] is None and "enable_iter_perf_stats" in first["spec_note"]
    assert any("requests left" in line for line in lines)
    deep = [m for m in FakeHandler.seen if m["messages"][0]["role"] == "system"]
    assert deep and len(deep[0]["messages"][0]["content"].split()) == 16
    assert "tg_throughput" in doc["definitions"]
