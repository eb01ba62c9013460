"""TensorRT-LLM's container: which Open MPI the image ships (MpiVersion), detected once per
image ID and recorded on the node; the launcher's MPI names follow it (faked facts and
FakeTransport, no I/O)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import FakeTransport
from conftest import make_context as context
from conftest import make_inventory as inventory

from orchestrator.core.step import Change, Unchanged
from orchestrator.engines.trtllm import container
from orchestrator.engines.trtllm.mpi_env import FACT_KEY, detect_and_record_cmd
from orchestrator.errors import SparkctlError

IMAGE_ID = "sha256:" + "ab" * 32
RECORD = {"image": "x", "image_id": IMAGE_ID, "implementation": "Open MPI", "version": "5.0.11",
          "major": 5}


def node_facts(image_id: str | None = IMAGE_ID, record: dict[str, Any] | None = None,
               image: str | None = None) -> dict[str, Any]:
    image = image or inventory().container.image
    images = {image: {"Id": image_id}} if image_id else {image: {"error": "No such image"}}
    out = json.dumps(record) + "\n" if record else ""
    return {"images": images, "commands": {FACT_KEY: {"rc": 0, "out": out}}}


def test_a_recorded_version_for_this_image_id_is_used_without_running_anything() -> None:
    inv = inventory()
    ctx = context(inv, "spark-a", {"spark-a": node_facts(record=RECORD)})
    outcome = container.MpiVersion().check(ctx)
    assert outcome == Unchanged("Open MPI 5.0.11 in the image (recorded)")
    assert ctx.shared.engine[container.MPI_KEY] == {"spark-a": RECORD}
    assert container.mpi_major(ctx) == 5


def test_a_new_image_is_detected_once_and_recorded() -> None:
    inv = inventory()
    stale = dict(RECORD, image_id="sha256:old")
    head = FakeTransport("spark-a", [(0, "some banner\n" + json.dumps(dict(RECORD, major=4,
                                                                          version="4.1.7")), "")])
    ctx = context(inv, "spark-a", {"spark-a": node_facts(record=stale)}, transports={"spark-a": head})
    change = container.MpiVersion().check(ctx)
    assert isinstance(change, Change)
    assert change.summary == f"detect the image's MPI: docker run --rm {inv.container.image} mpirun --version"
    assert container.mpi_major(ctx) == 4  # preview: from the tag (rc12 ships Open MPI 4)

    assert container.MpiVersion().apply(ctx, change) == (
        "Open MPI 4.1.7 (recorded in the node's /var/lib/sparkctl/images)")
    (call,) = head.calls
    assert call.command == detect_and_record_cmd(inv.container.image, IMAGE_ID) and call.sudo
    assert call.display == f"docker run --rm {inv.container.image} mpirun --version"
    assert container.mpi_major(ctx) == 4
    assert ctx.shared.engine[container.MPI_KEY]["spark-a"]["version"] == "4.1.7"


def test_the_image_id_pulled_in_this_run_wins_over_the_gathered_facts() -> None:
    inv = inventory()
    shared = {"image_facts": {"spark-a": {"Id": IMAGE_ID}}}
    ctx = context(inv, "spark-a", {"spark-a": node_facts(image_id=None, record=RECORD)}, shared=shared)
    assert isinstance(container.MpiVersion().check(ctx), Unchanged)


def test_detection_failures_say_what_the_image_lacks() -> None:
    inv = inventory()
    no_image = context(inv, "spark-a", {"spark-a": node_facts(image_id=None)})
    change = container.MpiVersion().check(no_image)
    with pytest.raises(SparkctlError, match=r"spark-a: container/mpi-version: .* has no image ID on "
                                            r"the node \(pull failed\?\)"):
        container.MpiVersion().apply(no_image, change)

    for answer in ((3, "", "no Open MPI version in `mpirun --version`:\nbash: mpirun: not found"),
                   (0, "not json at all", ""), (0, "", "")):
        head = FakeTransport("spark-a", [answer])
        ctx = context(inv, "spark-a", {"spark-a": node_facts()}, transports={"spark-a": head})
        with pytest.raises(SparkctlError) as err:
            container.MpiVersion().apply(ctx, change)
        message = str(err.value)
        assert message.startswith(f"spark-a: container/mpi-version: `mpirun --version` in "
                                  f"{inv.container.image} failed (exit {answer[0]}):")
        assert "the image must have it on its PATH" in message
        assert answer[2].strip()[-20:] in message
        assert container.MPI_KEY not in ctx.shared.engine


def test_run_args_follow_the_detected_open_mpi() -> None:
    inv = inventory()
    node = inv.node("spark-a")
    ompi4 = container.run_args(inv, node, ["rocep1s0f1"], "/hf", False, mpi_major=4)
    ompi5 = container.run_args(inv, node, ["rocep1s0f1"], "/hf", True, mpi_major=5)
    assert any(a.startswith("OMPI_MCA_orte_default_hostfile=") for a in ompi4)
    assert not any(a.startswith("OMPI_MCA_orte") for a in ompi5)
    assert any(a.startswith("PRTE_MCA_prte_default_hostfile=") for a in ompi5)
    assert "/dev/infiniband:/dev/infiniband" in ompi5 and "/dev/infiniband:/dev/infiniband" not in ompi4
