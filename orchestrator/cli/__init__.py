"""The sparkctl command line: thin wrappers that load input, build a plan, run it, report.

Only click is imported at start-up so `sparkctl --help` stays fast; each command imports what
it needs when it runs.
"""

from __future__ import annotations

import atexit
import gc
import sys
from collections.abc import Callable
from typing import Any

import click

from orchestrator import __version__

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class LazyGroup(click.Group):
    """Subcommands imported on first use: "name" -> "module:attribute"."""

    def __init__(self, *args: Any, lazy: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy or {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands) + list(self.lazy) + list(PLUGINS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            import importlib

            module, attribute = self.lazy[name].split(":")
            return getattr(importlib.import_module(module), attribute)
        if name in PLUGINS:
            return plugin_command(name)
        return super().get_command(ctx, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, SUMMARIES.get(name) or PLUGINS.get(name, "")) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


# Summaries live here so `--help` does not import every command module.
SUMMARIES = {
    "up": "Bring the cluster up: fabric network, SSH trust, containers, hostfile (verified).",
    "plan": "Show what `up` would change (a line per file; --diff in full), changing nothing.",
    "netcheck": "Check the fabric on every node and link: addresses, MTU, routes, SSH, MPI.",
    "launch": "Serve a recipe's model across the cluster and wait until it answers.",
    "chat": "Send one chat completion to a running server or the gateway (through SSH).",
    "tunnel": "Forward a local port to the server on the head, for other clients.",
    "bench": "Measure the running server: throughput, TTFT, acceptance (llama-benchy's way).",
    "status": "What runs on each node, and whether it is healthy.",
    "dashboard": "A live web page (and /metrics) for the whole cluster: nodes, GPUs, servers.",
    "logs": "Server and container logs of every node, interleaved.",
    "down": "Stop the server and containers; with --network also remove the fabric config.",
    "recipes": "List built-in recipes, or show one with its memory estimate.",
    "gateway": "One OpenAI endpoint for every server (a pinned router): key, replicas, rolling swaps.",
    "advise": "Which layout serves a recipe fastest on N Sparks: predicted, or measured.",
    "doctor": "Diagnose the controller's setup: `doctor ssh` shows how each node is reached.",
    "disconnect": "Close the SSH connections kept open between runs ($SPARKCTL_SSH_PERSIST).",
    "init": "Write an inventory for your Sparks: finds the cabled fabric port on every node.",
}

# Commands other distributions add through the "sparkctl.plugins" entry point group.
PLUGINS = {
    "lab": "A simulated cluster of Sparks on this machine (the sparklab package).",
}
PLUGIN_HINTS = {
    "lab": "the simulated lab is the separate `sparklab` package: `make install` in a sparkctl "
           "checkout installs it (or `pip install ./lab`)",
}

LAZY = {
    "up": "orchestrator.cli.up:up",
    "plan": "orchestrator.cli.up:plan",
    "netcheck": "orchestrator.cli.netcheck:netcheck",
    "launch": "orchestrator.cli.launch:launch",
    "chat": "orchestrator.cli.chat:chat",
    "tunnel": "orchestrator.cli.launch:tunnel",
    "bench": "orchestrator.cli.bench:bench",
    "status": "orchestrator.cli.status:status",
    "dashboard": "orchestrator.cli.dashboard:dashboard",
    "gateway": "orchestrator.cli.gateway:gateway",
    "logs": "orchestrator.cli.status:logs",
    "down": "orchestrator.cli.status:down",
    "recipes": "orchestrator.cli.recipes:recipes",
    "advise": "orchestrator.cli.advise:advise",
    "doctor": "orchestrator.cli.doctor:doctor",
    "disconnect": "orchestrator.cli.doctor:disconnect",
    "init": "orchestrator.cli.init:init",
}


def plugin_command(name: str) -> click.Command:
    """The plugin's command from its entry point; if it is not installed, a command that says
    how to install it (and exits 2) instead of a bare "no such command"."""
    from importlib.metadata import entry_points

    for entry in entry_points(group="sparkctl.plugins", name=name):
        command: click.Command = entry.load()
        return command

    @click.command(name=name, context_settings={**CONTEXT, "ignore_unknown_options": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def missing(args: tuple[str, ...]) -> None:
        click.echo(f"sparkctl: `sparkctl {name}` is not installed: {PLUGIN_HINTS[name]}", err=True)
        sys.exit(2)

    missing.help = PLUGINS[name] + " Not installed here."
    return missing


@click.group(cls=LazyGroup, lazy=LAZY, context_settings=CONTEXT)
@click.version_option(__version__, prog_name="sparkctl")
def cli() -> None:
    """sparkctl: set up and run a cluster of NVIDIA DGX Sparks from one inventory file.

    \b
      sparkctl up --inventory two-sparks.yml   # fabric, SSH trust, containers, hostfile
      sparkctl netcheck                        # is the fabric right and fast?
      sparkctl launch qwen3-235b               # serve across the cluster, health-checked
      sparkctl down                            # everything stopped, nothing left behind

    Inventory: --inventory, else $SPARKCTL_INVENTORY, else the one the last successful `up`
    used, else ./two-sparks.yml. Exit codes: 0 ok, 1 a check or step failed, 2 bad input,
    130 interrupted. Docs: docs/ in the source tree.
    """


def inventory_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--inventory", "-i", "inventory_path", metavar="FILE", envvar=None,
        help="Inventory file (default: $SPARKCTL_INVENTORY, the last `up`, ./two-sparks.yml).",
    )(func)


def json_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print one JSON object on stdout (progress on stderr)."
    )(func)


def diff_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """--diff: the plan's diffs in full (each distinct diff once, with its nodes) instead of a
    line per changed file; read by the runner (core/output.py full_diff_requested)."""

    def remember(ctx: click.Context, param: click.Parameter, value: bool) -> None:
        if value:
            from orchestrator.core import output

            output.SETTINGS.full_diff = True
            ctx.call_on_close(output.reset_settings)

    return click.option(
        "--diff", is_flag=True, expose_value=False, callback=remember,
        help="Show the plan's diffs in full (default: one line per changed file and its nodes).",
    )(func)


def wants_json(argv: list[str] | None = None) -> bool:
    """`--json` among the arguments (before a `--`): errors then go to stdout as JSON too."""
    args = sys.argv[1:] if argv is None else argv
    return "--json" in (args[:args.index("--")] if "--" in args else args)


def json_error(command: str, message: str, exit_code: int) -> None:
    """The error object every `--json` command prints on stdout when it cannot run at all
    (bad input, a failure before any report): {"command", "ok": false, "error", "exit_code"}."""
    import json

    sys.stdout.write(json.dumps({"command": command, "ok": False, "error": message,
                                 "exit_code": exit_code}) + "\n")


def _command_name() -> str:
    context = click.get_current_context(silent=True)
    return context.info_name if context is not None and context.info_name else "sparkctl"


def run_command(body: Callable[[], int]) -> None:
    """Run a command body and turn every known error into a message and an exit code."""
    from orchestrator.errors import EXIT_INTERRUPTED, SparkctlError

    try:
        code = body()
    except SparkctlError as exc:
        click.echo(f"sparkctl: {exc}", err=True)
        if wants_json():
            json_error(_command_name(), str(exc), exc.exit_code)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("sparkctl: interrupted", err=True)
        if wants_json():
            json_error(_command_name(), "interrupted", EXIT_INTERRUPTED)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(code)


def main() -> None:
    # Registered first, so it runs last at exit: every object left is moved out of the
    # garbage collector's sight, so the interpreter's final collection does not walk the
    # whole heap (pydantic's schemas, paramiko, the plan). Objects are still freed; other
    # atexit handlers (logging's flush, paramiko's thread join) run before it, unchanged.
    atexit.register(gc.freeze)
    if not wants_json():
        cli(prog_name="sparkctl")
        return
    try:
        cli(prog_name="sparkctl", standalone_mode=False)
    except click.UsageError as exc:  # bad option or argument: click's message, as JSON too
        exc.show()
        name = exc.ctx.info_name if exc.ctx is not None and exc.ctx.info_name else "sparkctl"
        json_error(name, exc.format_message(), exc.exit_code)
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("Aborted!", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
