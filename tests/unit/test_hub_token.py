"""phases/hub_token.py: the HF token checked on the head before anything downloads: present when
a missing repository is gated, accepted by the hub (`hf auth whoami`, the token on stdin), and
the lab's `hf auth whoami` (lab/sparklab/image/sparklab_engine/hf_cli.py)."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any

import pytest
from conftest import FakeCluster, model_args
from test_models import DRAFT, MODEL, RECIPE, facts_of, head_manifests, hub_entry, local_entry

from orchestrator.commands import Secret
from orchestrator.core.step import RunOptions, Unchanged
from orchestrator.errors import InputError, SparkctlError
from orchestrator.phases import hub_token

GATED = ("huggingface_hub.errors.GatedRepoError: 401 Client Error.\nCannot access gated repo for "
         f"url https://huggingface.co/api/models/{MODEL}/revision/main.")


def missing_facts() -> dict[str, Any]:
    return {"spark-a": facts_of({MODEL: hub_entry({}, present=False, commit=None),
                                 DRAFT: local_entry()})}


def options(**values: Any) -> RunOptions:
    return RunOptions(command="launch", **values)


@pytest.mark.parametrize(("status", "output", "state", "hub"), [
    (0, "hub=https://huggingface.co\nuser: someone", "accepted", "https://huggingface.co"),
    (1, "hub=http://hub.lan:8080\nError: Invalid user token. (401 Client Error)", "rejected",
     "http://hub.lan:8080"),
    (1, "hub=\nConnectionError: Max retries exceeded with url: /api/whoami-v2", "unreachable",
     "https://huggingface.co"),
    (1, "hub=https://huggingface.co\nNot logged in", "unknown", "https://huggingface.co"),
    (2, "hub=https://huggingface.co\nhf: error: invalid choice: 'auth'", "unknown",
     "https://huggingface.co"),
])
def test_whoami_answers(status: int, output: str, state: str, hub: str) -> None:
    verdict = hub_token.read_whoami(status, output)
    assert (verdict.state, verdict.hub) == (state, hub)


def test_nothing_to_download_asks_nothing(fake_cluster: Callable[..., FakeCluster]) -> None:
    cluster = fake_cluster(facts={"spark-a": facts_of(head_manifests())})
    ctx = cluster.context("spark-a", options=options(hf_token=Secret("hf_x")))
    outcome = hub_token.HubToken(RECIPE, model_args(RECIPE)[1]).check(ctx)
    assert isinstance(outcome, Unchanged) and "no token needed" in outcome.reason
    assert cluster["spark-a"].calls == []


def test_a_refused_token_stops_before_any_download_naming_the_hub(
        fake_cluster: Callable[..., FakeCluster]) -> None:
    cluster = fake_cluster(facts=missing_facts())
    head = cluster["spark-a"]
    head.on("whoami", status=1, stdout="hub=https://huggingface.co\n",
            stderr="Error: Invalid user token. (401 Client Error: Unauthorized)")
    ctx = cluster.context("spark-a", options=options(hf_token=Secret("hf_wrong")))
    with pytest.raises(SparkctlError, match=r"spark-a: the HF token .* rejected by the hub "
                                            r"https://huggingface.co \(.*401") as caught:
        hub_token.HubToken(RECIPE, model_args(RECIPE)[1]).check(ctx)
    assert not isinstance(caught.value, InputError)  # exit 1: the input was there, the hub said no
    (call,) = head.calls
    # the token only on stdin: never on the command line or in the container's environment
    assert call.stdin == "hf_wrong\n" and "hf_wrong" not in call.command + str(call.display)
    words = shlex.split(call.command)  # a short-lived container of the engine's image
    assert words[:4] == ["docker", "run", "--rm", "-i"] and "hf_wrong" not in words
    assert words[words.index(ctx.inventory.container.image) + 1:] == ["sh", "-c", hub_token.WHOAMI]
    assert "download" not in call.command and "secrets" not in call.command


def test_before_the_models_image_is_on_the_head_the_token_waits(
        fake_cluster: Callable[..., FakeCluster]) -> None:
    from orchestrator.phases.model_tools import NO_IMAGE

    facts = missing_facts()
    facts["spark-a"]["commands"]["models"] = {"rc": 0, "out": NO_IMAGE + "\n", "err": ""}
    cluster = fake_cluster(facts=facts)
    ctx = cluster.context("spark-a", options=options(hf_token=Secret("hf_x")))
    outcome = hub_token.HubToken(RECIPE, model_args(RECIPE)[1]).check(ctx)  # a dry run: nothing pulled yet
    assert isinstance(outcome, Unchanged) and "is not on spark-a" in outcome.reason
    assert not cluster["spark-a"].calls


def test_an_accepted_token_and_an_unreachable_hub(fake_cluster: Callable[..., FakeCluster]) -> None:
    cluster = fake_cluster(facts=missing_facts())
    cluster["spark-a"].on("whoami", stdout="hub=https://huggingface.co\nuser: someone\n")
    ctx = cluster.context("spark-a", options=options(hf_token=Secret("hf_ok")))
    outcome = hub_token.HubToken(RECIPE, model_args(RECIPE)[1]).check(ctx)
    assert isinstance(outcome, Unchanged)
    assert outcome.reason == "HF token accepted by https://huggingface.co (user: someone)"

    cluster = fake_cluster(facts=missing_facts())
    cluster["spark-a"].on("whoami", status=1, stdout="hub=https://huggingface.co\n"
                          "requests.exceptions.ConnectionError: Max retries exceeded")
    outcome = hub_token.HubToken(RECIPE, model_args(RECIPE)[1]).check(cluster.context(
        "spark-a", options=options(hf_token=Secret("hf_ok"))))
    assert isinstance(outcome, Unchanged) and "cannot be reached from spark-a" in outcome.reason


def test_no_token_for_a_gated_repo_is_bad_input(fake_cluster: Callable[..., FakeCluster]) -> None:
    cluster = fake_cluster(facts=missing_facts())
    head = cluster["spark-a"]
    head.on("--dry-run", status=1, stderr=GATED)
    ctx = cluster.context("spark-a", options=options())
    with pytest.raises(InputError, match=rf"{MODEL} is gated on the hub and no HF token was given"):
        hub_token.HubToken(RECIPE, model_args(RECIPE)[1]).check(ctx)
    assert ctx.options.token_missing is True
    (call,) = head.calls  # the draft is present: only the missing repo is asked about
    assert "--dry-run" in call.command and "HF_TOKEN_PATH" not in call.command


def test_no_token_for_a_public_repo_is_fine(fake_cluster: Callable[..., FakeCluster]) -> None:
    cluster = fake_cluster(facts=missing_facts())
    cluster["spark-a"].on("--dry-run", stdout="[dry-run] Will download 3 files totalling 1.2G.")
    ctx = cluster.context("spark-a", options=options())
    outcome = hub_token.HubToken(RECIPE, model_args(RECIPE)[1]).check(ctx)
    assert isinstance(outcome, Unchanged) and "need none" in outcome.reason
    assert not ctx.options.token_missing


def test_the_lab_whoami(monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
                        capsys: pytest.CaptureFixture[str]) -> None:
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parents[2] / "lab" / "sparklab" / "image"))
    from sparklab_engine import hf_cli

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "none"))
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert hf_cli.main(["auth", "whoami"]) == 1
    assert "Not logged in" in capsys.readouterr().out
    monkeypatch.setenv("HF_TOKEN", "wrong")
    assert hf_cli.main(["auth", "whoami"]) == 1
    assert "Invalid user token" in capsys.readouterr().err
    monkeypatch.setenv("HF_TOKEN", "hf_lab")
    assert hf_cli.main(["auth", "whoami"]) == 0
    assert capsys.readouterr().out.strip() == f"user: {hf_cli.LAB_USER}"
