"""The dashboard's web side: a Starlette app served by uvicorn (the `dashboard` extra).

Read-only: every route answers GET (and HEAD) only. `/` is the page, `/api/state` its data
(view.py's PageView as JSON, polled by the page), `/metrics` Prometheus text (metrics.py),
`/static/...` the page's script and style and plotly's own plotly.min.js from the installed
plotly package (no CDN). With an API key every route needs it: `Authorization: Bearer KEY`
(Prometheus' `authorization`, curl) or HTTP Basic with the key as password (what a browser
asks for); anything else gets 401.
"""

from __future__ import annotations

import base64
import hmac
import importlib.util
import socket
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.commands import Secret
from orchestrator.dashboard.metrics import registry_for
from orchestrator.dashboard.view import NetcheckView, page_view
from orchestrator.dashboard.watch import Watcher
from orchestrator.errors import SparkctlError

STATIC = files("orchestrator.dashboard.static")
REALM = 'Basic realm="sparkctl dashboard", charset="UTF-8"'
# the page loads only its own files; nothing inline, nothing from elsewhere, never framed
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'")


def plotly_js() -> Path:
    """plotly.min.js as the plotly package installs it (its package_data)."""
    spec = importlib.util.find_spec("plotly")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "package_data" / "plotly.min.js"
        if path.is_file():
            return path
    raise SparkctlError("plotly's plotly.min.js is not installed: pip install "
                        "'dgx-sparkctl[dashboard]'")


def authorized(header: str, key: Secret) -> bool:
    """`Bearer KEY`, or Basic with KEY as the password (any user name)."""
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        offered = value.strip()
    elif scheme.lower() == "basic":
        try:
            offered = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")[2]
        except (ValueError, UnicodeDecodeError):
            return False
    else:
        return False
    return hmac.compare_digest(offered.encode("utf-8"), key.reveal().encode("utf-8"))


class KeyGuard:
    """ASGI middleware: with a key, a request without it gets 401 and nothing else."""

    def __init__(self, app: ASGIApp, key: Secret | None) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.key is not None:
            headers = dict(scope.get("headers") or [])
            header = headers.get(b"authorization", b"").decode("latin-1")
            if not authorized(header, self.key):
                refusal = PlainTextResponse("401: this dashboard needs its API key\n", 401,
                                            headers={"WWW-Authenticate": REALM})
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _static(name: str, media_type: str) -> Response:
    return Response(STATIC.joinpath(name).read_bytes(), media_type=media_type,
                    headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"})


def build_app(watcher: Watcher, key: Secret | None = None,
              netcheck: Callable[[], NetcheckView] = NetcheckView) -> Any:
    """`netcheck`: the last netcheck's figures, read when a page asks (a local file)."""
    registry = registry_for(watcher.latest)
    plotly = plotly_js()

    async def page(request: Request) -> Response:
        return _static("index.html", "text/html; charset=utf-8")

    async def state(request: Request) -> Response:
        view = page_view(watcher.latest(), watcher.history(), watcher.events(), watcher.interval,
                         netcheck())
        return JSONResponse(view.as_json(), headers={"Cache-Control": "no-store"})

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def script(request: Request) -> Response:
        return _static("dashboard.js", "text/javascript; charset=utf-8")

    async def style(request: Request) -> Response:
        return _static("dashboard.css", "text/css; charset=utf-8")

    async def charts(request: Request) -> Response:
        return FileResponse(plotly, media_type="text/javascript; charset=utf-8")

    routes = [Route("/", page, methods=["GET"]), Route("/api/state", state, methods=["GET"]),
              Route("/metrics", metrics, methods=["GET"]),
              Route("/static/dashboard.js", script, methods=["GET"]),
              Route("/static/dashboard.css", style, methods=["GET"]),
              Route("/static/plotly.min.js", charts, methods=["GET"])]
    return KeyGuard(Starlette(routes=routes), key)


def listening_socket(host: str, port: int) -> socket.socket:
    """The bound socket uvicorn serves on: a taken port is said here, plainly."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SparkctlError(f"cannot listen on {host}:{port}: {exc.strerror} (another program "
                            "holds the port? pick another --port)") from None
    sock.listen(128)
    return sock


def serve(app: Any, sock: socket.socket) -> None:
    """Serve until Ctrl-C (uvicorn's own signal handling ends it cleanly)."""
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
