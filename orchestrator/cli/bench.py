"""`sparkctl bench`: how fast the running server is, measured like llama-benchy, through SSH.

Thin: options, the session and the forward (like `chat`), then orchestrator/bench/
measure, judge and render. See docs/bench.md.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from orchestrator.records import Server

from orchestrator.cli import CONTEXT, inventory_option, json_option, run_command
from orchestrator.cli.bench_inputs import RUNS, TIMEOUT, check_outputs, int_list, keep_outputs
from orchestrator.cli.completion import complete_server
from orchestrator.remote.container import ContainerCommands


def _note(line: str) -> None:
    click.echo(line, err=True)


def _node_state(session: Any) -> dict[str, Any]:
    from orchestrator.bench.metrics import NODE_STATE_CMD, parse_node_state
    from orchestrator.remote.cluster import parallel

    def one(name: str) -> dict[str, Any]:
        result = session.transports[name].run(NODE_STATE_CMD, timeout=30,
                                              display="nvidia-smi --query-gpu=...")
        return parse_node_state(result.stdout)

    names = [n.name for n in session.inventory.nodes if n.name in session.transports]
    out = {name: (o.get() if o.ok else {"error": str(o.error)}) for name, o in parallel(one, names).items()}
    for name in session.unreachable:
        out[name] = {"error": "unreachable"}
    return out


def _server_info(session: Any, inventory: Any, transport: Any, server: Server) -> dict[str, Any]:
    import json

    from orchestrator.commands import docker_cmd
    from orchestrator.engines import DEFAULT_ENGINE
    from orchestrator.phases.container_image import image_digest

    # the image of the container the server runs in (vLLM's and SGLang's are the recipe's, not
    # `up`'s); `up`'s image when that container cannot be inspected
    shown = server.record.to_dict()  # (engine-specific figures too: image, draft model)
    container = server.record.container or inventory.container.name
    found = transport.run(ContainerCommands(container).inspect_cmd("{{.Config.Image}}"), timeout=30)
    image = shown.get("image") or (found.stdout.strip() if found.ok else "") or inventory.container.image
    result = transport.run(docker_cmd("image", "inspect", image), timeout=30)
    facts = None
    if result.ok:
        try:
            facts = (json.loads(result.stdout) or [None])[0]
        except ValueError:
            facts = None
    keys = ("recipe", "model", "draft_model", "engine", "config_hash", "tp_size", "port", "started")
    return {**{k: shown.get(k) for k in keys}, "engine": server.engine or DEFAULT_ENGINE,
            "image": image, "image_digest": image_digest(facts, image),
            "head": server.node, "server": server.name}


class Bench:
    """The session, the forward and the target of one `sparkctl bench` invocation."""

    def __init__(self, session: Any, inventory: Any, expected: str | None) -> None:
        from orchestrator.cli.launch import _running_server

        self.session, self.inventory, self.expected = session, inventory, expected
        self.transport, server = _running_server(session, inventory, expected)
        if expected and expected not in (server.name, server.record.recipe):
            from orchestrator.errors import SparkctlError

            raise SparkctlError(f"the running server is recipe {server.record.recipe!r}, not "
                                f"{expected!r} (--server)")
        self.server = server

    def measure(self, config: Any, forward_port: int) -> dict[str, Any]:
        from orchestrator.bench.client import Endpoint
        from orchestrator.bench.metrics import meter_for
        from orchestrator.bench.run import Target, run_bench
        from orchestrator.cli.launch import _running_server

        _, self.server = _running_server(self.session, self.inventory, self.expected)  # fresh
        info = _server_info(self.session, self.inventory, self.transport, self.server)
        from orchestrator.engines.apikey import bearer, read_node_key

        # a server with an API key: the key from its node's file (over SSH, never argv)
        endpoint = Endpoint(forward_port, self.server.record.model,
                            headers=bearer(read_node_key(self.transport, self.server.record)))

        def fetch() -> str:
            status, body = endpoint.get("/metrics")
            return body.decode(errors="replace") if status == 200 else ""

        target = Target(endpoint, meter_for(info["engine"], fetch),
                        lambda: _node_state(self.session), _note)
        _note(f"[bench] {info['model']} ({info['recipe']}, {info['engine']}) on {info['head']}, "
              "through the SSH forward")
        doc = run_bench(config, target)
        doc["server"] = info
        return doc


QUICK = {"tg": "32", "pp": "2048", "depth": "0", "concurrency": "1"}
"""llama-benchy's default: one cell, pp2048 tg32, one request (x 3 runs)."""
FULL = {"tg": "128,256", "pp": "2048", "depth": "0,16384", "concurrency": "1,4,8"}
"""The seed blog's table: generation at 1, 4 and 8 requests, prefill at depth 0 and 16K."""


def choose_cells(opts: dict[str, Any]) -> dict[str, str]:
    """Each of tg/pp/depth/concurrency: the option given, else --full's, else the quick one."""
    base = FULL if opts.pop("full") else QUICK
    return {key: opts[key] if opts[key] is not None else base[key] for key in QUICK}


def expectation(config: Any) -> str:
    """What is about to run and roughly how long it takes, said before it starts."""
    seconds = config.estimate_seconds()
    span = f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
    return (f"{len(config.cells())} cell(s), {config.requests()} request(s): expect about {span} "
            f"at a Spark's typical {config.PP_RATE:,} prompt and {config.TG_RATE} generated "
            "tokens/s per request (Ctrl-C stops it, keeping what was measured)")


def need_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise click.UsageError("plots need matplotlib: pip install 'dgx-sparkctl[bench]'") from None


def _relaunch_cmd(recipe: str, inventory_path: str, timeout: float,
                  server: Server | None = None, key_file: str | None = None) -> list[str]:
    from orchestrator.bench.sweep import placed_args
    record = server.record if server is not None else None
    keyed = ["--host", (record.host if record else "") or "127.0.0.1",
             "--api-key-file", key_file] if key_file else []  # where it binds, with its key
    return [sys.executable, "-m", "orchestrator.cli", "launch", recipe, "--inventory",
            inventory_path, "--replace", "--yes", "--json", "--timeout", str(timeout),
            *placed_args(record), *keyed]  # exactly the measured server


def relauncher(inventory_path: str, timeout: float, server: Server | None = None,
               key_file: str | None = None) -> Any:
    """`sparkctl launch FILE --replace --yes` of the measured server in its own process group
    (a Ctrl-C reaches only bench: it stops the launch's waiting, restores the original)."""
    import json
    import os
    import signal
    import subprocess

    from orchestrator.errors import SparkctlError

    def relaunch(recipe: Any) -> None:
        proc = subprocess.Popen(_relaunch_cmd(str(recipe), inventory_path, timeout, server,
                                              key_file),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate()
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGINT)
            proc.communicate()
            raise
        if proc.returncode != 0:
            try:
                reason = json.loads(out).get("error") or ""
            except ValueError:
                reason = ""
            tail = (reason or err.strip())[-800:]
            raise SparkctlError(f"launch {recipe} failed (exit {proc.returncode}): {tail}")

    return relaunch


def _finish(doc: dict[str, Any], fmt: str, save: str | None, plot_path: str | None) -> int:
    """Print the results first, then --save, then --plot: a later step that fails (a full disk,
    a plotting error) costs only itself, never the measured figures."""
    from orchestrator.bench import format as bench_format
    from orchestrator.bench import render as bench_render
    from orchestrator.core.report import print_json

    sweep = doc.get("sweep")
    if fmt == "json":
        print_json(doc)
    elif fmt == "md":
        click.echo(bench_format.sweep_markdown(sweep) if sweep else bench_format.markdown(doc), nl=False)
    elif fmt == "csv":
        click.echo(bench_format.sweep_csv(sweep) if sweep else bench_format.csv_text(doc), nl=False)
    elif sweep:
        bench_render.render_sweep(sweep)
    else:
        bench_render.render(doc)
    failed = keep_outputs(doc, fmt == "json", save, plot_path, _note)
    code = 130 if doc.get("interrupted") else (0 if doc.get("ok") else 1)
    return code or (1 if failed else 0)


def _bench(opts: dict[str, Any]) -> int:
    import tempfile
    from pathlib import Path

    from orchestrator.bench.run import BenchConfig
    from orchestrator.core.runner import load_inventory_option
    from orchestrator.core.session import open_session
    from orchestrator.remote.tunnel import Forwarder

    config = BenchConfig(tg=opts["tg"], pp=opts["pp"], depth=opts["depth"],
                         concurrency=opts["concurrency"],
                         runs=opts["runs"], warmup=not opts["no_warmup"])
    check_outputs(opts["save"], opts["plot"])  # before minutes of measuring, not after
    _note(f"[bench] {expectation(config)}")
    inventory, inventory_path = load_inventory_option(opts["inventory_path"])
    with open_session(inventory, "bench", quiet=True) as session:
        bench = Bench(session, inventory, opts["server"])
        from orchestrator.engines.apikey import probe_host

        with Forwarder(bench.transport, bench.server.record.port,
                       remote_host=probe_host(bench.server.record.host)) as forward:
            if not opts["sweep"]:
                doc = bench.measure(config, forward.local_port)
                doc.update(command="bench", ok=not doc["interrupted"] and not any(
                    c["figures"]["error_count"] for c in doc["cells"]))
                return _finish(doc, opts["format"], opts["save"], opts["plot"])
            from orchestrator.bench.sweep import parse_sweep, run_sweep, write_variants
            from orchestrator.engines import load_recipe
            from orchestrator.engines.apikey import key_copy

            key, values = parse_sweep(opts["sweep"])
            original = opts["recipe"] or bench.server.record.recipe
            recipe = load_recipe(original)
            data = recipe.model_dump(mode="json", exclude_none=True)
            with tempfile.TemporaryDirectory(prefix="sparkctl-sweep-") as tmp:
                key, files = write_variants(data, key, values, Path(tmp),
                                             lambda path: load_recipe(str(path)))
                relaunch = relauncher(str(inventory_path), opts["timeout"], bench.server,
                                      key_copy(bench.transport, bench.server.record, Path(tmp)))
                result = run_sweep(values, files, relaunch,
                                   lambda value: bench.measure(config, forward.local_port),
                                   original, _note)
            result.update(key=key, values=values, original=str(original))
            doc = {"command": "bench", "schema": "sparkctl-bench-sweep/1", "sweep": result,
                   "interrupted": result["interrupted"],
                   "ok": not result["error"] and result["restored"] and not result["interrupted"]}
            return _finish(doc, opts["format"], opts["save"], opts["plot"])


@click.group(context_settings=CONTEXT, invoke_without_command=True)
@inventory_option
@click.option("--server", metavar="NAME", help="Which server (its name or recipe; needed when several run).",
              shell_complete=complete_server)
@click.option("--tg", metavar="N[,N]",
              help="Tokens to generate per request, 1-65,536 (quick: 32; --full: 128,256).")
@click.option("--pp", metavar="N[,N]", help="Prompt tokens per request, 1-1,048,576 (default 2048).")
@click.option("--depth", metavar="N[,N]",
              help="Context tokens before the prompt, a system message, 0-1,048,576 (quick: 0; "
                   "--full: 0,16384).")
@click.option("--concurrency", "-c", metavar="N[,N]",
              help="Simultaneous requests, 1-256 (quick: 1; --full: 1,4,8).")
@click.option("--full", is_flag=True,
              help="The full table: tg128,256 x c1,4,8, pp2048 at depth 0 and 16384 (many minutes).")
@click.option("--runs", type=RUNS, default=3, show_default=True,
              help="Measured batches per cell (mean and std over them).")
@click.option("--no-warmup", is_flag=True, help="Skip the discarded warmup batch of each cell.")
@click.option("--sweep", metavar="KEY=V1,V2,...",
              help="Relaunch with each value of a recipe key (e.g. speculative.max_draft_len=1,2,3,4),"
                   " benchmark each, restore the original recipe.")
@click.option("--recipe", metavar="RECIPE",
              help="With --sweep: the recipe to vary and restore (default: the running one's name).")
@click.option("--timeout", type=TIMEOUT, default=1800.0, show_default=True,
              help="With --sweep: seconds each relaunch may take.")
@json_option
@click.option("--format", "fmt", type=click.Choice(["table", "md", "csv", "json"]), default="table",
              show_default=True,
              help="md: llama-benchy's markdown table (mean ± std); csv; json (= --json).")
@click.option("--save", metavar="DIR", help="Keep the results as DIR/bench-<time>.json.")
@click.option("--gateway", is_flag=True,
              help="Measure through the gateway against the same replicas directly, in the same "
                   "run, on the gateway's node: median latency it adds (--runs x 10 requests) "
                   "and throughput at the highest --concurrency (docs/gateway.md).")
@click.option("--plot", metavar="FILE.png",
              help="Draw the results: generation per depth, prefill, TTFT (needs matplotlib).")
@click.pass_context
def bench(ctx: click.Context, **opts: Any) -> None:
    """Measure the running server like llama-benchy: tg and pp throughput, TTFT, peak,
    speculative acceptance, with every node's GPU state. Through SSH, as `chat`.

    \b
      sparkctl bench                          # quick: pp2048 tg32, 1 request, 3 runs
      sparkctl bench --full --format md       # tg128,256 x c1,4,8; pp2048 @ d0,16K
      sparkctl bench --pp 512 --tg 32 --depth 0,1024 --format md   # paste-ready table
      sparkctl bench --sweep speculative.max_draft_len=1,2,3,4,8 --plot sweep.png
      sparkctl bench compare before.json after.json --plot both.png
      sparkctl bench plot saved.json [other.json...] -o runs.png
    Ctrl-C stops the benchmark (never the server) and exits 130. See docs/bench.md.
    """
    if ctx.invoked_subcommand is not None:
        return
    for key, value in choose_cells(opts).items():
        opts[key] = int_list(key, value)
    if opts.pop("gateway"):
        from orchestrator.cli.gateway import bench_gateway

        run_command(lambda: bench_gateway(opts))
        return
    opts["format"] = "json" if opts.pop("as_json") else opts.pop("fmt")
    if opts["plot"]:
        need_matplotlib()
    run_command(lambda: _bench(opts))


@bench.command("compare")
@click.argument("first", type=click.Path(exists=True, dir_okay=False))
@click.argument("second", type=click.Path(exists=True, dir_okay=False))
@json_option
@click.option("--plot", metavar="FILE.png", help="Also draw both runs on the same panels.")
def compare(first: str, second: str, as_json: bool, plot: str | None) -> None:
    """Two saved runs (bench --save / --json) side by side, with B/A ratios."""
    if plot:
        need_matplotlib()

    def body() -> int:
        from orchestrator.bench.render import compare_rows, render_compare
        from orchestrator.bench.saved import load_saved
        from orchestrator.core.report import print_json
        from orchestrator.errors import InputError

        docs = [load_saved(path) for path in (first, second)]
        for path, doc in zip((first, second), docs, strict=True):
            if "cells" not in doc:
                raise InputError(f"{path}: a sweep; compare two runs (or `bench plot` it)")
        if plot:
            from orchestrator.bench.plot import check_plot_path, plot_runs

            check_plot_path(plot)
            plot_runs([("A", docs[0]), ("B", docs[1])], plot)
            _note(f"[bench] plot written to {plot}")
        if as_json:
            rows = compare_rows(docs[0], docs[1])
            print_json({"command": "bench compare", "a": first, "b": second, "rows": [
                dict(zip(("cell", "figure", "a", "b", "ratio"), r, strict=True)) for r in rows]})
        else:
            render_compare(docs[0], docs[1], (first, second))
        return 0

    run_command(body)


@bench.command("plot")
@click.argument("saved", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--output", "-o", default="bench.png", show_default=True, metavar="FILE.png",
              help="The picture to write (.png, .svg or .pdf).")
def plot_saved(saved: tuple[str, ...], output: str) -> None:
    """Plot saved runs (bench --save / --json): one run, several on the same panels, or a sweep."""
    need_matplotlib()

    def body() -> int:
        from pathlib import Path

        from orchestrator.bench.plot import check_plot_path, plot, plot_runs
        from orchestrator.bench.saved import load_saved

        check_plot_path(output)
        docs = [load_saved(path) for path in saved]
        if len(docs) == 1:
            written = plot(docs[0], output)
        elif any("sweep" in doc for doc in docs):
            from orchestrator.errors import InputError

            raise InputError("bench plot: a sweep is plotted alone (one file)")
        else:
            plot_runs([(Path(path).stem, doc) for path, doc in zip(saved, docs, strict=True)], output)
            written = [output]
        _note(f"[bench] plot written to {', '.join(written)}")
        return 0

    run_command(body)
