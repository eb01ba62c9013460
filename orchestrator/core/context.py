"""The typed run context: what a command tells its steps (RunOptions) and what steps hand to
later steps of the same run (RunState), as named fields instead of dicts of strings.

RunOptions is made by the command and lives through its preview and its run (an interactive
`up` checks twice: the plan it shows, then the run); RunState is one per execution, so a
preview's notes never reach the run's report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.commands import Secret

Note = Callable[[str], None]
"""Prints one progress line for people (on stderr), while the step still runs."""


@dataclass
class RunOptions:
    """Per-run settings that steps may read (never secrets in plain text)."""

    command: str = "up"
    dry_run: bool = False
    verify: bool = False
    """`up --verify`: the verify steps (mpirun, the fabric MTU proof) run even when nothing
    changed."""
    distribute_image: bool = False
    """--distribute-image: one node pulls the image, the others receive it over the fabric."""
    hf_token: Secret | None = None
    """launch: the Hugging Face token, for the models phase (written to the node over stdin)."""
    progress_note: Note | None = None
    """Where a step says something while it runs (a download's progress, a registry note)."""
    notes_said: set[str] = field(default_factory=set)
    """Notes already printed through progress_note (the preview and the run say each once)."""
    token_missing: bool = False
    """Set by launch's token check when the launch stopped for want of a token (exit 2)."""
    gateway_nodes: list[str] | None = None
    """Set by launch's gateway check: the nodes holding a gateway record (None: not looked)."""

    def note(self, line: str) -> None:
        """One progress line through progress_note (nothing without one, nothing under -q:
        "no progress lines", a pull's progress included)."""
        from orchestrator.core.output import verbosity

        if self.progress_note is not None and verbosity() >= 0:
            self.progress_note(line)


@dataclass
class RunState:
    """What steps hand to later steps in the same run (e.g. generated public keys)."""

    notes: list[str] = field(default_factory=list)
    """Long explanations for the end of the report (e.g. every node's log tail)."""
    report_extra: dict[str, Any] = field(default_factory=dict)
    """Fields steps add to the JSON report (`fanout`, `image_distribution`, `log_tails`)."""
    changed_steps: list[str] = field(default_factory=list)
    """"node: phase/step" of every step that changed something (the executor appends): later
    verify steps re-run only when something changed."""
    image_facts: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    """node -> `docker image inspect` of the image pulled or received in this run (the facts
    gathered before it said "absent"; None: pulled, its inspect unreadable)."""
    image_wanted: dict[str, str] = field(default_factory=dict)
    """node -> why it needs the image from another node (phases/registry.py, image_share.py)."""
    host_keys: dict[str, str] = field(default_factory=dict)
    """node -> its host's public key, generated in this run (phases/ssh_keys.py)."""
    cluster_public_key: str | None = None
    """The cluster key pair's public half, generated in this run (phases/ssh_keys.py)."""
    netplan_to_confirm: set[str] = field(default_factory=set)
    """Nodes whose netplan apply must be confirmed by the network guard in this run."""
    engine: dict[str, Any] = field(default_factory=dict)
    """An engine's own values under its own keys (an engine folder's business)."""
