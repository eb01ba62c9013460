"""The container image node to node on the lab: a peer whose registry access is blocked
(`lab fault block-registry`) is found by preflight's registry probe before anything is pulled
and gets the image from the head over the fabric (docker save | docker load), digest and image
ID verified; `up --distribute-image` does it without the peer pulling; no node that has or can
pull the image stops `up` in preflight. SGLang's launch does the same for a server placed on a
node whose registry access is blocked (and refuses, before fetching the model, when no node
has the SGLang image), and vLLM's launch sends its image to a Ray worker node whose registry
access is blocked.

The lab's `docker rmi` keeps images (they cost nothing there), so a test removes the peer's
image by deleting the runtime's record of it (/var/lib/sparklab/images/<name>.json).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import SPARKCTL, Lab, e2e_state, healthy_lab
from sparklab.inventory import CONTAINER_IMAGE

from orchestrator.engines import load_recipe

pytestmark = pytest.mark.lab

IMAGE = CONTAINER_IMAGE  # the image the lab's inventory names: the one up pulls and shares
RECORD = "/var/lib/sparklab/images/" + IMAGE.replace("/", "+") + ".json"


def up(lab: Lab, *extra: str, command: str = "up", hf_token: str | None = None) -> dict[str, Any]:
    env = {**os.environ, "SPARKCTL_STATE_DIR": e2e_state("image-share")}
    env.pop("HF_TOKEN", None)
    if hf_token is not None:
        env["HF_TOKEN"] = hf_token
    result = subprocess.run([SPARKCTL, *command.split(), "--inventory", str(lab.inventory),
                             "--yes", "--json", *extra], capture_output=True, text=True, env=env,
                            timeout=300)
    report: dict[str, Any] = json.loads(result.stdout) if result.stdout.strip() else {}
    report["exit_code"], report["stderr"] = result.returncode, result.stderr
    return report


def step(report: dict[str, Any], node: str, name: str) -> dict[str, Any]:
    found = [s for s in report.get("hosts", {}).get(node, {}).get("steps", []) if s["step"] == name]
    assert found, f"no step {name} on {node}: {json.dumps(report)[-3000:]}"
    return dict(found[0])


def inspect(lab: Lab, node: str, image: str = IMAGE) -> dict[str, Any]:
    out = lab.exec(node, ["docker", "image", "inspect", image]).stdout
    return dict(json.loads(out)[0])


def assert_sent_by_the_head(lab: Lab, report: dict[str, Any], image: str, registry: str,
                            container: str) -> dict[str, Any]:
    """The peer got IMAGE from the head over the fabric: said up front, the same image ID and
    digest on both, the digest verified, and the peer's CONTAINER runs it. The share step."""
    head, peer = lab.nodes[0], lab.nodes[1]
    assert report["exit_code"] == 0, json.dumps(report)[-3000:]
    assert any(n.startswith(f"{peer} cannot reach {registry}") and
               n.endswith(f"it will get the image from {head} over the fabric")
               for n in report["notes"]), report["notes"]
    theirs, mine = inspect(lab, peer, image), inspect(lab, head, image)
    # `docker load` keeps the image ID (its content) but no registry digest (classic store)
    assert theirs["Id"] == mine["Id"] and theirs["RepoDigests"] == []
    digest = mine["RepoDigests"][0].split("@", 1)[1]
    shared = step(report, head, "image-share")
    assert f"{peer} <- {head} (cannot reach {registry}" in shared["message"]
    assert f"{digest} verified" in shared["message"]
    sent = report["image_distribution"][peer]
    assert (sent["from"], sent["digest"], sent["image_id"]) == (head, digest, mine["Id"])
    running = lab.exec(peer, ["docker", "inspect", "-f", "{{.State.Running}} {{.Image}}",
                              container]).stdout.split()
    assert running == ["true", mine["Id"]]
    return shared


@pytest.fixture(scope="module")
def image_lab(lab_session: list[Lab]) -> Iterator[Lab]:
    lab = healthy_lab(lab_session)
    # the session's lab may still serve what another module launched: a server holding the
    # nodes' memory would stop a launch here at its memory check, before the image is looked at
    cleared = up(lab, command="down")
    assert cleared["exit_code"] == 0, cleared["stderr"][-2000:]
    first = up(lab)
    assert first["exit_code"] == 0, first["stderr"][-2000:]
    yield lab
    lab.cli("fault", "restore")


def test_a_peer_without_registry_access_gets_the_image_from_the_head(image_lab: Lab) -> None:
    lab = image_lab
    head, peer = lab.nodes[0], lab.nodes[1]
    lab.cli("fault", "block-registry", "--node", peer, check=True)
    try:
        lab.exec(peer, f"rm -f {RECORD}")
        pull = lab.exec(peer, ["docker", "pull", IMAGE], check=False)
        assert pull.returncode != 0 and "no such host" in pull.stderr
        report = up(lab)
        shared = assert_sent_by_the_head(lab, report, IMAGE, "nvcr.io", "trtllm-multinode")
        assert shared["status"] == "changed"
        # said up front (preflight's probe), and the peer never tried to pull
        said = (f"{peer} cannot reach nvcr.io (Get \"https://nvcr.io/v2/\": dial tcp: lookup "
                f"nvcr.io: no such host")
        assert said in step(report, head, "registry")["message"]
        assert report["stderr"].index(said) < report["stderr"].index("phase network")
        assert f"sent by {head} over the fabric" in step(report, peer, "image")["message"]
        assert step(report, peer, "image-digest")["status"] == "ok"
    finally:
        lab.cli("fault", "restore", "--node", peer)
    again = up(lab)  # nothing left to send: the peer has it now
    assert again["exit_code"] == 0 and step(again, head, "image-share")["status"] == "ok"


def test_distribute_image_sends_it_without_pulling_on_the_peer(image_lab: Lab) -> None:
    lab = image_lab
    head, peer = lab.nodes[0], lab.nodes[1]
    lab.exec(peer, f"rm -f {RECORD}")
    report = up(lab, "--distribute-image")
    assert report["exit_code"] == 0, json.dumps(report)[-3000:]
    assert f"sent by {head} over the fabric" in step(report, peer, "image")["message"]
    assert f"{peer} <- {head} (--distribute-image" in step(report, head, "image-share")["message"]
    assert inspect(lab, peer)["Id"] == inspect(lab, head)["Id"]
    record = json.loads(lab.exec(peer, f"cat {RECORD}").stdout)
    assert record.get("loaded") is True  # docker load registered it: no pull on the peer


def test_no_node_with_the_image_or_a_registry_stops_up_in_preflight(image_lab: Lab) -> None:
    lab = image_lab
    for node in lab.nodes:
        lab.cli("fault", "block-registry", "--node", node, check=True)
        lab.exec(node, f"rm -f {RECORD}")
    try:
        report = up(lab)
        assert report["exit_code"] == 1 and report["changed"] == 0, json.dumps(report)[-3000:]
        failed = step(report, lab.nodes[0], "registry")
        assert failed["phase"] == "preflight" and failed["status"] == "failed"
        assert (f"no node has {IMAGE} and none can pull it from nvcr.io: "
                f"{', '.join(lab.nodes)} cannot reach nvcr.io") in failed["message"]
        assert "`docker load`" in failed["message"] and "--distribute-image" in failed["message"]
        assert not any(s["phase"] == "network" for s in report["hosts"][lab.nodes[0]]["steps"])
    finally:
        lab.cli("fault", "restore")
    assert up(lab)["exit_code"] == 0  # both pull again


SGLANG_IMAGE = "scitrera/dgx-spark-sglang:0.5.12"
SGLANG_RECORD = "/var/lib/sparklab/images/" + SGLANG_IMAGE.replace("/", "+") + ".json"


def test_an_sglang_server_on_a_blocked_node_gets_its_image_from_one_that_has_it(
        image_lab: Lab) -> None:
    lab = image_lab
    head, peer = lab.nodes[0], lab.nodes[1]
    for node in lab.nodes:
        lab.exec(node, f"rm -f {SGLANG_RECORD}")
    # the head fetches the models with the server's image, so it needs it too: both blocked
    for node in lab.nodes:
        lab.cli("fault", "block-registry", "--node", node, check=True)
    launch = ("launch qwen3-8b", "--nodes", peer, "--timeout", "240")
    try:
        refused = up(lab, *launch[1:], command=launch[0])
        assert refused["exit_code"] == 1, json.dumps(refused)[-3000:]
        failed = step(refused, head, "registry")
        assert failed["phase"] == "model-image"  # launch's first phase: nothing changed yet
        assert f"no node has {SGLANG_IMAGE} and none can pull it from docker.io" in failed["message"]
        assert f"{peer} cannot reach docker.io" in failed["message"]
        assert "`docker load`" in failed["message"]
        assert not any(s["phase"] == "models" for s in refused["hosts"][head]["steps"])
        lab.cli("fault", "restore", "--node", head)
        lab.exec(head, ["docker", "pull", SGLANG_IMAGE])  # now a node has it
        report = up(lab, *launch[1:], command=launch[0])
        shared = assert_sent_by_the_head(lab, report, SGLANG_IMAGE, "docker.io",
                                         "sparkctl-sglang-qwen3-8b")
        assert shared["phase"] == "model-image"  # before the models: the copy's receiver runs it
        assert report["node"] == peer and report["ok"]
    finally:
        for node in lab.nodes:
            lab.cli("fault", "restore", "--node", node)
        up(lab, "--server", "qwen3-8b", command="down")


VLLM_IMAGE = load_recipe("minimax-m2.7").image  # the launch's own image (one that ships Ray)
VLLM_RECORD = "/var/lib/sparklab/images/" + VLLM_IMAGE.replace("/", "+") + ".json"


def test_a_vllm_worker_on_a_blocked_node_gets_its_image_from_the_head(image_lab: Lab) -> None:
    lab = image_lab
    head, peer = lab.nodes[0], lab.nodes[1]
    lab.exec(head, ["docker", "pull", VLLM_IMAGE])
    lab.exec(peer, f"rm -f {VLLM_RECORD}")
    lab.cli("fault", "block-registry", "--node", peer, check=True)
    try:
        # MiniMax M2.7 is gated: the lab's hub wants a token (any), never shown anywhere
        report = up(lab, "--timeout", "240", command="launch minimax-m2.7",
                    hf_token="hf_SENTINELimageShareToken")
        # the peer's Ray worker runs the image it was sent, and Ray counts both nodes
        shared = assert_sent_by_the_head(lab, report, VLLM_IMAGE, "nvcr.io",
                                         "sparkctl-vllm-minimax-m2.7")
        assert shared["phase"] == "model-image"  # launch's first phase: the models' commands
        assert "hf_SENTINELimageShareToken" not in json.dumps(report)
        assert "2 node(s) alive" in step(report, head, "ray-cluster")["message"]
    finally:
        lab.cli("fault", "restore", "--node", peer)
        up(lab, "--server", "minimax-m2.7", command="down")
