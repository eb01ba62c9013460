"""The simulated SGLang's HTTP side: the lab's OpenAI server (server.py) with SGLang's routes.

/health and /health_generate answer 503 until the server is up, then 200 (SGLang 0.5.12,
http_server.py l.505-526); /v1/models lists the served model ("owned_by": "sglang");
/get_model_info; with --enable-metrics, /metrics in Prometheus text with SGLang's names for
speculative decoding (sglang:spec_accept_length, sglang:spec_accept_rate; metrics_collector.py
l.341-347), computed from the drafts the performance model accepted, token counters and the
TTFT and inter-token latency histograms (token_stats.py). With --api-key (or
`api-key:` in a --config YAML), every route but /health* and /metrics* needs `Authorization:
Bearer KEY`, else 401 {"error": "Unauthorized"} (srt/utils/auth.py).
"""
from __future__ import annotations

import os

from .server import EngineState, Handler, Server, start_http


class SglangState(EngineState):
    def __init__(self, opts: dict, config: dict) -> None:
        super().__init__({"model": opts.get("served") or opts["model"], "tp_size": opts["tp"]}, {})
        algo = str(opts.get("algo") or "").upper()
        self.draft_len = int(opts.get("steps") or 0) if algo else 0
        self.collect_stats = True  # the totals behind /metrics
        self.metrics = bool(opts.get("metrics"))
        self.accepted = 0
        self.verify_steps = 0
        self.ready = True
        self.api_key = opts.get("api_key") or None  # --api-key, or `api-key:` of --config

    def record(self, active: int, new: int, decoding: int, accepted: int, seconds: float) -> None:
        with self.stats_lock:
            self.accepted += accepted
            self.verify_steps += decoding

    def prometheus(self) -> str:
        with self.stats_lock:
            steps, accepted = self.verify_steps, self.accepted
        length = (accepted + steps) / steps if steps else 0.0
        rate = accepted / (steps * self.draft_len) if steps and self.draft_len else 0.0
        labels = f'model_name="{self.model}"'
        return (
            "# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.\n"
            "# TYPE sglang:spec_accept_length gauge\n"
            f"sglang:spec_accept_length{{{labels}}} {length}\n"
            "# HELP sglang:spec_accept_rate The average acceptance rate of speculative decoding.\n"
            "# TYPE sglang:spec_accept_rate gauge\n"
            f"sglang:spec_accept_rate{{{labels}}} {rate}\n"
            # the scheduler's load, as SGLang's metrics_collector names it (status shows it)
            "# HELP sglang:num_running_reqs The number of running requests.\n"
            "# TYPE sglang:num_running_reqs gauge\n"
            f"sglang:num_running_reqs{{{labels}}} {len(self.active)}\n"
            "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n"
            "# TYPE sglang:num_queue_reqs gauge\n"
            f"sglang:num_queue_reqs{{{labels}}} {len(self.pending)}\n"
            # token counters, TTFT and inter-token latency histograms (token_stats.py)
            + self.tokens.prometheus("sglang", labels))


class SglangHandler(Handler):
    checks_model = True  # a request naming a model this server does not serve is a 404

    def key_open(self, path: str) -> bool:
        # SGLang 0.5.12 srt/utils/auth.py decide_request_auth: health and metrics always pass
        return path.startswith("/health") or path.startswith("/metrics")

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        st = self.state
        if path == "/health":
            self.send_response(200 if st.healthy() else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/get_model_info":
            self.send_json(200, {"model_path": st.model, "tokenizer_path": st.model,
                                 "is_generation": True})
        elif path == "/metrics":
            if not st.metrics:  # type: ignore[attr-defined]
                self.send_json(404, {"detail": "Not Found"})
                return
            data = st.prometheus().encode()  # type: ignore[attr-defined]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [
                {"id": st.model, "object": "model", "created": 0, "owned_by": "sglang",
                 "root": st.model, "max_model_len": 262144}]})
        else:
            super().do_GET()


def start_sglang_http(opts: dict, config: dict) -> Server:
    host = "127.0.0.1" if opts["host"] == "localhost" else opts["host"]
    pid = os.getpid()
    return start_http(SglangState(opts, config), host, opts["port"], SglangHandler, [
        f"INFO:     Started server process [{pid}]", "INFO:     Waiting for application startup.",
        "INFO:     Application startup complete.",
        f"INFO:     Uvicorn running on http://{host}:{opts['port']} (Press CTRL+C to quit)"])
