"""TensorRT-LLM's section of the inventory: `engines: {trtllm: {container: ...}}`.

Its container (sshd for MPI, the image every rank runs) is the one `up` keeps on every node;
an inventory written before the engine sections has it at the top level (`container:`), which
still loads, with a note (inventory_checks.py).
"""

from __future__ import annotations

from pydantic import Field

from orchestrator.inventory import CONTAINER_NAME_PATTERN, IMAGE_PATTERN, ContainerSettings
from orchestrator.recipe import StrictModel

DEFAULT_IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc13"


class TrtllmContainer(ContainerSettings):
    image: str = Field(default=DEFAULT_IMAGE, pattern=IMAGE_PATTERN)
    """TensorRT-LLM image; the same digest must be on every node."""
    name: str = Field(default="trtllm-multinode", pattern=CONTAINER_NAME_PATTERN)
    """Container name on every node."""
    ssh_port: int = Field(default=2233, ge=1, le=65535)
    """Port of the container's sshd (MPI's launcher); it listens on fabric addresses only."""


class Settings(StrictModel):
    container: TrtllmContainer = TrtllmContainer()
    """The container `up` runs on every node (sshd, MPI, the server's ranks)."""
