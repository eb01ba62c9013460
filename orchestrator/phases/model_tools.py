"""Where the models' commands run, for every engine: a short-lived container per command
(`docker run --rm`) of the image the recipe's engine serves with (Engine.model_image: the
recipe's own image, TensorRT-LLM's `up` image), with the node's HF cache mounted where every
engine's container sees it, on the host network (the fan-out listens on the fabric address).

Nothing stays running between commands, and no engine's long-lived container is needed: a
cluster that serves only SGLang downloads with SGLang's image. The HF token never reaches a
command line or `docker inspect`: the download reads it from a 0600 file (HF_TOKEN_PATH names
the path, mounted read-only while it exists), `hf auth whoami` from stdin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.commands import env_args, join, quote
from orchestrator.paths import TOKEN_PATH
from orchestrator.recipe import CONTAINER_HF_HOME
from orchestrator.remote.facts import Command, ImageGate

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory

SECRETS_DIR = TOKEN_PATH.rsplit("/", 1)[0]
NO_IMAGE = "sparkctl: no-image"
"""What the manifest fact prints when the image is not on the node yet (a dry run before the
model-image phase pulled it): the models are then unknown there, not an error."""


@dataclass(frozen=True)
class ModelTools:
    image: str
    hf_cache: str
    """The node's HF cache (cluster.hf_cache; ~ is the cluster user's home)."""
    user: str

    def host_cache(self) -> str:
        """The cache path as the node's shell expands it (~user, never the caller's ~)."""
        if self.hf_cache == "~" or self.hf_cache.startswith("~/"):
            return f"~{self.user}" + (f"/{quote(self.hf_cache[2:])}" if self.hf_cache[2:] else "")
        return quote(self.hf_cache)

    def host_hub(self) -> str:
        """The cache's hub folder as a node-side script reads it (os.path.expanduser there:
        ~user, never the caller's ~)."""
        if self.hf_cache == "~" or self.hf_cache.startswith("~/"):
            return f"~{self.user}{self.hf_cache[1:]}/hub"
        return f"{self.hf_cache.rstrip('/')}/hub"

    def cmd(self, argv: list[Any], env: dict[str, str] | None = None, interactive: bool = False,
            token: bool = False) -> str:
        """`argv` in a fresh container of the image, removed when it ends; with `token`, the
        secrets folder (the token file) mounted read-only."""
        flags = ["run", "--rm", *(["-i"] if interactive else []), "--network", "host",
                 "--pull", "never", "--entrypoint", "", *env_args("-e", env or {})]
        mounts = f"-v {self.host_cache()}:{quote(CONTAINER_HF_HOME)}"
        if token:
            mounts += " " + join(["-v", f"{SECRETS_DIR}:{SECRETS_DIR}:ro"])
        return f"{join(['docker', *flags])} {mounts} {join([self.image, *argv])}"

    def when_present(self, key: str, command: str) -> Command:
        """The fact KEY: `command` when the image is on the node, else NO_IMAGE (never pulls:
        it is a fact), judged by the gathering's own `docker image inspect`."""
        return Command(key, command, gate=ImageGate(self.image, "present", NO_IMAGE + "\n"))

    def shown(self, what: str) -> str:
        """How a command is shown in the run log and dry runs."""
        return f"docker run --rm {self.image} {what}"


def model_tools(image: str, inventory: Inventory) -> ModelTools:
    """The models' commands in short-lived containers of IMAGE (the engine's `model_image`)."""
    return ModelTools(image, inventory.cluster.hf_cache, inventory.cluster.user)
