"""orchestrator/node/gather.py run as the nodes run it: `python3 - REQUEST` with the script on
stdin, here in-process (so coverage sees it) with its state folder moved into a tmp dir."""

from __future__ import annotations

import io
import json
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.remote.facts import gather_script


def gather(request: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    source = gather_script().replace('"/var/lib/sparkctl"', repr(str(tmp_path / "state")))
    assert source.count(str(tmp_path)) == 2  # the lock's state folder and the space it reports
    out = io.StringIO()
    monkeypatch.setattr(sys, "argv", ["-", json.dumps(request)])
    monkeypatch.setattr(sys, "stdout", out)
    exec(compile(source, "orchestrator/node/gather.py", "exec"), {"__name__": "__main__"})
    return json.loads(out.getvalue())  # type: ignore[no-any-return]


def test_files_commands_and_system_facts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small = tmp_path / "small.txt"
    small.write_text("hello\n")
    small.chmod(0o640)
    netplan = tmp_path / "netplan"
    netplan.mkdir()
    (netplan / "50-x.yaml").write_text("network: {version: 2, ethernets: {eth9: {}}}\n")
    facts = gather({
        "files": {str(small): True, str(tmp_path / "missing"): False, str(tmp_path): False},
        "commands": {"ok": "echo out; echo err >&2", "bad": "exit 3"},
        "python": True, "users": ["root", "no-such-user-xyz"], "disk": [str(tmp_path)],
        "resolve": ["127.0.0.1", "no-such-host.invalid"], "links": True, "routes": ["127.0.0.1"],
        "probes": {"echo": {"argv": ["echo", "probe"]}, "gone": {"argv": ["/no/such/tool"]}},
        "containers": ["sparkctl-test-none"], "ibdev2netdev": True,
    }, tmp_path, monkeypatch)
    assert facts["hostname"] == socket.gethostname()
    assert facts["files"][str(small)]["content"] == "hello\n"
    assert facts["files"][str(small)]["mode"] == 0o640
    assert facts["files"][str(tmp_path / "missing")] == {"exists": False}
    assert "content" not in facts["files"][str(tmp_path)]
    assert facts["commands"]["ok"] == {"rc": 0, "out": "out\n", "err": "err\n"}
    assert facts["commands"]["bad"]["rc"] == 3
    assert facts["python"][:2] == list(sys.version_info[:2])
    assert facts["users"] == {"root": True, "no-such-user-xyz": False}
    assert facts["resolve"] == {"127.0.0.1": ["127.0.0.1"], "no-such-host.invalid": []}
    assert facts["probes"]["echo"]["out"] == "probe\n" and facts["probes"]["gone"]["rc"] == 127
    assert str(tmp_path) in facts["disk"]
    assert "lo" in facts["links"] or facts["links"]
    assert "containers" in facts and "ibdev2netdev" in facts and "routes" in facts


def test_the_lock_is_taken_once_and_names_its_holder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    owner = {"token": "t1", "user": "ann", "command": "up"}
    first = gather({"lock": owner}, tmp_path, monkeypatch)
    assert first["lock"] == {"held": True}
    again = gather({"lock": owner}, tmp_path, monkeypatch)
    assert again["lock"] == {"held": True}  # the same run asking again
    other = gather({"lock": {"token": "t2"}, "lock_stale_seconds": 3600}, tmp_path, monkeypatch)
    assert other["lock"]["held"] is False and other["lock"]["holder"]["user"] == "ann"
    broken = gather({"lock": {"token": "t3", "break": True}}, tmp_path, monkeypatch)
    assert broken["lock"] == {"held": True}
    assert json.loads((tmp_path / "state" / "lock" / "owner").read_text())["token"] == "t3"


STANDIN_DOCKER = """#!/bin/sh
echo "$*" >> "$DOCKER_LOG"
[ "$1 $2" = "image inspect" ] || exit 2
case "$3" in
  here) echo '[{"Id": "sha256:1", "RepoTags": ["here"]}]' ;;
  broken) echo "Cannot connect to the Docker daemon" >&2; exit 1 ;;
  *) echo "Error: No such image: $3" >&2; exit 1 ;;
esac
"""


def test_commands_gated_on_an_image_share_the_gatherings_one_inspect(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A command gated on an image runs only while the image is as its gate wants it, else is
    answered from the gate; docker is asked about each image once, whoever asks first."""
    bin_dir, log = tmp_path / "bin", tmp_path / "docker.log"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(STANDIN_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    monkeypatch.setenv("DOCKER_LOG", str(log))

    def gate(image: str, run_while: str) -> dict[str, str]:
        return {"image": image, "run_while": run_while, "otherwise": f"skipped {run_while}\n"}

    facts = gather({
        "images": ["here", "gone"],
        "commands": {"pull-probe": "echo probed", "manifest": "echo hashed",
                     "absent-probe": "echo probed", "no-manifest": "echo hashed",
                     "daemon-down": "echo probed"},
        "gates": {"pull-probe": gate("here", "absent"), "manifest": gate("here", "present"),
                  "absent-probe": gate("gone", "absent"), "no-manifest": gate("gone", "present"),
                  "daemon-down": gate("broken", "absent")},
    }, tmp_path, monkeypatch)
    commands = facts["commands"]
    assert commands["pull-probe"] == {"rc": 0, "out": "skipped absent\n", "err": ""}
    assert commands["manifest"]["out"] == "hashed\n"
    assert commands["absent-probe"]["out"] == "probed\n"
    assert commands["no-manifest"]["out"] == "skipped present\n"
    assert commands["daemon-down"]["out"] == "probed\n"  # docker could not tell: as absent
    assert facts["images"]["here"]["Id"] == "sha256:1" and facts["images"]["gone"] is None
    asked = log.read_text().splitlines()
    assert sorted(asked) == ["image inspect broken", "image inspect gone", "image inspect here"]
