"""Registry access judged before pulling (phases/registry.py): the probe's answers read, who pulls
and who gets the image over the fabric, the up-front note and the error naming node, registry
and fix; the probe command run for real with a fake `docker`; SGLang's launch using it (image
check phase, Image + ImageShare limited to the server's nodes); and the lab shim's
`docker manifest inspect` failing under `block-registry` as a real blocked registry does."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import make_context, make_inventory
from conftest import node_facts as as_facts

from orchestrator.core.step import Change, RunOptions, Unchanged
from orchestrator.engines import load_recipe
from orchestrator.engines.sglang import ENGINE as SGLANG
from orchestrator.errors import SparkctlError
from orchestrator.phases import container_image as c
from orchestrator.phases import image_share as share
from orchestrator.phases import preflight, registry
from orchestrator.phases.registry import Reach, reach, registry_of, supply
from orchestrator.recipe import LaunchOptions
from orchestrator.remote.facts import gather_script

IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc13"
NO_HOST = 'Get "https://nvcr.io/v2/": dial tcp: lookup nvcr.io: no such host'
ID = "sha256:" + "9" * 64


def node(present: bool = False, probe: tuple[int, str, str] | None = (0, "reachable\n", ""),
         image: str = IMAGE) -> dict[str, Any]:
    facts: dict[str, Any] = {"images": {image: {"Id": ID, "RepoDigests": []} if present else None}}
    if probe is not None:
        rc, out, err = probe
        facts["commands"] = {f"registry {image}": {"rc": rc, "out": out, "err": err}}
    return facts


BLOCKED = (1, "", NO_HOST + "\n")


def test_registry_of_reads_references_as_docker_does() -> None:
    assert registry_of(IMAGE) == "nvcr.io"
    assert registry_of("scitrera/dgx-spark-sglang:0.5.12") == "docker.io"
    assert registry_of("ubuntu") == "docker.io"
    assert registry_of("localhost:5000/x:1") == "localhost:5000"
    assert registry_of("registry.local/a/b@sha256:" + "1" * 64) == "registry.local"


def test_the_probe_answers_are_read() -> None:
    assert reach(as_facts(node(present=True, probe=None)), IMAGE).state == "present"
    assert reach(as_facts(node()), IMAGE).state == "reachable"
    assert reach(as_facts(node(probe=None)), IMAGE) == Reach("unknown", "not probed")
    blocked = reach(as_facts(node(probe=BLOCKED)), IMAGE)
    assert (blocked.state, blocked.reason, blocked.network) == ("blocked", NO_HOST, True)
    timed_out = reach(as_facts(node(probe=(124, "", ""))), IMAGE)
    assert timed_out == Reach("blocked", "no answer within 10 s", True)
    tag = reach(as_facts(node(probe=(1, "", f"no such manifest: {IMAGE}"))), IMAGE)
    assert (tag.state, tag.network) == ("blocked", False)
    assert registry.cannot(IMAGE, tag) == f"cannot pull {IMAGE} from nvcr.io (no such manifest: {IMAGE})"
    old = reach(as_facts(node(probe=(1, "", "docker: 'manifest' is not a docker command."))), IMAGE)
    assert old.state == "unknown"  # an old docker: the pull decides, as before
    proxy = reach(as_facts(node(probe=(0, "unknown: the docker daemon's proxy has credentials x\n", ""))),
                  IMAGE)
    assert proxy.state == "unknown"


def test_a_blocked_peer_gets_the_image_from_a_node_that_has_it_or_pulls_it() -> None:
    reaches = {"spark-a": Reach("reachable"), "spark-b": reach(as_facts(node(probe=BLOCKED)), IMAGE)}
    plan = supply(IMAGE, reaches, ["spark-a", "spark-b"], "spark-a")
    assert (plan.pullers, plan.source, plan.error) == (["spark-a"], "spark-a", None)
    assert plan.notes() == [f"spark-b cannot reach nvcr.io ({NO_HOST}): it will get the image "
                            "from spark-a (which pulls it) over the fabric"]
    # the head blocked, the peer has it: the head gets it from the peer
    plan = supply(IMAGE, {"spark-a": reaches["spark-b"], "spark-b": Reach("present")},
                  ["spark-a", "spark-b"], "spark-a")
    assert (plan.pullers, plan.source, list(plan.receivers)) == ([], "spark-b", ["spark-a"])


def test_distribute_image_pulls_once_on_a_node_that_can() -> None:
    reaches = {"spark-a": reach(as_facts(node(probe=BLOCKED)), IMAGE), "spark-b": Reach("reachable"),
               "spark-c": Reach("unknown")}
    plan = supply(IMAGE, reaches, ["spark-a", "spark-b", "spark-c"], "spark-a", distribute=True)
    assert plan.pullers == ["spark-b"] and plan.source == "spark-b"
    assert plan.receivers["spark-c"] == "--distribute-image"
    assert plan.receivers["spark-a"].startswith("cannot reach nvcr.io")


def test_no_node_with_the_image_and_none_that_can_pull_is_an_error_naming_the_fix() -> None:
    reaches = {"spark-a": reach(as_facts(node(probe=BLOCKED)), IMAGE),
               "spark-b": reach(as_facts(node(probe=(124, "", ""))), IMAGE)}
    plan = supply(IMAGE, reaches, ["spark-a", "spark-b"], "spark-a")
    assert plan.error is not None and plan.source is None
    same = supply(IMAGE, {n: reaches["spark-a"] for n in ("spark-a", "spark-b")},
                  ["spark-a", "spark-b"], "spark-a")
    assert f": spark-a, spark-b cannot reach nvcr.io ({NO_HOST}). Fix:" in str(same.error)
    for part in (f"no node has {IMAGE} and none can pull it from nvcr.io",
                 f"spark-a cannot reach nvcr.io ({NO_HOST})",
                 "spark-b cannot reach nvcr.io (no answer within 10 s)",
                 "DNS, proxy, firewall", "`docker load`", "--distribute-image"):
        assert part in plan.error


def test_up_preflight_probes_in_the_same_facts_and_says_it_up_front() -> None:
    inv = make_inventory()
    request = preflight.preflight_request(inv, inv.node("spark-b"))
    assert f"registry {IMAGE}" in request["commands"]  # one round trip with the other facts
    step = preflight.phase(inv).steps[-1]
    assert isinstance(step, registry.RegistryCheck) and step.scope == "head"
    said: list[str] = []
    cluster = {"spark-a": node(), "spark-b": node(probe=BLOCKED)}
    ctx = make_context(inv, "spark-a", cluster, options=RunOptions(progress_note=said.append))
    outcome = step.check(ctx)
    assert isinstance(outcome, Unchanged)
    assert said == [f"note: spark-b cannot reach nvcr.io ({NO_HOST}): it will get the image from "
                    "spark-a (which pulls it) over the fabric"]
    assert ctx.shared.notes == [said[0].removeprefix("note: ")]
    # an interactive run checks again after the plan it showed: the note is not said twice
    again = make_context(inv, "spark-a", cluster, options=ctx.options)
    assert isinstance(step.check(again), Unchanged) and len(said) == 1
    assert again.shared.notes == ctx.shared.notes  # (still in that run's summary)
    nobody = {"spark-a": node(probe=BLOCKED), "spark-b": node(probe=BLOCKED)}
    with pytest.raises(SparkctlError, match=r"no node has .* spark-a, spark-b cannot reach nvcr\.io"):
        step.check(make_context(inv, "spark-a", nobody))


def test_the_image_step_of_a_blocked_node_does_not_pull_and_image_share_plans_the_copy() -> None:
    inv = make_inventory()
    cluster = {"spark-a": node(present=True), "spark-b": node(probe=BLOCKED)}
    peer = make_context(inv, "spark-b", cluster)
    change = c.Image(share=True).check(peer)
    assert isinstance(change, Change) and "docker pull" not in change.summary
    assert change.summary == (f"get {IMAGE} from spark-a over the fabric (cannot reach nvcr.io "
                              f"({NO_HOST}))")
    assert isinstance(c.Image().check(peer), Change)  # without share: the pull, as before
    planned = share.ImageShare().check(make_context(inv, "spark-a", cluster))  # a dry run
    assert isinstance(planned, Change) and planned.summary == \
        f"send {IMAGE} from spark-a over the fabric to spark-b"
    message = c.Image(share=True).apply(peer, change)
    assert peer.shared.image_wanted == {"spark-b": f"cannot reach nvcr.io ({NO_HOST})"}
    assert "sent by spark-a over the fabric" in str(message)


# ---------------------------------------------------------------- SGLang

def test_sglang_launch_checks_the_image_first_and_shares_it_among_its_nodes() -> None:
    inv = make_inventory()
    recipe = load_recipe("qwen3-8b").model_copy(update={"placement": ["spark-b"]})
    phases = SGLANG.launch_phases(recipe, inv, LaunchOptions())
    names = [p.name for p in phases]
    assert names[:3] == ["server-check", "image-check", "models"]
    check = phases[1]
    assert check.nodes(inv) == [inv.node("spark-a"), inv.node("spark-b")]
    assert f"registry {recipe.image}" in check.facts(inv, inv.node("spark-b"))["commands"]
    assert "commands" not in check.facts(inv, inv.node("spark-a"))  # not serving: not probed
    serve = phases[names.index("serve")]
    assert [s.name for s in serve.steps][:3] == ["image", "image-share", "image-digest"]
    assert f"registry {recipe.image}" in serve.facts(inv, inv.node("spark-b"))["commands"]
    image, image_share = serve.steps[0], serve.steps[1]
    # the head serves nothing but has the image: it sends it to the blocked spark-b
    cluster = {"spark-a": node(present=True, probe=None, image=recipe.image),
               "spark-b": node(probe=BLOCKED, image=recipe.image)}
    head = make_context(inv, "spark-a", cluster)
    assert isinstance(image.check(head), Unchanged)
    got = image.check(make_context(inv, "spark-b", cluster))
    assert isinstance(got, Change) and "from spark-a over the fabric" in got.summary
    planned = image_share.check(head)
    assert isinstance(planned, Change) and planned.payload == {
        "spark-b": f"cannot reach docker.io ({NO_HOST})"}
    # --distribute-image: the head lacks it and serves nothing, so spark-b (the server) pulls
    options = RunOptions(distribute_image=True)
    lacking = {"spark-a": node(probe=None, image=recipe.image),
               "spark-b": node(image=recipe.image)}
    pulls = image.check(make_context(inv, "spark-b", lacking, options=options))
    assert isinstance(pulls, Change) and pulls.summary == f"docker pull {recipe.image}"
    assert isinstance(image_share.check(make_context(inv, "spark-a", lacking, options=options)),
                      Unchanged)
    nobody = {"spark-a": node(probe=None, image=recipe.image),
              "spark-b": node(probe=BLOCKED, image=recipe.image)}
    with pytest.raises(SparkctlError, match=r"no node has .*spark-b cannot reach docker.io"):
        check.steps[0].check(make_context(inv, "spark-a", nobody))


# ---------------------------------------------------------------- the probe for real

FAKE_DOCKER = """#!/bin/sh
echo "$*" >> "$FAKE_LOG"
case "$1 $2" in
  "image inspect") [ -n "$FAKE_PRESENT" ] && { echo '[{"Id": "sha256:1"}]'; exit 0; }
                   echo "Error: No such image: $3" >&2; exit 1 ;;
  "info --format") case "$3" in *Mirrors*) echo "${FAKE_MIRRORS:-[]}" ;;
                                *) echo "$FAKE_PROXY|localhost" ;; esac; exit 0 ;;
  "manifest inspect") echo "proxy=$HTTPS_PROXY" >> "$FAKE_LOG"
                      [ -n "$FAKE_BLOCKED" ] && { echo "$FAKE_BLOCKED" >&2; exit 1; }
                      echo '{"schemaVersion": 2}'; exit 0 ;;
esac
exit 2
"""


def run_probe(tmp_path: Path, image: str = IMAGE, **env: str) -> tuple[dict[str, Any], str]:
    """The probe as a node runs it: the facts gatherer (`python3 - REQUEST`, the script on
    stdin) with the probe's request, against a stand-in docker that logs what it is asked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    log = tmp_path / "log"
    log.write_text("")
    result = subprocess.run([sys.executable, "-", json.dumps(registry.probe_request(image))],
                            input=gather_script(), capture_output=True, text=True, timeout=30,
                            env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(log),
                                 **env}, check=True)
    return json.loads(result.stdout), log.read_text()


def test_the_probe_command_asks_the_registry_only_when_the_image_is_missing(tmp_path: Path) -> None:
    facts, log = run_probe(tmp_path, FAKE_PRESENT="1")
    assert reach(as_facts(facts), IMAGE).state == "present" and "manifest" not in log
    assert log.count("image inspect") == 1  # the gathering's one look, for the fact and the gate
    facts, log = run_probe(tmp_path, FAKE_PROXY="http://proxy:3128")
    assert reach(as_facts(facts), IMAGE).state == "reachable"
    assert f"manifest inspect {IMAGE}" in log and "proxy=http://proxy:3128" in log
    facts, _ = run_probe(tmp_path, FAKE_BLOCKED=NO_HOST)
    assert reach(as_facts(facts), IMAGE) == Reach("blocked", NO_HOST, network=True)
    facts, log = run_probe(tmp_path, FAKE_PROXY="http://xxxxx:xxxxx@proxy:3128")
    assert reach(as_facts(facts), IMAGE).state == "unknown" and "manifest" not in log


def test_a_docker_hub_image_behind_a_daemon_mirror_is_not_judged_by_the_client(
        tmp_path: Path) -> None:
    """The daemon pulls docker.io images through its registry-mirrors; `docker manifest
    inspect` (the client) never uses them, so its failure would wrongly stop a node that pulls
    fine: with a mirror the probe says it cannot tell, and the node pulls as before."""
    hub = "scitrera/dgx-spark-sglang:0.5.12"
    facts, log = run_probe(tmp_path, hub, FAKE_MIRRORS='["https://mirror.example:5000/"]',
                           FAKE_BLOCKED=NO_HOST)
    found = reach(as_facts(facts), hub)
    assert found.state == "unknown" and "mirror.example" in found.reason and "manifest" not in log
    facts, log = run_probe(tmp_path, hub, FAKE_BLOCKED=NO_HOST)  # no mirror: the client decides
    assert reach(as_facts(facts), hub).state == "blocked" and "manifest inspect" in log
    facts, log = run_probe(tmp_path, IMAGE, FAKE_MIRRORS='["https://mirror.example:5000/"]',
                           FAKE_BLOCKED=NO_HOST)  # mirrors serve docker.io only
    assert reach(as_facts(facts), IMAGE).state == "blocked"


# ---------------------------------------------------------------- the lab's docker shim

def test_the_lab_shim_manifest_inspect_fails_under_block_registry_like_a_pull(
        tmp_path: Path, docker_shim: Any, capsys: pytest.CaptureFixture[str]) -> None:
    state, image = docker_shim("image")
    assert image.cmd_manifest(["inspect", IMAGE]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["manifests"][0]["digest"] == state.node_digest(IMAGE)
    with pytest.raises(state.DockerError, match="no such manifest"):
        image.cmd_manifest(["inspect", "nvcr.io/nvidia/none:1"])
    (tmp_path / "faults").mkdir()
    (tmp_path / "faults" / "block-registry").write_text("")
    with pytest.raises(state.DockerError) as blocked:
        image.cmd_manifest(["inspect", IMAGE])
    assert str(blocked.value).startswith(NO_HOST)
    with pytest.raises(state.DockerError) as pulled:
        state.pull(IMAGE, io.StringIO())
    assert str(pulled.value) == "Error response from daemon: " + str(blocked.value)
    with pytest.raises(state.DockerError, match=re.escape(
            '"https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io: no such host')):
        image.cmd_manifest(["inspect", "scitrera/dgx-spark-sglang:0.5.12"])  # Docker Hub
    assert sys.modules["sparklab_dockerd_image"] is image
