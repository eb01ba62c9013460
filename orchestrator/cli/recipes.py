"""`sparkctl recipes [list|show]`: the built-in recipes, and one recipe in full."""

from __future__ import annotations

from typing import Any

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
            estimate = engine.estimate_memory(recipe)
            rows.append({"name": name, "engine": engine.name, "model": recipe.model,
                         "nodes": recipe.node_count, "drafting": recipe.drafting,
                         "port": recipe.port, "fits": estimate.fits,
                         "memory_gb": estimate.total_gb})
        if as_json:
            print_json({"command": "recipes list", "ok": True, "recipes": rows})
        else:
            click.echo(recipe_table(rows), nl=False)
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
        from orchestrator.engines import capabilities, engine_of, load_recipe

        recipe = load_recipe(name)
        engine = engine_of(recipe)
        estimate = engine.estimate_memory(recipe)
        if as_json:
            print_json({"recipe": recipe.model_dump(mode="json"), "engine": engine.name,
                        "memory": estimate.model_dump(mode="json"),
                        **capabilities.config_preview(engine, recipe)})
            return 0
        click.echo(f"# {recipe.source}")
        click.echo(yaml.safe_dump(recipe.model_dump(mode="json", exclude_none=True), sort_keys=False))
        for title, text in engine.describe(recipe):
            click.echo(f"# {title}:")
            click.echo(text)
        click.echo(f"\n# memory: {estimate.explanation}")
        return 0 if estimate.fits else 1

    run_command(body)


def recipe_table(rows: list[dict[str, Any]]) -> str:
    """One recipe a line, columns as wide as their widest value (names and models vary)."""
    cells = [[r["name"], r["engine"], r["model"], f"nodes {r['nodes']}",
              r["drafting"] or "no draft", f"port {r['port']}",
              "fits" if r["fits"] else "DOES NOT FIT"] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))] if cells else []
    return "".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n"
                   for row in cells)
