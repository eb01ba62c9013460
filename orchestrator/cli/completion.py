"""Shell completion of recipe and server names (click's shell_complete).

Enable it once per shell (bash; zsh and fish alike with zsh_source / fish_source):
    eval "$(_SPARKCTL_COMPLETE=bash_source sparkctl)"
Recipe names are the built-in recipes and the user's (engines.user_recipes_dir), and files
for a recipe path. Server names complete
from the same names: a server is named after its recipe unless `launch --name` said otherwise;
asking the cluster which servers run would cost an SSH round trip per Tab.
"""

from __future__ import annotations

from typing import Any

from click.shell_completion import CompletionItem


def _recipes(incomplete: str) -> list[CompletionItem]:
    from orchestrator.engines import recipe_names

    return [CompletionItem(name) for name in recipe_names() if name.startswith(incomplete)]


def complete_recipe(ctx: Any, param: Any, incomplete: str) -> list[CompletionItem]:
    """A built-in recipe's name, or a recipe file when what is typed looks like a path."""
    if "/" in incomplete or incomplete.endswith((".yml", ".yaml")):
        return [CompletionItem(incomplete, type="file")]
    return _recipes(incomplete) or [CompletionItem(incomplete, type="file")]


def complete_server(ctx: Any, param: Any, incomplete: str) -> list[CompletionItem]:
    return _recipes(incomplete)
