"""The container image node to node on the lab: a peer whose registry access is blocked
(`lab fault block-registry`) gets the image from the head over the fabric (docker save | docker
load), digest and image ID verified; `up --distribute-image` does it without the peer pulling.

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
from conftest import REPO, Lab, e2e_state, healthy_lab

pytestmark = pytest.mark.lab

SPARKCTL = str(REPO / ".venv" / "bin" / "sparkctl")
IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12"
RECORD = "/var/lib/sparklab/images/" + IMAGE.replace("/", "+") + ".json"


def up(lab: Lab, *extra: str) -> dict[str, Any]:
    env = {**os.environ, "SPARKCTL_STATE_DIR": e2e_state("image-share")}
    result = subprocess.run([SPARKCTL, "up", "--inventory", str(lab.inventory), "--yes",
                             "--json", *extra], capture_output=True, text=True, env=env,
                            timeout=300)
    report: dict[str, Any] = json.loads(result.stdout) if result.stdout.strip() else {}
    report["exit_code"], report["stderr"] = result.returncode, result.stderr
    return report


def step(report: dict[str, Any], node: str, name: str) -> dict[str, Any]:
    return next(s for s in report["hosts"][node]["steps"] if s["step"] == name)


def inspect(lab: Lab, node: str) -> dict[str, Any]:
    out = lab.exec(node, ["docker", "image", "inspect", IMAGE]).stdout
    return dict(json.loads(out)[0])


@pytest.fixture(scope="module")
def image_lab(lab_session: list[Lab]) -> Iterator[Lab]:
    lab = healthy_lab(lab_session)
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
        assert report["exit_code"] == 0, json.dumps(report)[-3000:]
        assert "will come from another node" in step(report, peer, "image")["message"]
        theirs, mine = inspect(lab, peer), inspect(lab, head)
        assert theirs["Id"] == mine["Id"] and theirs["RepoDigests"] == mine["RepoDigests"]
        digest = mine["RepoDigests"][0].split("@", 1)[1]
        shared = step(report, head, "image-share")
        assert shared["status"] == "changed"
        assert f"{peer} <- {head} (its pull failed" in shared["message"]
        assert f"{digest} verified" in shared["message"]
        sent = report["image_distribution"][peer]
        assert (sent["from"], sent["digest"], sent["image_id"]) == (head, digest, mine["Id"])
        assert step(report, peer, "image-digest")["status"] == "ok"
        running = lab.exec(peer, ["docker", "inspect", "-f", "{{.State.Running}} {{.Image}}",
                                  "trtllm-multinode"]).stdout.split()
        assert running == ["true", mine["Id"]]
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
    assert "--distribute-image" in step(report, peer, "image")["message"] or \
        "sent by another node" in step(report, peer, "image")["message"]
    assert f"{peer} <- {head} (--distribute-image" in step(report, head, "image-share")["message"]
    assert inspect(lab, peer)["Id"] == inspect(lab, head)["Id"]
    record = json.loads(lab.exec(peer, f"cat {RECORD}").stdout)
    assert record.get("loaded") is True  # docker load registered it: no pull on the peer
