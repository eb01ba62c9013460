"""The simulated vLLM's OpenAI-compatible server: the TRT-LLM simulation's, with vLLM's routes.

With an API key (--api-key, or VLLM_API_KEY), vLLM's AuthenticationMiddleware checks `Authorization:
Bearer KEY` on /v1 paths only (OPTIONS passes); /health, /ping, /version, /metrics stay open;
a refusal is 401 {"error": "Unauthorized"}."""
from __future__ import annotations

import time

from .common import image_version
from .server import EngineState, Handler, Server, start_http

VERSION = image_version("0.31.0")  # the image's vLLM (catalog.json)


class VllmState(EngineState):
    def __init__(self, model: str, served: str, executor, api_key: str | None = None) -> None:  # type: ignore[no-untyped-def]
        super().__init__({"model": served}, {})
        self.executor = executor
        self.ready = True
        self.api_key = api_key

    def healthy(self) -> bool:
        return self.ready and not (self.executor and self.executor.dead)

    def generate(self, prompt: str, max_tokens: int) -> list[str]:
        if self.executor:
            self.executor.step()  # one step through every rank
        return super().generate(prompt, max_tokens)


class VllmHandler(Handler):
    checks_model = True  # a request naming a model this server does not serve is a 404

    def key_open(self, path: str) -> bool:
        return not path.startswith("/v1")  # vLLM's middleware: `if not url_path.startswith("/v1")`

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        st = self.state
        if path in ("/health", "/ping"):
            self.send_response(200 if st.healthy() else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [
                {"id": st.model, "object": "model", "created": int(time.time()),
                 "owned_by": "vllm", "root": st.model, "parent": None}]})
        elif path == "/version":
            self.send_json(200, {"version": VERSION})
        else:
            self.send_json(404, {"detail": "Not Found"})


def start_vllm_http(model: str, served: str, executor, host: str, port: int,  # type: ignore[no-untyped-def]
                    api_key: str | None = None) -> Server:
    return start_http(VllmState(model, served, executor, api_key), host, port, VllmHandler)
