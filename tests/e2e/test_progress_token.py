"""Long waits say what they do, and the HF token is checked before anything downloads.

An `up` whose image pull is slow (the lab's docker spreads its layer lines over `pull_seconds`)
prints per-layer progress with bytes on stderr; a `launch` with a token the lab's hub refuses
stops with exit 1 naming the hub, and one without a token for a gated model with exit 2, both
before a byte is downloaded or a container changes.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Lab, Sparkctl, healthy_lab

from orchestrator.inventory_checks import load_inventory

pytestmark = pytest.mark.lab

LAB_JSON = "/var/lib/sparklab/config/lab.json"
OUTBOX = "cat /var/lib/sparklab/outbox/hf-downloads.log 2>/dev/null || true"
HUB = "/home/nvidia/.cache/huggingface"


RUN = Sparkctl("progress-token")


def sparkctl(home: Path, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    # a HOME of its own: no ~/.cache/huggingface/token of the machine's is picked up
    return RUN(*args, token=token or False, env={"HOME": str(home)})

def image_of(lab: Lab) -> str:
    image = load_inventory(lab.inventory).container.image
    assert image
    return image


def record(image: str) -> str:
    return "/var/lib/sparklab/images/" + image.replace("/", "+") + ".json"


def set_pull_seconds(lab: Lab, seconds: float) -> None:
    for node in lab.nodes:
        lab.exec(node, f"python3 -c \"import json; p='{LAB_JSON}'; c=json.load(open(p)); "
                       f"c['pull_seconds']={seconds}; json.dump(c, open(p, 'w'))\"")


@pytest.fixture(scope="module")
def slow_up(lab_session: list[Lab], tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[Lab, Path, subprocess.CompletedProcess[str]]]:
    lab = healthy_lab(lab_session)
    home = tmp_path_factory.mktemp("home")
    set_pull_seconds(lab, 24)
    for node in lab.nodes:  # the image must be pulled again
        lab.exec(node, f"rm -f '{record(image_of(lab))}'")
    try:
        result = sparkctl(home, "up", "--inventory", str(lab.inventory), "--yes")
    finally:
        set_pull_seconds(lab, 0)
    yield lab, home, result


def test_a_slow_pull_shows_layers_and_bytes(
        slow_up: tuple[Lab, Path, subprocess.CompletedProcess[str]]) -> None:
    lab, _, result = slow_up
    assert result.returncode == 0, result.stdout + result.stderr
    image = image_of(lab)
    for node in lab.nodes:
        lines = [line for line in result.stderr.splitlines() if f"{node}: {image}:" in line]
        assert f"↓ {node}: docker pull {image}" in result.stderr, result.stderr
        # bytes while downloading (docker on a pseudo-terminal), then each layer as it completes
        assert any("downloading; 0/4 layers done" in line and "downloaded" in line for line in lines), \
            result.stderr
        assert any(" pull complete; 4/4 layers done, 27.03 GB of 27.03 GB downloaded" in line
                   for line in lines), result.stderr
        assert f"{node}: Status: Downloaded newer image for {image}" in result.stderr


def test_a_refused_token_stops_the_launch_before_any_download(
        slow_up: tuple[Lab, Path, subprocess.CompletedProcess[str]]) -> None:
    lab, home, _ = slow_up
    head = lab.nodes[0]
    lab.exec(head, f"rm -rf {HUB}/hub {HUB}/drafts")
    before = lab.exec(head, OUTBOX).stdout
    containers = lab.exec(head, "docker ps -a --format '{{.Names}} {{.ID}}'").stdout

    refused = sparkctl(home, "launch", "qwen3-235b", "--inventory", str(lab.inventory), "--yes",
                       "--json", token="wrong-token-e2e")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    report = json.loads(refused.stdout)
    (failed,) = [s for s in report["hosts"][head]["steps"] if s["status"] == "failed"]
    assert failed["step"] == "hf-token"
    assert "rejected by the hub https://huggingface.co (Error: Invalid user token." in \
        failed["message"]
    assert "wrong-token-e2e" not in refused.stdout + refused.stderr

    missing = sparkctl(home, "launch", "qwen3-235b", "--inventory", str(lab.inventory), "--yes")
    assert missing.returncode == 2, missing.stdout + missing.stderr
    assert ("nvidia/Qwen3-235B-A22B-FP4, nvidia/Qwen3-235B-A22B-Eagle3 are gated on the hub and "
            "no HF token was given") in \
        missing.stdout + missing.stderr

    # nothing fetched, nothing written, no container touched
    assert lab.exec(head, OUTBOX).stdout == before
    assert lab.exec(head, f"ls {HUB}/hub 2>/dev/null | grep -c models-- || true").stdout.strip() \
        in ("", "0")
    assert lab.exec(head, "docker ps -a --format '{{.Names}} {{.ID}}'").stdout == \
        containers
