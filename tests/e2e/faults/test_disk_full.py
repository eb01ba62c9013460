"""A full disk on a node is named (node, path, free space) by every command, never mistaken
for a lock held by another run, and never a remote traceback (issue #20)."""

from __future__ import annotations

import json

import pytest
from conftest import Lab
from faultkit import converge, sparkctl

pytestmark = pytest.mark.lab


def test_disk_full_is_named_by_every_command(lab: Lab, tally: object) -> None:
    converge(lab)
    lab.cli("fault", "disk-full", "--node", "spark-a", check=True)
    try:
        inventory = str(lab.inventory)
        for args in (["up", "--yes"], ["up", "--yes", "--break-lock"], ["down", "--yes"],
                     ["down", "--yes", "--break-lock"], ["launch", "qwen3-235b", "--yes"]):
            result = sparkctl(lab, *args, "--inventory", inventory, HF_TOKEN="hf_DiskFull42")
            text = result.stdout + result.stderr
            assert result.returncode == 1, (args, text)
            assert "spark-a" in text and "/var/lib/sparkctl" in text and "free" in text, (args, text)
            assert "locked by another" not in text and "Traceback" not in text, (args, text)
        status = sparkctl(lab, "status", "--inventory", inventory, "--json")
        answer = json.loads(status.stdout)
        assert status.returncode == 1
        node = answer["nodes"]["spark-a"]
        assert any("disk full" in p for p in node["problems"]), node
        assert node["container"]["status"] == "unknown", node["container"]
        assert answer["server"] is None and "disk full" in answer["server_unknown"]
        plain = sparkctl(lab, "status", "--inventory", inventory).stdout
        assert "none launched" not in plain and "server: unknown" in plain, plain
    finally:
        lab.cli("fault", "restore", check=True)
    converge(lab)
    tally.add("faults survived")  # type: ignore[attr-defined]
