"""`sparkctl advise`: which layout serves a recipe fastest on N Sparks, predicted (pure, no
cluster access) and with --measure measured on the cluster. See docs/advise.md."""

from __future__ import annotations

from typing import Any

import click

from orchestrator.cli import CONTEXT, inventory_option, json_option, run_command

MAX_BANDWIDTH_GBS = 100_000
"""Far beyond any memory (a Spark has 273 GB/s); above it a typo, and `inf` would print
Infinity into --json, which no JSON reader takes."""


def _note(line: str) -> None:
    click.echo(line, err=True)


def _advise(opts: dict[str, Any]) -> int:
    from orchestrator.advise.advice import advise
    from orchestrator.advise.fabric import hardware
    from orchestrator.advise.render import lines
    from orchestrator.core.report import print_json
    from orchestrator.engines import engine_of, load_recipe

    recipe = load_recipe(opts["recipe_name"])
    engine = engine_of(recipe)
    nodes = opts["nodes"] or max(recipe.node_count, 2)
    bandwidth, measured_from = _bandwidth(opts["memory_bandwidth"], opts["inventory_path"])
    from orchestrator.advise.modelsource import ModelUnreadable
    from orchestrator.errors import InputError

    try:
        advice = advise(recipe, engine, nodes, opts["goal"], opts["concurrency"],
                        hardware(opts["netcheck"], bandwidth, measured_from), opts["acceptance"],
                        opts["context"])
    except ModelUnreadable as exc:
        raise InputError(f"advise {recipe.name}: {exc}") from None
    if opts["layouts"]:
        _only(advice, opts["layouts"])
    code = 0 if advice.pick is not None else 1
    if opts["measure"]:
        from orchestrator.cli.advise_measure import measure

        code = measure(advice, opts, _note)
    if opts["as_json"]:
        print_json(advice.to_json())
    else:
        click.echo("\n".join(lines(advice, opts["explain"])))
    return code


def _bandwidth(given: str | None, inventory_path: str | None) -> tuple[float | None, str | None]:
    """--memory-bandwidth: GB/s as given, `measure` (timed on the first node), or the Spark's."""
    from orchestrator.errors import InputError

    if given is None:
        return None, None
    if given == "measure":
        from orchestrator.cli.advise_bandwidth import measure_bandwidth

        return measure_bandwidth(inventory_path)
    try:
        value = float(given)
    except ValueError:
        value = 0.0
    if not 1 <= value <= MAX_BANDWIDTH_GBS:  # (nan and inf too: the JSON would not be JSON)
        raise InputError(f"--memory-bandwidth {given}: give GB/s (a number from 1 to "
                         f"{MAX_BANDWIDTH_GBS:,}) or "
                         "`measure` (timed on the cluster's first node)")
    return value, None


def _only(advice: Any, kinds: str) -> None:
    """--layouts: keep only these kinds (e.g. to measure fewer), and pick among them."""
    from orchestrator.errors import InputError

    wanted = {k.strip() for k in kinds.split(",") if k.strip()}
    offered = [a.layout.kind for a in advice.layouts]
    unknown = sorted(wanted - set(offered))
    if unknown:
        raise InputError(f"--layouts {kinds}: {', '.join(unknown)} is not a layout "
                         f"{advice.engine.title} offers for {advice.recipe.name} on "
                         f"{advice.nodes} node(s) (offered: {', '.join(offered)})")
    advice.layouts = [a for a in advice.layouts if a.layout.kind in wanted]
    advice.choose()


def _published() -> int:
    from orchestrator.advise.published import evaluate, render

    rows = evaluate()
    click.echo("\n".join(render(rows)))
    return 0 if all(r.within is not False for r in rows) else 1


@click.command(context_settings=CONTEXT)
@click.argument("recipe_name", metavar="RECIPE", required=False)
@click.option("--nodes", "-n", type=click.IntRange(1, 64), default=None,
              help="Sparks to lay the model out on (default: the recipe's, at least 2).")
@click.option("--goal", type=click.Choice(["latency", "throughput"]), default="latency",
              show_default=True, help="latency: fastest single request; throughput: most "
                                      "tokens/s in total at --concurrency.")
@click.option("--concurrency", "-c", type=click.IntRange(1, 4096), default=4, show_default=True,
              help="Simultaneous requests the aggregate is predicted (and measured) at.")
@click.option("--context", type=click.IntRange(0, 10_000_000), default=2048, show_default=True,
              help="Tokens in each request's context (the KV cache a step reads).")
@click.option("--acceptance", type=click.FloatRange(1, 64), default=None,
              help="Speculative decoding: tokens per step (1 + accepted drafts), e.g. what "
                   "`sparkctl bench` measured; default: modelled from the draft length.")
@click.option("--netcheck", metavar="FILE|none",
              help="A saved `sparkctl netcheck --deep --json`: the fabric's measured latency "
                   "and bandwidth instead of the Spark's published figures. Default: the last "
                   "`sparkctl netcheck` run from here, when it measured any; `none`: the "
                   "published figures.")
@click.option("--memory-bandwidth", default=None, metavar="GB/S|measure",
              help="Memory bandwidth per node (default: 273, the Spark's GPU). `measure`: time "
                   "one core copying memory on the inventory's first node (what a CPU engine, "
                   "such as the lab's, decodes at).")
@click.option("--layouts", metavar="KIND[,KIND]",
              help="Only these layouts (single, tp, pp, replicas), e.g. to --measure fewer.")
@click.option("--explain", is_flag=True, help="Show the arithmetic of every prediction.")
@json_option
@click.option("--published", is_flag=True,
              help="Print the published Spark figures the engines' efficiencies come from, with "
                   "each prediction and its error (no RECIPE needed).")
@click.option("--measure", is_flag=True,
              help="Launch each layout that fits in turn on the cluster, bench the same cells "
                   "each time, pick the best measured, then restore what was running before.")
@inventory_option
@click.option("--tg", type=click.IntRange(1, 65536), default=128, show_default=True,
              help="With --measure: tokens generated per request.")
@click.option("--pp", type=click.IntRange(1, 1_000_000), default=512, show_default=True,
              help="With --measure: prompt tokens per request.")
@click.option("--runs", type=click.IntRange(1, 20), default=1, show_default=True,
              help="With --measure: measured batches per cell.")
@click.option("--timeout", type=click.FloatRange(min=1), default=1800.0, show_default=True,
              help="With --measure: seconds each launch may take to answer.")
@click.option("--yes", "-y", is_flag=True, help="With --measure: do not ask before changing the "
                                               "cluster (needed off a terminal).")
def advise(**opts: Any) -> None:
    """Which layout serves RECIPE fastest on N Sparks: single node, tensor parallel, pipeline
    (layer) split or one replica per node, as the recipe's engine supports them.

    \b
    For each layout: the memory fit per node (the engine's estimate) and the predicted decode
    speed at 1 request and in aggregate at --concurrency, from first principles (active
    parameters x bytes per parameter / memory bandwidth, KV cache at --context, drafting and
    its acceptance length, collectives over the fabric) and one efficiency factor per engine
    fitted to published Spark figures (--published). Then a pick for --goal and how sure it is.
    Pure and instant: nothing on the cluster is touched, unless --measure.
    \b
      sparkctl advise qwen3-235b
      sparkctl advise qwen3-8b --nodes 2 --goal throughput --explain
      sparkctl advise qwen3-8b --nodes 2 --measure --yes --json
    See docs/advise.md.
    """
    if opts["published"]:
        run_command(_published)
        return
    if not opts["recipe_name"]:
        raise click.UsageError("RECIPE is needed (a built-in name or a recipe file), or --published")
    run_command(lambda: _advise(opts))
