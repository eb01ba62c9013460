"""`sparkctl launch` and `tunnel`: thin wrappers over recipe.py and steps/ (`recipes`: recipes.py;
`chat`: chat.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from orchestrator.cli import CONTEXT, diff_option, inventory_option, json_option, run_command
from orchestrator.cli.completion import complete_recipe, complete_server
from orchestrator.cli.verbosity import verbosity_option

if TYPE_CHECKING:
    from orchestrator.records import Server

DEFAULT_TOKEN_FILE = "~/.cache/huggingface/token"


def _note(line: str) -> None:
    click.echo(line, err=True)


MAX_TOKEN_BYTES = 4096
"""A Hugging Face token is ~40 characters; a token file larger than this is the wrong file."""


def check_token(value: str, source: str) -> None:
    """A token is one line of printable ASCII without spaces; say what is wrong, never the value."""
    from orchestrator.errors import InputError

    if "\n" in value or "\r" in value:
        raise InputError(f"{source} holds more than one line; a Hugging Face token is one line "
                         "(hf_...): check the file or variable (its content is not shown)")
    bad = next((c for c in value if not (c.isascii() and c.isprintable()) or c.isspace()), None)
    if bad is not None:
        raise InputError(f"{source} contains a space, control or non-ASCII character; a Hugging "
                         "Face token is printable ASCII (hf_...) (its content is not shown)")


def read_hf_token(token_file: str | None) -> Any:
    """HF_TOKEN from the environment, else the token file; a Secret (never printed) or None."""
    from orchestrator.commands import Secret
    from orchestrator.errors import InputError
    from orchestrator.state import register_secret
    from orchestrator.yamlio import read_user_file

    value = os.environ.get("HF_TOKEN", "")
    source = "HF_TOKEN"
    if not value.strip():
        path = Path(token_file or DEFAULT_TOKEN_FILE).expanduser()
        source = f"the HF token file {path}"
        if token_file or os.path.lexists(path):
            raw = read_user_file(path, "HF token", limit=MAX_TOKEN_BYTES)
            try:
                value = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise InputError(f"{source} is not UTF-8 text") from None
    value = value.strip()
    if not value:
        return None
    check_token(value, source)
    secret = Secret(value)
    register_secret(secret)
    return secret


def _launch(recipe_name: str, inventory_path: str | None, dry_run: bool, yes: bool,
            as_json: bool, timeout: float, replace: bool, host: str, drop_caches: bool,
            hf_token_file: str | None, trust_new_hosts: bool, break_lock: bool,
            ignore_memory: bool, guard_min_available_gb: float | None = None,
            placed: tuple[str, ...] = (), name: str | None = None, port: int | None = None,
            no_drop_caches: bool = False, persist: bool = False, distribute_image: bool = False,
            api_key_file: str | None = None, verify_models: bool = False,
            early: bool = True) -> int:
    """EARLY: connect and gather the facts of the last such launch while this one gets ready
    (core/speculate.py); not for `--rolling`, whose runs differ from one replica to the next."""
    from orchestrator.core.speculate import start_early

    variant = repr((recipe_name, _file_digest(recipe_name), dry_run, replace, host, drop_caches,
                    no_drop_caches, placed, name, port, persist, verify_models, api_key_file))
    speculation = start_early("launch", inventory_path, trust_new_hosts, variant) \
        if early else None
    try:  # (the inventory's models import pydantic: after the early start)
        from orchestrator.core.inventory_option import load_inventory_option
        from orchestrator.errors import InputError

        try:
            inventory, _ = load_inventory_option(inventory_path)
        except InputError:
            _recipe_and_key(recipe_name, host, api_key_file)  # their errors come first, as ever
            raise
        if speculation is not None:
            speculation.confirm(inventory)
        return _launch_on(inventory, speculation, recipe_name, dry_run, yes, as_json, timeout,
                          replace, host, drop_caches, hf_token_file, trust_new_hosts, break_lock,
                          ignore_memory, guard_min_available_gb, placed, name, port,
                          no_drop_caches, persist, distribute_image, api_key_file, verify_models)
    finally:
        if speculation is not None:
            speculation.close()


def _file_digest(recipe_name: str) -> str:
    """A recipe file's content digest ("" for a built-in name, or what is no recipe file: the
    recipe's loading says why): its requests follow it."""
    import hashlib

    from orchestrator.errors import InputError
    from orchestrator.userfiles import read_user_file

    if not Path(recipe_name).exists():
        return ""
    try:
        return hashlib.sha256(read_user_file(Path(recipe_name), "recipe")).hexdigest()
    except InputError:
        return ""


def _recipe_and_key(recipe_name: str, host: str, api_key_file: str | None) -> tuple[Any, Any]:
    """The recipe and the launch's API key: InputError (exit 2) for an unknown recipe or a bind
    that would be unprotected."""
    from orchestrator.cli.api_key import check_bind
    from orchestrator.engines import capabilities, engine_of, load_recipe

    recipe = load_recipe(recipe_name)
    engine = engine_of(recipe)
    return recipe, check_bind(host, api_key_file, capabilities.api_key_way(engine), engine.title)


def _launch_on(inventory: Any, speculation: Any, recipe_name: str, dry_run: bool, yes: bool,
               as_json: bool, timeout: float, replace: bool, host: str, drop_caches: bool,
               hf_token_file: str | None, trust_new_hosts: bool, break_lock: bool,
               ignore_memory: bool, guard_min_available_gb: float | None,
               placed: tuple[str, ...], name: str | None, port: int | None,
               no_drop_caches: bool, persist: bool, distribute_image: bool,
               api_key_file: str | None, verify_models: bool) -> int:
    from orchestrator.cli.launch_plan import checked_recipe, launch_plan
    from orchestrator.core.runner import RunRequest, execute
    from orchestrator.core.step import Plan, RunOptions
    from orchestrator.engines import capabilities, engine_of
    from orchestrator.errors import InputError
    from orchestrator.recipe import LaunchOptions, serving_nodes

    recipe, api_key = _recipe_and_key(recipe_name, host, api_key_file)
    engine = engine_of(recipe)
    recipe = checked_recipe(_placed(recipe, placed, name, port), inventory)
    estimate = engine.estimate_memory(recipe)
    _note(f"memory: {estimate.explanation}")
    if estimate.verdict == "does not fit" and not ignore_memory:
        raise InputError(f"recipe {recipe.name} does not fit in a Spark's memory (see above); "
                         "--ignore-memory launches it anyway")
    for warning in capabilities.warnings(engine, recipe):
        _note(f"warning: {warning}")
    token = read_hf_token(hf_token_file)
    options = LaunchOptions(host=host, replace=replace, drop_caches=drop_caches, timeout=timeout,
                            guard_min_available_gb=guard_min_available_gb, name=name,
                            skip_drop_caches=no_drop_caches, ignore_memory=ignore_memory,
                            persist=persist or recipe.persist, api_key=api_key)
    head, server = serving_nodes(recipe, inventory)[0], name or recipe.name
    endpoint = f"http://{host}:{recipe.port}"
    plan = launch_plan(recipe, inventory, options, verify_models)
    from orchestrator.gateway.follow import seen_phase

    plan.phases.append(seen_phase())  # whether a gateway runs, from the facts gathered up front

    def build(session: Any) -> Plan:
        session.report.extra.update(endpoint=endpoint, node=head, model=recipe.model,
                                    recipe=recipe.name, engine=engine.name, server=server)
        return plan

    def after(session: Any, report: Any) -> None:
        if not dry_run and report.ok:
            report.notes.append(f"Serving {recipe.model} at {endpoint} on {head} (server {server}). "
                                f"Try `sparkctl chat --server {server} \"Hello\"`, or `sparkctl "
                                f"tunnel --server {server}` for other clients.")
            from orchestrator.gateway.follow import after_change

            # a gateway that runs routes to it too
            after_change(session, inventory, _note, request.options.gateway_nodes)

    request = RunRequest(
        command="launch", inventory=inventory, build=build, dry_run=dry_run, yes=yes,
        as_json=as_json, trust_new_hosts=trust_new_hosts, break_lock=break_lock,
        options=RunOptions(hf_token=token, progress_note=_note, distribute_image=distribute_image),
        after=after, speculation=speculation,
    )
    code = execute(request)
    return 2 if code == 1 and request.options.token_missing else code


def _placed(recipe: Any, placed: tuple[str, ...], name: str | None,
            port: int | None) -> Any:
    """The recipe with `--nodes` (wins over the recipe's `placement`) and `--port` applied."""
    import re

    from orchestrator.errors import InputError

    if name is not None and not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,62}", name):
        raise InputError(f"--name {name!r}: use [a-z0-9._-], starting with a letter or digit")
    nodes = [n.strip() for word in placed for n in word.split(",") if n.strip()]
    # every engine: the nodes are checked against its rank rules (Engine.placement_problem)
    update: dict[str, Any] = {}
    if nodes:
        update["placement"] = nodes
    if port is not None:
        update["port"] = port
    return recipe.model_copy(update=update) if update else recipe


@click.command(context_settings=CONTEXT)
@click.argument("recipe_name", metavar="RECIPE", shell_complete=complete_recipe)
@inventory_option
@click.option("--dry-run", is_flag=True, help="Show the plan and the memory estimate; change nothing.")
@diff_option
@click.option("--yes", "-y", is_flag=True, help="Apply without asking (needed when not on a terminal).")
@json_option
@click.option("--timeout", type=click.FloatRange(min=1), default=1800.0, show_default=True,
              help="Seconds to wait for the server to answer before stopping it.")
@click.option("--replace", is_flag=True, help="Replace a server running a different recipe.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address the server binds on its node; beyond loopback needs --api-key-file.")
@click.option("--api-key-file", metavar="FILE",
              help="The server's API key (mode 0600, one line of printable ASCII, no # first; "
                   "to the nodes on stdin, never argv): required with a --host beyond loopback.")
@click.option("--drop-caches/--no-drop-caches", default=True, show_default=True,
              help="Drop the page cache on the serving nodes before a cold start (unified "
                   "memory); --drop-caches is the default and kept for compatibility.")
@click.option("--guard-min-available-gb", type=click.FloatRange(min=0), default=None,
              help="The memory guard stops the server when a node's MemAvailable falls below "
                   "this (default: the recipe's memory.guard_min_available_gb, else 2).")
@click.option("--hf-token-file", metavar="FILE",
              help=f"HF token file when $HF_TOKEN is unset (default {DEFAULT_TOKEN_FILE}); "
                   "checked with the hub before anything downloads.")
@click.option("--trust-new-hosts", is_flag=True, help="Pin unknown SSH host keys on first use.")
@click.option("--break-lock", is_flag=True, help="Take the cluster lock from a run that is gone.")
@click.option("--ignore-memory", is_flag=True, help="Launch even if the memory estimate says no.")
@click.option("--nodes", "placed", multiple=True, metavar="NODE[,NODE]",
              help="Run on these inventory nodes (rank order; wins over the recipe's placement), "
                   "checked against the engine's rank rules (tp x pp). Default: the head (and "
                   "the next nodes).")
@click.option("--name", metavar="NAME", help="The server's name (default: the recipe's).")
@click.option("--port", type=click.IntRange(1024, 65535), default=None,
              help="The server's port instead of the recipe's.")
@click.option("--persist", is_flag=True,
              help="Come back after a node reboot: containers with a restart policy and a boot "
                   "unit sparkctl-serve-NAME.service per serving node (also: `persist: true` in "
                   "the recipe). `sparkctl down` removes both.")
@click.option("--distribute-image", is_flag=True,
              help="Pull the engine's image on one serving node only (the head when it serves) "
                   "and send it to the others over the fabric (docker save | docker load, "
                   "verified by image ID and digest). Without it, this happens only for nodes "
                   "that cannot reach the registry (probed before pulling) or whose pull fails. "
                   "The `up` container's image comes with `up` (`up --distribute-image`).")
@click.option("--verify-models", is_flag=True,
              help="Hash every model file again on every serving node (ignoring the hash cache, "
                   "which trusts size and mtime) against the head's manifest; a node whose files "
                   "differ gets them sent again. Reads every byte: minutes for a large model.")
@click.option("--rolling", is_flag=True,
              help="Replace the running replicas of RECIPE (changed config or image) one at a "
                   "time: out of the gateway, drained, relaunched, ready, back in "
                   "(docs/gateway.md).")
@click.option("--allow-downtime", is_flag=True,
              help="With --rolling: also when only one replica runs (it stops serving meanwhile).")
@verbosity_option
def launch(recipe_name: str, inventory_path: str | None, dry_run: bool, yes: bool, as_json: bool,
           timeout: float, replace: bool, host: str, drop_caches: bool,
           hf_token_file: str | None, trust_new_hosts: bool, break_lock: bool,
           ignore_memory: bool, guard_min_available_gb: float | None, placed: tuple[str, ...],
           name: str | None, port: int | None, persist: bool, distribute_image: bool,
           api_key_file: str | None, verify_models: bool, rolling: bool,
           allow_downtime: bool) -> None:
    """Serve RECIPE (a built-in name or a recipe file) across the cluster, health-checked.

    \b
    checks  the server judged against every node's servers: its name (another configuration
            needs --replace), its ports and its memory
    models  fetched once on the head, fanned out to the serving nodes over the fabric,
            verified chunk by chunk; the HF token exists only meanwhile
    image   (vLLM, SGLang, llama.cpp) every serving node can pull the engine's image or gets it
            from a node that has it, over the fabric (said before anything changes)
    serve   the engine's server (TensorRT-LLM: mpirun ... trtllm-serve; vLLM: the server's
            own Ray cluster, then vllm serve; SGLang: sglang.launch_server per node; llama.cpp:
            rpc-server on the other nodes, then llama-server), then readiness over HTTP
            and one real chat completion
    persist (--persist) a boot unit per serving node that brings the server back after
            a reboot, the same checks first (docs/operate.md)
    First of all, every port the server binds is proven free on each of its nodes;
    --verify-models then re-hashes the models everywhere (docs/launch.md).
    Relaunching the same recipe is a no-op. See docs/launch.md and docs/engines.md.
    """
    if rolling or allow_downtime:
        from orchestrator.cli.rolling import rolling_launch

        rolling_launch(locals(), _launch)
        return
    run_command(lambda: _launch(recipe_name, inventory_path, dry_run, yes, as_json, timeout,
                                replace, host, drop_caches, hf_token_file, trust_new_hosts,
                                break_lock, ignore_memory, guard_min_available_gb, placed, name,
                                port, not drop_caches, persist, distribute_image, api_key_file,
                                verify_models))


def _server_on_head(inventory_path: str | None, command: str) -> Any:
    """Connect to every node (servers run where they were placed); returns (session manager,
    inventory)."""
    from orchestrator.core.runner import load_inventory_option
    from orchestrator.core.session import open_session

    inventory, _ = load_inventory_option(inventory_path)
    return open_session(inventory, command, quiet=True), inventory


def _running_server(session: Any, inventory: Any, name: str | None = None) -> tuple[Any, Server]:
    """The server NAME (or the only one running): its node's transport and its record."""
    from orchestrator.engines import servers
    from orchestrator.errors import SparkctlError

    found = servers.gather(session.transports, inventory)
    if not found and inventory.head_name not in session.transports:
        raise SparkctlError(f"cannot reach the head {inventory.head_name}: "
                            + session.report.hosts[inventory.head_name].error)
    server = servers.pick(found, name)
    return session.transports[server.node], server


def _tunnel(inventory_path: str | None, local_port: int | None, name: str | None = None,
            as_json: bool = False) -> int:
    import threading

    from orchestrator.engines.apikey import key_note, probe_host
    from orchestrator.remote.tunnel import Forwarder

    manager, inventory = _server_on_head(inventory_path, "tunnel")
    with manager as session:
        transport, server = _running_server(session, inventory, name)
        record = server.record
        port = record.port
        where = probe_host(record.host)
        with Forwarder(transport, port, local_port if local_port is not None else port,
                       remote_host=where) as forward:
            url = f"http://127.0.0.1:{forward.local_port}"
            node = server.node
            click.echo(f"Forwarding {url} -> {node} {where}:{port} "
                       f"({record.model}). OpenAI clients: base_url={url}/v1. Ctrl-C to stop.",
                       err=True)
            if record.api_key_file:  # say how, never the key
                click.echo(key_note(record, node), err=True)
            if as_json:  # one line, once the forward listens: scripts read where to connect
                import json

                click.echo(json.dumps({"command": "tunnel", "ok": True, "url": url,
                                       "base_url": f"{url}/v1", "local_port": forward.local_port,
                                       "node": node, "port": port, "model": record.model,
                                       "server": server.name,
                                       "api_key": bool(record.api_key_file)}))
                sys.stdout.flush()
            try:
                threading.Event().wait()
            except KeyboardInterrupt:
                _note("tunnel closed")
                return 130  # interrupted, as every command (docs: exit codes)
    return 0


@click.command(context_settings=CONTEXT)
@inventory_option
@click.option("--local-port", type=click.IntRange(0, 65535), default=None,
              help="Local port (127.0.0.1 only); default: the server's port; 0 picks a free one.")
@click.option("--server", "name", metavar="NAME", help="Which server (needed when several run).",
              shell_complete=complete_server)
@json_option
def tunnel(inventory_path: str | None, local_port: int | None, name: str | None,
           as_json: bool) -> None:
    """Forward a local port to a server on its node until Ctrl-C (for other clients).

    --json prints one line once the forward listens: {"url", "base_url", "local_port", "node",
    "port", "model", "server", "api_key" (whether the server needs its key)}."""
    run_command(lambda: _tunnel(inventory_path, local_port, name, as_json))
