"""`sparkctl recipes [list|show]`: the built-in recipes, and one recipe in full."""

from __future__ import annotations

import click

from orchestrator.cli import CONTEXT, json_option, run_command


@click.group(context_settings=CONTEXT, invoke_without_command=True)
@click.pass_context
def recipes(ctx: click.Context) -> None:
    """List built-in recipes, or show one (name or file) with its memory estimate."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_recipes)


@recipes.command("list")
@json_option
def list_recipes(as_json: bool = False) -> None:
    """The built-in recipes, one a line (--json: one object with a list)."""
    def body() -> int:
        from orchestrator.core.report import print_json
        from orchestrator.engines import builtin_names, engine_of, load_recipe

        rows = []
        for name in builtin_names():
            recipe = load_recipe(name)
            engine = engine_of(recipe)
            spec = getattr(recipe, "speculative", None)
            drafting = f"{spec.decoding_type} {spec.max_draft_len}" if spec else "no draft"
            estimate = engine.estimate_memory(recipe)
            rows.append({"name": name, "engine": engine.name, "model": recipe.model,
                         "nodes": recipe.node_count, "drafting": drafting if spec else None,
                         "port": recipe.port, "fits": estimate.fits,
                         "memory_gb": estimate.total_gb})
            if not as_json:
                click.echo(f"{name:18} {engine.name:7} {recipe.model:38} nodes "
                           f"{recipe.node_count}  {drafting:12} port {recipe.port}  "
                           f"{'fits' if estimate.fits else 'DOES NOT FIT'}")
        if as_json:
            print_json({"command": "recipes list", "ok": True, "recipes": rows})
        return 0

    run_command(body)


@recipes.command("show")
@click.argument("name")
@json_option
def show_recipe(name: str, as_json: bool) -> None:
    """A recipe, its engine's generated config, its serve command and its memory estimate."""
    def body() -> int:
        import yaml

        from orchestrator.core.report import print_json
        from orchestrator.engines import engine_of, load_recipe

        recipe = load_recipe(name)
        engine = engine_of(recipe)
        estimate = engine.estimate_memory(recipe)
        if as_json:
            print_json({"recipe": recipe.model_dump(mode="json"), "engine": engine.name,
                        "memory": estimate.model_dump(mode="json"), **engine.config_preview(recipe)})
            return 0
        click.echo(f"# {recipe.source}")
        click.echo(yaml.safe_dump(recipe.model_dump(mode="json", exclude_none=True), sort_keys=False))
        for title, text in engine.describe(recipe):
            click.echo(f"# {title}:")
            click.echo(text)
        click.echo(f"\n# memory: {estimate.explanation}")
        return 0 if estimate.fits else 1

    run_command(body)
