"""A node's facts as one typed record (remote/gathered.py): the real gatherer's answer parses
into NodeFacts, sections not asked for read as empty, and a malformed answer is refused where it
arrives, naming the node and the section, not later as a KeyError inside some step."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FakeTransport
from test_node_gather import gather

from orchestrator.errors import SparkctlError
from orchestrator.remote.fact_records import CommandResult, FileInfo
from orchestrator.remote.facts import gather_facts
from orchestrator.remote.gathered import DiskEntry, NodeFacts, ProbeResult


def test_the_real_gatherers_answer_parses_into_typed_facts(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "f.txt").write_text("hi\n")
    raw = gather({"files": {str(tmp_path / "f.txt"): True}, "commands": {"ok": "echo out"},
                  "python": True, "users": ["root"], "disk": [str(tmp_path)],
                  "resolve": ["127.0.0.1"], "links": True, "routes": ["127.0.0.1"],
                  "probes": {"echo": {"argv": ["echo", "probe"]}}, "lock_peek": True},
                 tmp_path, monkeypatch)
    facts = NodeFacts.parse(raw, "spark-a")
    assert facts.node == "spark-a" and facts.hostname == raw["hostname"]
    assert facts.time == raw["time"] and facts.python is not None and facts.python >= (3, 8)
    assert facts.command("ok") == CommandResult(0, "out\n", "") and facts.output("ok") == "out\n"
    found = facts.file(str(tmp_path / "f.txt"))
    assert found is not None and found.exists and found.content == "hi\n"
    assert facts.users == {"root": True}
    assert isinstance(facts.disk[str(tmp_path)], DiskEntry)
    assert facts.disk[str(tmp_path)].free_bytes == raw["disk"][str(tmp_path)]["free_bytes"]
    assert facts.resolve["127.0.0.1"] == ("127.0.0.1",)
    assert facts.routes == {"127.0.0.1": raw["routes"]["127.0.0.1"]}
    assert facts.probes["echo"] == ProbeResult(0, "probe\n", "", raw["probes"]["echo"]["seconds"])
    assert facts.links is not None and "lo" in facts.links.links
    assert set(facts.space) == set(raw["space"]) and facts.lock is not None
    assert facts.lock["free"] is True


def test_sections_not_asked_for_read_as_empty() -> None:
    facts = NodeFacts.parse({"hostname": "spark-a"}, "spark-a")
    assert facts.command("x") is None and facts.output("x") == "" and facts.file("/x") is None
    assert not facts.exists("/x") and facts.container("c") is None and facts.image("i") is None
    assert facts.links is None and facts.roce.ports == {} and facts.netplan == {}
    assert facts.python is None and facts.time is None and facts.lock is None


def test_a_failed_inspect_raises_naming_the_node_unless_read_leniently() -> None:
    facts = NodeFacts.parse({"containers": {"c": {"error": " permission denied\n"}, "gone": None},
                             "images": {"i": {"Id": "sha256:1", "RepoDigests": ["r@sha256:2"]}}},
                            "spark-b")
    with pytest.raises(SparkctlError, match=r"^spark-b: `docker inspect c` failed: permission denied$"):
        facts.container("c")
    assert facts.container("c", strict=False) is None and facts.container("gone") is None
    assert facts.inspect_error("containers", "c") == "permission denied"
    image = facts.image("i")
    assert image is not None and image.id == "sha256:1" and image.repo_digests == ("r@sha256:2",)


@pytest.mark.parametrize(("raw", "section"), [
    ({"commands": {"ok": "not an object"}}, "commands"),
    ({"commands": ["ok"]}, "commands"),
    ({"files": {"/x": 3}}, "files"),
    ({"links": ["enp1s0f1np1"]}, "links"),
    ({"containers": {"c": "running"}}, "containers"),
    ({"python": ["three"]}, "python"),
    ({"time": "noon"}, "time"),
    ({"ibdev2netdev": {"devices": {}, "rc": "x"}}, "ibdev2netdev"),
])
def test_a_malformed_section_is_refused_naming_node_and_section(raw: dict[str, object],
                                                                 section: str) -> None:
    with pytest.raises(SparkctlError, match=rf"^spark-b: the facts gatherer's `{section}` is malformed"):
        NodeFacts.parse(raw, "spark-b")


def test_gather_facts_parses_once_where_the_answer_arrives() -> None:
    """The glue: the executor's gather_facts hands back NodeFacts, or refuses naming the node."""
    node = FakeTransport("spark-a", facts={"hostname": "spark-a",
                                           "files": {"/etc/x": {"exists": False}}})
    facts = gather_facts(node, {"files": {"/etc/x": False}})  # type: ignore[arg-type]
    assert isinstance(facts, NodeFacts) and facts.node == "spark-a"
    assert facts.file("/etc/x") == FileInfo(exists=False)
    broken = FakeTransport("spark-b", facts={"hostname": "spark-b", "space": ["/"]})
    with pytest.raises(SparkctlError, match=r"^spark-b: the facts gatherer's `space` is malformed"):
        gather_facts(broken, {})  # type: ignore[arg-type]
    odd = FakeTransport("spark-c", facts=["not", "an", "object"])  # type: ignore[arg-type]
    with pytest.raises(SparkctlError, match=r"^spark-c: the facts gatherer answered list"):
        gather_facts(odd, {})  # type: ignore[arg-type]
