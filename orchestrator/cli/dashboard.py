"""`sparkctl dashboard`: one live web page for the whole cluster (docs/dashboard.md).

The web stack (Starlette, uvicorn, plotly's plotly.min.js) is the optional `dashboard` extra:
this module imports it only when the command runs, so `sparkctl --help` and every other
command stay as light as before, and a sparkctl installed without the extra says how to add it.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

import click

from orchestrator.cli import CONTEXT, inventory_option, run_command

WEB_EXTRA = ("starlette", "uvicorn", "plotly")
DEFAULT_PORT = 8450

if TYPE_CHECKING:
    from orchestrator.commands import Secret


def need_web_extra() -> None:
    missing = [name for name in WEB_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        from orchestrator.errors import InputError

        raise InputError(f"sparkctl dashboard needs its web extra ({', '.join(missing)} not "
                         "installed): pip install 'dgx-sparkctl[dashboard]'")


def check_bind(host: str, api_key_file: str | None) -> Secret | None:
    """The key (a Secret) or None; the gateway's rule: beyond loopback only with a key."""
    import ipaddress

    from orchestrator.cli.api_key import is_loopback, read_api_key
    from orchestrator.errors import InputError

    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise InputError(f"--host {host!r} is not an IP address (127.0.0.1, 0.0.0.0, or "
                             "one of this machine's addresses)") from None
    if not is_loopback(host) and api_key_file is None:
        raise InputError(f"--host {host} makes the dashboard reachable from other machines: "
                         "protect it with --api-key-file FILE (mode 0600, one line), or keep the "
                         "default 127.0.0.1 and reach it with `ssh -L`")
    return read_api_key(api_key_file) if api_key_file else None


def _dashboard(inventory_path: str | None, host: str, port: int, api_key_file: str | None,
               interval: float) -> int:
    need_web_extra()
    key = check_bind(host, api_key_file)
    from orchestrator.core.runner import load_inventory_option

    inventory, _ = load_inventory_option(inventory_path)
    from orchestrator.dashboard.app import build_app, listening_socket, serve
    from orchestrator.dashboard.view import last_netcheck
    from orchestrator.dashboard.watch import Watcher
    from orchestrator.state import state_dir
    from orchestrator.status.assess import gather_status

    watcher = Watcher(lambda: gather_status(inventory), interval)
    app = build_app(watcher, key, lambda: last_netcheck(state_dir(), inventory.cluster.name))
    sock = listening_socket(host, port)
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"sparkctl dashboard: http://{shown}:{sock.getsockname()[1]}/ (cluster "
               f"{inventory.cluster.name}, a look every {interval:g}s; /metrics for Prometheus"
               f"{'; API key required' if key else ''}). Ctrl-C ends it.", err=True)
    watcher.start()
    try:
        serve(app, sock)
    finally:
        watcher.stop()
    return 0


@click.command(context_settings=CONTEXT)
@inventory_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; any but loopback needs --api-key-file.")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
              help="Port to listen on (0: a free one, printed).")
@click.option("--api-key-file", metavar="FILE",
              help="Require this key (mode 0600, one line): `Authorization: Bearer KEY`, or the "
                   "browser's login with the key as password.")
@click.option("--interval", type=click.FloatRange(min=1), default=5.0, show_default=True,
              metavar="SECONDS", help="Look at the nodes every SECONDS (what `status --watch` "
                                      "does, once for every page open).")
def dashboard(inventory_path: str | None, host: str, port: int, api_key_file: str | None,
              interval: float) -> None:
    """One live web page for the whole cluster, and the same figures at /metrics.

    \b
    Per node: memory available (and the memory guard's threshold), GPU utilisation, SM clock
    against its maximum, temperature, power, the box guard's flags (clock stuck, hot,
    throttled), fabric links; per server: model, engine, nodes, health, requests running and
    waiting, KV cache, speculative acceptance; the gateway; events (problems appearing and
    clearing, servers changing state, containers restarting); charts of the last 30 minutes.
    Read from the nodes as `status` reads them, one look every --interval seconds however
    many pages are open. Read-only. Needs the extra: pip install 'dgx-sparkctl[dashboard]'.
    """
    run_command(lambda: _dashboard(inventory_path, host, port, api_key_file, interval))
