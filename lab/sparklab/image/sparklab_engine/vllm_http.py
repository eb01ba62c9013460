"""The simulated vLLM's OpenAI-compatible server: the TRT-LLM simulation's, with vLLM's routes."""
from __future__ import annotations

import time

from .server import EngineState, Handler, Server

VERSION = "0.31.0"


class VllmState(EngineState):
    def __init__(self, model: str, served: str, executor) -> None:  # type: ignore[no-untyped-def]
        super().__init__({"model": served}, {})
        self.executor = executor
        self.ready = True

    def healthy(self) -> bool:
        return self.ready and not (self.executor and self.executor.dead)

    def generate(self, prompt: str, max_tokens: int) -> list[str]:
        if self.executor:
            self.executor.step()  # one step through every rank
        return super().generate(prompt, max_tokens)


class VllmHandler(Handler):
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


def start_vllm_http(model: str, served: str, executor, host: str, port: int) -> Server:  # type: ignore[no-untyped-def]
    import sys
    import threading

    state = VllmState(model, served, executor)
    bind_host = "127.0.0.1" if host == "localhost" else host
    handler = type("BoundVllmHandler", (VllmHandler,), {"state": state})
    try:
        server = Server((bind_host, port), handler)
    except OSError as exc:
        raise OSError(f"[Errno {exc.errno}] error while attempting to bind on address "
                      f"('{bind_host}', {port}): {exc.strerror.lower()}") from None
    print("INFO:     Started server process", file=sys.stderr, flush=True)
    print("INFO:     Waiting for application startup.", file=sys.stderr, flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
