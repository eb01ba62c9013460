"""The OpenAI-compatible HTTP side of the simulated trtllm-serve (stdlib ThreadingHTTPServer)."""
from __future__ import annotations

import hashlib
import hmac
import json
import queue
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import perf_model
from .common import image_version, trt_log
from .llm_args import draft_model
from .token_stats import TokenStats

WORDS = ("the", "city", "light", "river", "bread", "museum", "evening", "streets", "art",
         "history", "cafe", "people", "walk", "bridge", "market", "music", "quiet", "old",
         "garden", "view", "and", "of", "with", "a", "is", "beautiful", "because", "its",
         "many", "small", "squares", "wine")


class Job:
    """One request inside the simulated engine: tokens come out per iteration, as chunks."""

    def __init__(self, prompt_tokens: int, words: list[str], offset: float) -> None:
        self.prompt_tokens = prompt_tokens
        self.words = words
        self.sent = 0
        self.steps = 0
        self.offset = offset
        self.last = time.monotonic()  # arrival, then each emit: TTFT and inter-token latency
        self.chunks: queue.Queue[list[str] | None] = queue.Queue()

    @property
    def done(self) -> bool:
        return self.sent >= len(self.words)

    def emit(self, count: int) -> int:
        count = min(count, len(self.words) - self.sent)
        self.chunks.put(self.words[self.sent:self.sent + count])
        self.sent += count
        if self.done:
            self.chunks.put(None)
        return count


class EngineState:
    """Rank 0's engine: an in-flight batching scheduler paced by perf_model (wall clock).

    Each iteration runs the context phase of the requests that arrived (each yields its first
    token) and one decode step of the others (each yields 1 + accepted draft tokens)."""

    def __init__(self, cli: dict, options: dict) -> None:
        self.model = cli["model"]
        self.options = options
        self.ready = False
        self.leader = None
        self.spec = options.get("speculative_config") or {}
        self.collect_stats = bool(options.get("enable_iter_perf_stats"))
        self.stats: list[dict] = []
        self.stats_lock = threading.Lock()
        self.iteration = 0
        self.tp = int(options.get("tensor_parallel_size") or cli.get("tp_size") or 1)
        self.perf = perf_model.spec_of(self.model)
        self.draft_len = int(self.spec.get("max_draft_len") or 0) if draft_model(self.spec) or \
            self.spec.get("decoding_type") in ("MTP", "NGram") else 0
        self.cond = threading.Condition()
        self.pending: list[Job] = []
        self.active: list[Job] = []
        self.tokens = TokenStats()  # what /metrics publishes where the engine has them
        threading.Thread(target=self.loop, daemon=True).start()

    def healthy(self) -> bool:
        return self.ready and not (self.leader and self.leader.dead)

    def submit(self, prompt: str, max_tokens: int, prompt_tokens: int | None = None) -> Job:
        """Deterministic tokens from the prompt; one rendezvous step per request."""
        if self.leader:
            self.leader.forward()
        seed = hashlib.sha256(prompt.encode()).digest()
        words = [WORDS[hashlib.sha256(seed + i.to_bytes(4, "big")).digest()[0] % len(WORDS)]
                 for i in range(max(max_tokens, 1))]
        job = Job(prompt_tokens or len(prompt.split()), words, seed[0] / 256)
        with self.cond:
            self.pending.append(job)
            self.cond.notify()
        return job

    def generate(self, prompt: str, max_tokens: int) -> list[str]:
        job = self.submit(prompt, max_tokens)
        out: list[str] = []
        while (chunk := job.chunks.get()) is not None:
            out += chunk
        return out

    def loop(self) -> None:
        clock = 0.0
        while True:
            with self.cond:
                while not self.pending and not self.active:
                    self.cond.wait()
                new, self.pending = self.pending, []
            decoding = list(self.active)
            seconds = sum(perf_model.prefill_seconds(self.perf, self.tp, j.prompt_tokens)
                          for j in new)
            if decoding:
                seconds += perf_model.step_seconds(self.perf, self.tp, len(decoding),
                                                   self.draft_len)
            now = time.monotonic()
            # absolute pacing while busy: jitter in one iteration is made up in the next (no
            # drift); after idling (or falling > 0.5 s behind) the clock restarts from now
            clock = (clock if decoding and now - clock < 0.5 else now) + seconds
            if clock > now:
                time.sleep(clock - now)
            emitted = time.monotonic()
            for job in new:
                job.emit(1)  # the context phase yields the first token
                self.tokens.first_token(job.prompt_tokens, emitted - job.last)
                job.last = emitted
            accepted = 0
            for job in decoding:
                draw = (job.offset + job.steps * perf_model.ACCEPT_SEQUENCE) % 1.0
                hit = perf_model.accepted_draw(self.draft_len, draw) if self.draft_len else 0
                job.steps += 1
                accepted += hit
                self.tokens.tokens(job.emit(1 + hit), emitted - job.last)
                job.last = emitted
            self.record(len(new) + len(decoding), len(new), len(decoding), accepted, seconds)
            with self.cond:
                self.active = [j for j in decoding + new if not j.done]

    def record(self, active: int, new: int, decoding: int, accepted: int, seconds: float) -> None:
        """One iteration's stats, with TensorRT-LLM's field names (IterationStats JSON)."""
        if not self.collect_stats:
            return
        with self.stats_lock:
            self.iteration += 1
            ms = round(seconds * 1000, 3)
            entry: dict = {"iter": self.iteration, "iterLatencyMS": ms,
                           "numActiveRequests": active, "numNewActiveRequests": new,
                           "gpuMemUsage": 0, "cpuMemUsage": 0, "pinnedMemUsage": 0,
                           "timestamp": time.strftime("%m-%d-%Y %H:%M:%S")}
            if self.draft_len:  # every iteration, zeros when no request drafted
                entry["specDecodingStats"] = {
                    "numDraftTokens": self.draft_len * decoding, "numAcceptedTokens": accepted,
                    "numRequestsWithDraftTokens": decoding,
                    "acceptanceLength": (accepted + decoding) / decoding if decoding else 0.0,
                    "iterLatencyMS": ms,
                    "draftOverhead": perf_model.DRAFT_COST * self.draft_len /
                    (1 + (perf_model.DRAFT_COST + perf_model.VERIFY_COST) * self.draft_len)}
            self.stats.append(entry)
            del self.stats[:-1000]

    def drain(self) -> list[dict]:
        with self.stats_lock:
            out, self.stats = self.stats, []
            return out


def prompt_of(body: dict, chat: bool) -> str:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages: Field required")
        parts = []
        for m in messages:
            content = m.get("content", "") if isinstance(m, dict) else ""
            if isinstance(content, list):
                content = " ".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
            parts.append(f"{m.get('role', 'user')}: {content}")
        return "\n".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = " ".join(map(str, prompt))
    if not isinstance(prompt, str):
        raise ValueError("prompt: Field required")
    return prompt


class Handler(BaseHTTPRequestHandler):
    state: EngineState
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, fmt: str, *args: object) -> None:
        pass

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        phrase = self.responses.get(int(code), ("",))[0] if str(code).isdigit() else ""
        print(f'INFO:     {self.client_address[0]}:{self.client_address[1]} - "{self.command} '
              f'{self.path} HTTP/1.1" {code} {phrase}', file=sys.stderr, flush=True)

    def send_json(self, code: int, payload: object) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    checks_model = False  # trtllm-serve (the lab's default server) does not compare the name

    def key_open(self, path: str) -> bool:
        """Whether the engine answers PATH without its API key (each engine's own rule)."""
        return False

    def key_refused(self) -> None:
        """The engine's own 401 (SGLang's and vLLM's body: {"error": "Unauthorized"})."""
        self.send_json(401, {"error": "Unauthorized"})

    def parse_request(self) -> bool:
        """An engine started with an API key checks `Authorization: Bearer KEY` before any
        route, as their middlewares do (OPTIONS and the engine's open paths pass)."""
        if not super().parse_request():
            return False
        key = getattr(self.state, "api_key", None)
        if not key or self.command == "OPTIONS" or self.key_open(self.path.split("?")[0]):
            return True
        scheme, _, given = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given, key):
            return True
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)  # the connection stays usable for the next request
        self.key_refused()
        return False

    def send_error_json(self, code: int, message: str) -> None:
        kinds = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}
        self.send_json(code, {"object": "error", "message": message,
                              "type": kinds.get(code, "InternalServerError"), "param": None,
                              "code": code})

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        st = self.state
        if path == "/health":
            self.send_response(200 if st.healthy() else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/health_generate":
            try:
                if not st.healthy():
                    raise RuntimeError("engine not ready")
                st.generate("health", 1)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
            except Exception as exc:
                self.send_error_json(503, f"health_generate failed: {exc}")
        elif path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [
                {"id": st.model, "object": "model", "created": int(time.time()),
                 "owned_by": "tensorrt_llm"}]})
        elif path == "/metrics":
            self.send_json(200, st.drain())
        elif path == "/version":
            self.send_json(200, {"version": image_version("1.3.0rc13") + "-sparklab"})
        else:
            self.send_json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        path = self.path.split("?")[0]
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self.send_json(404, {"detail": "Not Found"})
            return
        chat = path.endswith("chat/completions")
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(body, dict):
                raise ValueError("body must be a JSON object")
            prompt = prompt_of(body, chat)
            max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 64)
        except (ValueError, TypeError) as exc:
            self.send_error_json(400, str(exc))
            return
        model = body.get("model")
        if model and self.checks_model and model != self.state.model:
            # vLLM's and SGLang's servers look the name up among the served ones and answer 404
            self.send_error_json(404, f"The model `{model}` does not exist.")
            return
        if "return_token_ids" in body:
            # recent trtllm-serve validates requests strictly and refuses this vLLM extension
            self.send_error_json(400, "1 validation error for ChatCompletionRequest\n"
                                 "return_token_ids\n  Extra inputs are not permitted "
                                 "[type=extra_forbidden, input_value=True, input_type=bool]")
            return
        if not self.state.healthy():
            self.send_error_json(503, "The engine is not ready or an executor worker died")
            return
        prompt_tokens = len(prompt.split()) + (4 if chat else 0)
        try:
            job = self.state.submit(prompt, max_tokens, prompt_tokens)
        except Exception as exc:
            trt_log("E", f"Request failed: {exc}")
            self.send_error_json(500, f"Executor worker failed: {exc}")
            return
        self.reply(body, chat, prompt_tokens, job)

    def reply(self, body: dict, chat: bool, prompt_tokens: int, job: Job) -> None:
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        model = body.get("model") or self.state.model
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(job.words)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        obj = "chat.completion" if chat else "text_completion"
        if not body.get("stream"):
            while job.chunks.get() is not None:
                pass
            text = " ".join(job.words)
            choice: dict = {"index": 0, "logprobs": None, "finish_reason": "length",
                            "stop_reason": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": text,
                                     "reasoning_content": None, "tool_calls": []}
            else:
                choice["text"] = text
            self.send_json(200, {"id": rid, "object": obj, "created": created, "model": model,
                                 "choices": [choice], "usage": usage})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

        def event(payload: object) -> None:
            self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
            self.wfile.flush()

        chunk_obj = obj + ".chunk" if chat else obj
        first = True
        role_sent = not chat
        # one event per engine iteration (several tokens when drafts were accepted)
        while (words := job.chunks.get()) is not None:
            if not role_sent:  # like the real servers: the role chunk comes with the first output
                role_sent = True
                event({"id": rid, "object": chunk_obj, "created": created, "model": model,
                       "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None, "finish_reason": None}]})
            piece = ("" if first else " ") + " ".join(words)
            first = False
            choice = {"index": 0, "delta": {"content": piece}} if chat else \
                {"index": 0, "text": piece}
            choice.update(logprobs=None, finish_reason=None)
            event({"id": rid, "object": chunk_obj, "created": created, "model": model,
                   "choices": [choice]})
        last = {"index": 0, "logprobs": None, "finish_reason": "length", "stop_reason": None}
        last.update({"delta": {}} if chat else {"text": ""})
        event({"id": rid, "object": chunk_obj, "created": created, "model": model,
               "choices": [last]})
        if (body.get("stream_options") or {}).get("include_usage"):
            event({"id": rid, "object": chunk_obj, "created": created, "model": model,
                   "choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def shutdown_quietly(self) -> None:
        threading.Thread(target=self.shutdown, daemon=True).start()
        self.server_close()


def start_http(state: EngineState, host: str, port: int, handler_class: type = Handler,
               announce: list[str] | None = None) -> Server:
    """Serve `state` with `handler_class` (each engine's own routes) in a thread; the bind error
    and the start-up lines are uvicorn's, as every engine's OpenAI server prints them."""
    bind_host = "127.0.0.1" if host == "localhost" else host
    handler = type("Bound" + handler_class.__name__, (handler_class,), {"state": state})
    try:
        server = Server((bind_host, port), handler)
    except OSError as exc:
        raise OSError(f"[Errno {exc.errno}] error while attempting to bind on address "
                      f"('{bind_host}', {port}): {exc.strerror.lower()}") from None
    for line in announce or ["INFO:     Started server process",
                             "INFO:     Waiting for application startup."]:
        print(line, file=sys.stderr, flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
