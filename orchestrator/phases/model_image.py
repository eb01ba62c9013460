"""launch's `model-image` phase: the image the models' commands run in (phases/model_tools.py)
on the head and the serving nodes before anything reads the models."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.core.step import Phase

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node


def image_phase(image: str, serving: list[str], inventory: Inventory) -> Phase:
    """launch's first phase: the models' IMAGE on the head (it downloads) and the SERVING nodes
    (they hash and receive), pulled or sent over the fabric, before anything reads the models."""
    from orchestrator.phases.image_share import image_steps
    from orchestrator.phases.models import ServingPhase
    from orchestrator.phases.registry import RegistryCheck, with_probe

    nodes = [inventory.head_name, *(n for n in serving if n != inventory.head_name)]

    def facts(inv: Inventory, node: Node) -> dict[str, Any]:
        return with_probe({"images": [image]}, image)

    # first, on the head: every node can pull it or gets it from one that has it (said up front)
    steps = [RegistryCheck(lambda ctx: image, lambda ctx: nodes),
             *image_steps(lambda ctx: image, lambda ctx: nodes)]
    return ServingPhase("model-image", steps, facts, serving=nodes)
