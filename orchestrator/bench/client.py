"""The benchmark's HTTP client: streaming chat completions timed like llama-benchy 0.4.0.

Threads + http.client (stdlib): each request of a batch runs in its own thread, all released
at once. Per request it records when it was sent, the first SSE event with `choices` (first
response), the first one with content (first token), every content event's arrival time and
text, and the `usage` the server reports (stream_options.include_usage). It does NOT send
`return_token_ids` (llama-benchy does; recent trtllm-serve refuses it with HTTP 400).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# Common English words that are one token each (with their leading space) in the BPE
# vocabularies of Llama 3, Qwen 3 and gpt-oss: N words ~ N prompt tokens. The server's own
# count (usage.prompt_tokens) is used when it is within 20 % of N, as llama-benchy does.
_WORD_TEXT = """the of and to in is that for it as was with be by on not he this are or his
from at which but have an they you were her she there one all we their has been if more when
will would who so no time people year way day man thing woman life child world school state
family student group country problem hand part place case week company system program question
work government number night point home water room mother area money story fact month lot right
study book eye job word business issue side kind head house service friend father power hour
game line end member law car city name team minute idea body back parent face others level
office door health person art war history party result change morning reason research girl guy
moment air teacher force education"""
WORDS = tuple(_WORD_TEXT.split())


def prompt_words(count: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


@dataclass
class RequestResult:
    start: float = 0.0
    end: float = 0.0
    first_response: float | None = None
    first_token: float | None = None
    chunks: list[tuple[float, str, list[int] | None]] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int | None = None
    error: str | None = None

    def token_timestamps(self) -> list[float]:
        """One timestamp per generated token, as llama-benchy derives them: from token_ids
        per event when every event has them (spread evenly since the previous event), else
        usage.completion_tokens spread evenly from the first to the last content event, else
        one token per event."""
        if not self.chunks:
            return []
        if all(isinstance(ids, list) for _, _, ids in self.chunks):
            out: list[float] = []
            for at, _, ids in self.chunks:
                count = len(ids or [])
                if count == 1:
                    out.append(at)
                elif count > 1:
                    last = out[-1] if out else (self.first_token or self.start)
                    out += [last + (at - last) * (i + 1) / count for i in range(count)]
            return out
        times = [at for at, _, _ in self.chunks]
        if self.completion_tokens is None:
            return times
        count = self.completion_tokens
        if count <= 0:
            return []
        if count == 1 or len(times) == 1 or times[-1] <= times[0]:
            return [times[0]] * count
        step = (times[-1] - times[0]) / (count - 1)
        return [times[0] + step * i for i in range(count)]


class Endpoint:
    """An OpenAI-compatible server at 127.0.0.1:port (the local end of the SSH forward)."""

    def __init__(self, port: int, model: str, host: str = "127.0.0.1", timeout: float = 900,
                 headers: dict[str, str] | None = None) -> None:
        self.host, self.port, self.model, self.timeout = host, port, model, timeout
        self.headers = dict(headers or {})
        """Sent with every request: the server's `Authorization` when it has an API key."""

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def get(self, path: str) -> tuple[int, bytes]:
        conn = self.connection()
        try:
            conn.request("GET", path, headers=self.headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def latency(self, samples: int = 3) -> float:
        """llama-benchy's "api" latency mode: mean wall time of GET /v1/models."""
        times = []
        for _ in range(samples):
            started = time.perf_counter()
            self.get("/v1/models")
            times.append(time.perf_counter() - started)
        return sum(times) / len(times)

    def stream(self, messages: list[dict[str, str]], max_tokens: int,
               stop: threading.Event | None = None) -> RequestResult:
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens,
                "stream": True, "stream_options": {"include_usage": True}}
        result = RequestResult()
        conn = self.connection()
        try:
            result.start = time.perf_counter()
            conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                         headers={"Content-Type": "application/json", **self.headers})
            response = conn.getresponse()
            if response.status != 200:
                result.error = f"HTTP {response.status}: {response.read()[:300].decode(errors='replace')}"
                return result
            while not (stop and stop.is_set()):
                raw = response.readline()
                if not raw:
                    break
                now = time.perf_counter()
                self._event(result, raw.decode(errors="replace").strip(), now)
            if stop and stop.is_set():
                result.error = "interrupted"
            result.end = time.perf_counter()
        except (OSError, http.client.HTTPException) as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()
        return result

    @staticmethod
    def _event(result: RequestResult, line: str, now: float) -> None:
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            return
        try:
            chunk = json.loads(line[5:].strip())
        except ValueError:
            return
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("prompt_tokens"), int):
                result.prompt_tokens = usage["prompt_tokens"]
            if isinstance(usage.get("completion_tokens"), int):
                result.completion_tokens = usage["completion_tokens"]
        choices = chunk.get("choices") or []
        if not choices:
            return
        if result.first_response is None:
            result.first_response = now
        delta = choices[0].get("delta") or {}
        text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
        if text:
            if result.first_token is None:
                result.first_token = now
            result.chunks.append((now, text, choices[0].get("token_ids")))


def run_batch(endpoint: Endpoint, prompts: list[list[dict[str, str]]], max_tokens: int,
              stop: threading.Event, wait: Callable[[float], None] = time.sleep) -> list[RequestResult]:
    """Send every prompt at once (one thread each) and wait for all; Ctrl-C in the caller's
    thread sets `stop`, which ends every stream at its next event."""
    results: list[RequestResult | None] = [None] * len(prompts)
    gate = threading.Barrier(len(prompts))

    def one(index: int) -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            gate.wait(timeout=30)
        results[index] = endpoint.stream(prompts[index], max_tokens, stop)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)
    except KeyboardInterrupt:
        stop.set()
        for thread in threads:
            thread.join(5)
        raise
    return [r or RequestResult(error="no result") for r in results]
