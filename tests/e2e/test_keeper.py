"""SSH connections kept between runs (remote/keeper.py) against the lab's real OpenSSH servers.

A run that connected itself leaves a keeper holding one connection per node; the next run goes
through it (no new TCP connection reaches a node's sshd, its trace has only kept connections);
a node rebooted under it is connected to afresh; a host key rotated while a connection is kept
is refused once `sparkctl disconnect` closed them; `SPARKCTL_SSH_PERSIST=0` keeps nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Lab, Sparkctl, e2e_state, inventory_args

pytestmark = pytest.mark.lab

sparkctl = Sparkctl("keeper")
KEEPER = Path(e2e_state("keeper")) / "ssh-keeper"


def sshd_peers(lab: Lab, node: str) -> list[str]:
    """The controller's TCP connections established to the node's sshd (port 22)."""
    out = lab.exec(node, "ss -Htn state established '( sport = :22 )'").stdout
    return sorted(line.split()[-1] for line in out.splitlines() if line.strip())


def logins(lab: Lab, node: str) -> int:
    """Logins the node's sshd accepted so far (its log, /var/log/sparklab-sshd.log)."""
    out = lab.exec(node, "grep -c 'Accepted publickey' /var/log/sparklab-sshd.log", check=False)
    return int(out.stdout.strip() or 0)


def wait_kept(nodes: list[str], since: int = 0) -> str:
    """The keeper's log once it says every node connected (after byte SINCE)."""
    deadline, log = time.monotonic() + 30, ""
    while time.monotonic() < deadline:
        log = (KEEPER / "keeper.log").read_text()[since:] if (KEEPER / "keeper.log").exists() else ""
        if all(f"{node}: connected" in log for node in nodes):
            return log
        time.sleep(0.2)
    raise AssertionError(f"the keeper did not connect every node: {log}")


def log_size() -> int:
    path = KEEPER / "keeper.log"
    return path.stat().st_size if path.exists() else 0


def connects(trace: Path) -> list[dict[str, object]]:
    lines = trace.read_text().splitlines() if trace.exists() else []
    return [json.loads(line) for line in lines if '"connect"' in line]


@pytest.fixture
def kept_lab(lab: Lab) -> Iterator[Lab]:
    """The lab with no kept connection, and none left behind."""
    sparkctl("disconnect")
    yield lab
    sparkctl("disconnect")


def test_the_next_run_goes_through_the_kept_connections(kept_lab: Lab, tmp_path: Path) -> None:
    lab = kept_lab
    since = log_size()  # (the state directory, and its keeper's log, outlive a test run)
    before = {node: sshd_peers(lab, node) for node in lab.nodes}
    first = sparkctl("status", *inventory_args(lab), "--json",
                     env={"SPARKCTL_TRACE": str(tmp_path / "first.jsonl")})
    assert first.returncode in (0, 1), first.stdout + first.stderr
    assert not any(c.get("kept") for c in connects(tmp_path / "first.jsonl"))
    wait_kept(lab.nodes, since)
    held = {node: sshd_peers(lab, node) for node in lab.nodes}
    for node in lab.nodes:  # the first run's connection closed, the keeper's open (another
        # module's keeper may have closed its own since: only new connections count)
        assert len(set(held[node]) - set(before[node])) == 1, (node, before[node], held[node])
    logged_in = {node: logins(lab, node) for node in lab.nodes}
    second = sparkctl("status", *inventory_args(lab), "--json",
                      env={"SPARKCTL_TRACE": str(tmp_path / "second.jsonl")})
    assert second.returncode == first.returncode, second.stdout + second.stderr
    report = json.loads(second.stdout)
    assert all(report["nodes"][node]["reachable"] for node in lab.nodes), report["nodes"]
    kept = connects(tmp_path / "second.jsonl")
    assert sorted(str(c["node"]) for c in kept) == sorted(lab.nodes)
    assert all(c.get("kept") is True for c in kept), kept
    for node in lab.nodes:  # no login for the second run
        assert logins(lab, node) == logged_in[node] > 0, node
    assert (KEEPER.stat().st_mode & 0o777) == 0o700
    assert (KEEPER / "socket").stat().st_mode & 0o077 == 0


def test_a_node_rebooted_under_a_kept_connection_is_connected_to_afresh(
        kept_lab: Lab, tmp_path: Path) -> None:
    lab = kept_lab
    head, other = lab.nodes
    since = log_size()
    assert sparkctl("status", *inventory_args(lab)).returncode in (0, 1)
    wait_kept(lab.nodes, since)
    rebooted = lab.cli("reboot", "--node", other)
    assert rebooted.returncode == 0, rebooted.stdout + rebooted.stderr
    since = log_size()
    after = sparkctl("status", *inventory_args(lab), "--json",
                     env={"SPARKCTL_TRACE": str(tmp_path / "after.jsonl")})
    report = json.loads(after.stdout)
    assert report["nodes"][other]["reachable"], report["nodes"][other]
    by_node = {str(c["node"]): c for c in connects(tmp_path / "after.jsonl")}
    assert by_node[head].get("kept") is True and not by_node[other].get("kept"), by_node
    wait_kept([other], since)  # the run handed the new route over when it ended


def test_a_rotated_host_key_is_refused_once_the_kept_connections_are_closed(kept_lab: Lab) -> None:
    lab = kept_lab
    _, other = lab.nodes
    since = log_size()
    assert sparkctl("status", *inventory_args(lab)).returncode in (0, 1)
    wait_kept(lab.nodes, since)
    lab.cli("fault", "rotate-hostkey", "--node", other, check=True)
    try:
        # the kept connection was verified when it opened (as with OpenSSH's ControlMaster)
        kept = json.loads(sparkctl("status", *inventory_args(lab), "--json").stdout)
        assert kept["nodes"][other]["reachable"], kept["nodes"][other]
        closed = sparkctl("disconnect")
        assert closed.returncode == 0 and f"{other}" in closed.stdout, closed.stdout
        fresh = sparkctl("status", *inventory_args(lab), "--json")
        said = fresh.stdout + fresh.stderr
        assert fresh.returncode == 1 and "HOST KEY CHANGED" in said and other in said, said
    finally:
        lab.cli("fault", "restore", "--node", other, check=True)


def test_keeping_turned_off_leaves_no_keeper(kept_lab: Lab) -> None:
    lab = kept_lab
    off = {"SPARKCTL_SSH_PERSIST": "0"}
    assert sparkctl("status", *inventory_args(lab), env=off).returncode in (0, 1)
    time.sleep(1)
    assert not (KEEPER / "socket").exists()
    assert "no connections were kept" in sparkctl("disconnect", env=off).stdout
