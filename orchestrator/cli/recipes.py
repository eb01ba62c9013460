"""`sparkctl recipes [list|show|import]`: the built-in and the user's recipes, one recipe in full,
and a sparkrun or eugr recipe made a sparkctl recipe (orchestrator/engines/importing.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from orchestrator.cli import CONTEXT, json_option, run_command


@click.group(context_settings=CONTEXT, invoke_without_command=True)
@click.pass_context
def recipes(ctx: click.Context) -> None:
    """List the built-in and your recipes, show one (name or file) with its memory estimate, or
    import a sparkrun or eugr recipe."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_recipes)


@recipes.command("list")
@json_option
def list_recipes(as_json: bool = False) -> None:
    """The built-in recipes and yours (marked `user`, from the user recipe folder), one a line
    (--json: one object with a list)."""
    def body() -> int:
        from orchestrator.core.report import print_json
        from orchestrator.engines import recipe_files, user_recipe_files

        rows = [_row(name, path, "built-in") for name, path in recipe_files().items()]
        rows += [_row(name, path, "user") for name, path in user_recipe_files().items()]
        rows.sort(key=lambda r: r["name"])
        if as_json:
            print_json({"command": "recipes list", "ok": True, "recipes": rows})
        else:
            click.echo(recipe_table(rows), nl=False)
        return 0

    run_command(body)


def _row(name: str, path: Any, origin: str) -> dict[str, Any]:
    """One recipe's line; a user recipe that no longer validates is listed with the reason."""
    from orchestrator.engines import engine_of, load_recipe
    from orchestrator.errors import InputError

    try:
        recipe = load_recipe(str(path))
    except InputError as exc:
        return {"name": name, "origin": origin, "path": str(path), "error": str(exc)}
    engine = engine_of(recipe)
    estimate = engine.estimate_memory(recipe)
    return {"name": name, "origin": origin, "path": str(path), "engine": engine.name,
            "model": recipe.model, "nodes": recipe.node_count, "drafting": recipe.drafting,
            "port": recipe.port, "fits": estimate.fits, "memory_gb": estimate.total_gb}


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
    """One recipe a line, columns as wide as their widest value (names and models vary); the
    user's recipes end in `user`, one that does not validate says why on its line."""
    cells = []
    for r in rows:
        mark = "user" if r.get("origin") == "user" else ""
        if "error" in r:
            cells.append([r["name"], "INVALID: " + r["error"].splitlines()[-1].strip(),
                          "", "", "", "", "", mark])
            continue
        cells.append([r["name"], r["engine"], r["model"], f"nodes {r['nodes']}",
                      r["drafting"] or "no draft", f"port {r['port']}",
                      "fits" if r["fits"] else "DOES NOT FIT", mark])
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))] if cells else []
    return "".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n"
                   for row in cells)


@recipes.command("import")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Write the sparkctl recipe here (default: the user recipe "
                                 "folder, $XDG_CONFIG_HOME/sparkctl/recipes/NAME.yml).")
@click.option("--name", default=None, help="The recipe's name (default: from the file name).")
@click.option("--weights-gb", type=click.FloatRange(min=0.1, max=4096), default=None,
              help="The model's weight files in GB, when the recipe does not say and the "
                   "model's name gives no parameter count.")
@click.option("--image", default=None, metavar="IMAGE",
              help="Serve with this image instead of the recipe's `container` (e.g. the "
                   "engine version sparkctl's option table is pinned to).")
@click.option("--force", is_flag=True, help="Replace an existing recipe file.")
@json_option
def import_recipe(file: Path, out: Path | None, name: str | None, weights_gb: float | None,
                  image: str | None, force: bool, as_json: bool) -> None:
    """Make a sparkrun or eugr (spark-vllm-docker) recipe FILE a sparkctl recipe.

    The command template is parsed as the engine's own parser would (its option table at the
    pinned version): an option the engine lacks is refused, naming the nearest valid one.
    Tensor/pipeline parallel, port, memory fraction, image, environment and the other flags are
    carried over; what changes on the way (a wider --host, a locally built image, flags sparkctl
    sets per node) is printed and written into the recipe's header; what sparkctl has no
    equivalent for (eugr's mods, pre_exec hooks) is refused (exit 2). Then
    `sparkctl recipes show NAME` and `sparkctl launch NAME`.
    """
    def body() -> int:
        from orchestrator.core.report import print_json
        from orchestrator.engines import user_recipes_dir
        from orchestrator.engines.importing import import_recipe as run_import

        done = run_import(file, out=out, user_dir=user_recipes_dir(), name=name,
                          weights_gb=weights_gb, image=image, force=force)
        if as_json:
            print_json({"command": "recipes import", "ok": True, **done.to_json()})
            return 0
        click.echo(f"{done.path}: recipe {done.name} ({done.engine}) from {done.source}")
        for note in done.notes:
            click.echo(f"  warning: {note}", err=True)
        launch = done.name if out is None else str(done.path)
        click.echo(f"next: sparkctl recipes show {launch}; sparkctl launch {launch} --dry-run")
        return 0

    run_command(body)
