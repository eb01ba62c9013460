"""Model fan-out on the lab: an interrupted copy resumes, a corrupted file on a peer is found
and replaced, only the recipe's files move (files in a repository's folders keep the Hugging
Face layout on every node), a full disk fails fast with the numbers.

The lab's model size is raised to 256 MiB on the head for this module (its `lab.json`), so the
copy takes long enough to be interrupted half-way; both nodes' model folders are cleared first.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, SPARKCTL, Lab, healthy_lab

pytestmark = pytest.mark.lab

CONTAINER = "trtllm-multinode"
HF = "/root/.cache/huggingface"
BLOBS = f"{HF}/hub/models--nvidia--Qwen3-235B-A22B-FP4/blobs"
SNAPSHOTS = f"{HF}/hub/models--nvidia--Qwen3-235B-A22B-FP4/snapshots"
LAB_JSON = "/var/lib/sparklab/config/lab.json"
COPIED = re.compile(r"spark-b: ([\d.]+) (GB|MB) in [\d.]+ s \([\d.]+ GB/s\)(?:, ([\d.]+) (GB|MB) "
                    r"already there)?")


def env(tmp: Path) -> dict[str, str]:
    out = {**os.environ, "SPARKCTL_STATE_DIR": str(tmp / "state"), "HF_TOKEN": "hf_fanout_e2e"}
    return out


def launch_argv(lab: Lab, recipe: str = "qwen3-235b") -> list[str]:
    """Every launch of the module is the one server "fanout" (another recipe replaces it):
    servers of other names would stay beside it, and two do not fit a Spark's memory."""
    return [SPARKCTL, "launch", recipe, "--inventory", str(lab.inventory), "--yes", "--json",
            "--timeout", "120", "--name", "fanout", "--replace"]


def in_container(lab: Lab, node: str, command: str, check: bool = True) -> str:
    return lab.exec(node, ["docker", "exec", CONTAINER, "sh", "-c", command], check=check).stdout


def distribute_message(stdout: str) -> str:
    report = json.loads(stdout)
    for host in report["hosts"].values():
        for step in host["steps"]:
            if step["step"] == "distribute":
                return str(step["message"])
    return ""


def mb(value: str, unit: str) -> float:
    return float(value) * (1000 if unit == "GB" else 1)


def sha_of_blobs(lab: Lab, node: str) -> str:
    return in_container(lab, node, f"cd {BLOBS} && sha256sum * | sort")


@pytest.fixture(scope="module")
def fanout_lab(lab_session: list[Lab], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    lab = healthy_lab(lab_session)
    tmp = tmp_path_factory.mktemp("fanout")
    up = subprocess.run([SPARKCTL, "up", "--inventory", str(lab.inventory), "--yes"],
                        capture_output=True, text=True, env=env(tmp), timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    head = lab.nodes[0]
    original = lab.exec(head, f"cat {LAB_JSON}").stdout
    config = json.loads(original)
    lab.exec(head, f"cat > {LAB_JSON}", input_text=json.dumps({**config, "model_bytes": 256 << 20}))
    for node in lab.nodes:
        in_container(lab, node, f"rm -rf {HF}/hub/models--* {HF}/drafts")
    yield lab
    lab.exec(head, f"cat > {LAB_JSON}", input_text=original)
    for node in lab.nodes:
        in_container(lab, node, f"rm -rf {HF}/hub/models--* {HF}/drafts", check=False)


def test_an_interrupted_copy_resumes_with_only_the_rest(fanout_lab: Lab, tmp_path: Path) -> None:
    lab, peer = fanout_lab, fanout_lab.nodes[1]
    # the head's fabric frames delayed 100 ms: each stream's window then moves ~40 MB/s, so the
    # copy takes seconds and the poll below catches it part-way (on an idle lab it takes < 1 s;
    # a copy goes on for a moment after Ctrl-C, until the sender's next progress line)
    delayed = lab.cli("fault", "delay", "--node", lab.nodes[0], "--interface", "enp1s0f1np1",
                      "--ms", "100")
    assert delayed.returncode == 0, delayed.stderr
    try:
        proc = subprocess.Popen(launch_argv(lab), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env(tmp_path))
        # interrupted once the peer holds more than 4 streams x a 32 MiB chunk: at least one
        # chunk is then complete and verified, so the next launch has something to keep
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            held = in_container(lab, peer, f"du -smc {HF}/hub {HF}/drafts 2>/dev/null | tail -n1",
                                check=False).split()
            if held and int(held[0]) > 4 * 32 + 1:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the launch ended before its copy could be interrupted"
        proc.send_signal(signal.SIGINT)  # our own child, by its handle
        _, err = proc.communicate(timeout=120)
    finally:
        lab.cli("fault", "restore", "--node", lab.nodes[0])
    assert proc.returncode != 0, err[-2000:]
    assert "interrupted during models/distribute" in err, err[-2000:]
    time.sleep(1)  # the receiver notices the closed connections and exits
    again = subprocess.run(launch_argv(lab), capture_output=True, text=True, env=env(tmp_path),
                           timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    found = COPIED.search(distribute_message(again.stdout))
    assert found and found.group(3), distribute_message(again.stdout)
    copied, had = mb(found.group(1), found.group(2)), mb(found.group(3), found.group(4))
    assert had > 0 and copied < copied + had  # only the rest was sent
    assert sha_of_blobs(lab, lab.nodes[0]) == sha_of_blobs(lab, peer)
    assert not in_container(lab, peer, f"find {HF} -name '*.sparkctl-part'").strip()


def test_a_corrupted_file_on_a_peer_is_found_and_replaced(fanout_lab: Lab, tmp_path: Path) -> None:
    lab, peer = fanout_lab, fanout_lab.nodes[1]
    first = subprocess.run(launch_argv(lab), capture_output=True, text=True, env=env(tmp_path),
                           timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    big = in_container(lab, peer, f"cd {BLOBS} && ls -S | head -1").strip()
    in_container(lab, peer, f"printf XXXX | dd of={BLOBS}/{big} bs=1 seek=40000000 conv=notrunc "
                            "2>/dev/null")
    assert sha_of_blobs(lab, lab.nodes[0]) != sha_of_blobs(lab, peer)
    again = subprocess.run(launch_argv(lab), capture_output=True, text=True, env=env(tmp_path),
                           timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    found = COPIED.search(distribute_message(again.stdout))
    assert found, distribute_message(again.stdout)
    assert mb(found.group(1), found.group(2)) <= 34  # one 32 MiB chunk, not the model
    assert sha_of_blobs(lab, lab.nodes[0]) == sha_of_blobs(lab, peer)


def test_only_the_recipes_files_reach_the_peer(fanout_lab: Lab, tmp_path: Path) -> None:
    lab, peer = fanout_lab, fanout_lab.nodes[1]
    source = (REPO / "orchestrator/engines/trtllm/recipes/qwen3-235b.yml").read_text()
    recipe = tmp_path / "qwen-filtered.yml"
    recipe.write_text(source.replace("name: qwen3-235b", "name: qwen3-filtered") +
                      '\nfiles: {allow: ["*.safetensors", "*.json"], '
                      'deny: ["generation_config.json"]}\n')
    in_container(lab, peer, f"rm -rf {HF}/hub/models--*")
    result = subprocess.run(launch_argv(lab, str(recipe)), capture_output=True, text=True,
                            env=env(tmp_path), timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    names = in_container(lab, peer, f"ls {SNAPSHOTS}/*/").split()
    assert "config.json" in names and "model.safetensors.index.json" in names
    assert "generation_config.json" not in names and "tokenizer_config.json" in names


def test_files_in_folders_keep_the_hf_layout_and_the_rest_is_never_fetched(
        fanout_lab: Lab, tmp_path: Path) -> None:
    # gpt-oss-120b's repository holds two other formats in folders (original/, metal/): a
    # two-node recipe that wants only original/ gets it on both nodes, links and all, and
    # neither node ever holds metal/ or the root shards
    lab, (head, peer) = fanout_lab, fanout_lab.nodes[:2]
    source = (REPO / "orchestrator/engines/trtllm/recipes/gpt-oss-120b.yml").read_text()
    recipe = tmp_path / "gpt-oss-original.yml"
    recipe.write_text(source.replace("name: gpt-oss-120b", "name: gpt-oss-original")
                      .replace("tp_size: 1", "tp_size: 2").replace("nodes: 1", "nodes: 2")
                      .replace('deny: ["original/*", "metal/*"]', 'allow: ["original/*", "*.json"]'))
    result = subprocess.run(launch_argv(lab, str(recipe)), capture_output=True, text=True,
                            env=env(tmp_path), timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    snapshots = f"{HF}/hub/models--openai--gpt-oss-120b/snapshots"
    listing = {node: in_container(lab, node, f"cd {snapshots}/*/ && find . -type l | sort | "
                                             "while read l; do echo $l $(readlink $l) "
                                             "$(test -e $l && echo ok); done")
               for node in (head, peer)}
    assert listing[head] == listing[peer], listing
    lines = listing[peer].splitlines()
    assert any(line.startswith("./original/model.safetensors ../../../blobs/") for line in lines)
    assert all(line.endswith(" ok") for line in lines), lines
    assert not any("metal/" in line or "/model-0" in line for line in lines), lines
    for node in (head, peer):
        blobs = in_container(lab, node, f"du -sb {HF}/hub/models--openai--gpt-oss-120b/blobs")
        assert int(blobs.split()[0]) < 2 * (256 << 20), (node, blobs)  # one format of three


def test_a_full_disk_on_a_peer_fails_fast_with_node_path_and_numbers(fanout_lab: Lab,
                                                                     tmp_path: Path) -> None:
    lab, peer = fanout_lab, fanout_lab.nodes[1]
    hub = f"{HF}/hub"
    # a tiny full filesystem over the peer's HF cache on the node: the copy's receiver runs in
    # a fresh container of the model image, which mounts the node's cache (and what is on it)
    home = lab.exec(peer, "getent passwd nvidia").stdout.split(":")[5]
    node_hub = f"{home}/.cache/huggingface/hub"
    lab.exec(peer, f"mkdir -p {node_hub} && mount -t tmpfs -o size=8m sparklab-full {node_hub} && "
                   f"dd if=/dev/zero of={node_hub}/.fill bs=1M 2>/dev/null; true")
    try:
        started = time.monotonic()
        result = subprocess.run(launch_argv(lab), capture_output=True, text=True,
                                env=env(tmp_path), timeout=600)
        elapsed = time.monotonic() - started
        assert result.returncode != 0
        text = result.stdout + result.stderr
        assert re.search(rf"{peer}: not enough disk space for the copy: need [\d.]+ [GM]B at "
                         rf"{hub}, [\d.]+ MB free", text), text[-3000:]
        assert elapsed < 300
    finally:
        lab.exec(peer, f"umount {node_hub}", check=False)


def test_a_cable_cut_mid_copy_ends_in_a_clear_error_naming_the_node_and_the_link(
        fanout_lab: Lab, tmp_path: Path) -> None:
    lab, (head, peer) = fanout_lab, fanout_lab.nodes[:2]
    for node in lab.nodes[1:]:
        in_container(lab, node, f"rm -rf {HF}/hub/models--* {HF}/drafts")
    # slowed as above, so the cable is pulled part-way through the copy
    delayed = lab.cli("fault", "delay", "--node", head, "--interface", "enp1s0f1np1", "--ms", "100")
    assert delayed.returncode == 0, delayed.stderr
    try:
        proc = subprocess.Popen(launch_argv(lab), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env(tmp_path))
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            held = in_container(lab, peer, f"du -smc {HF}/hub 2>/dev/null | tail -n1",
                                check=False).split()
            if held and int(held[0]) > 8:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the launch ended before its copy could be cut"
        cut = lab.cli("fault", "cut-cable", "--node", head, "--interface", "enp1s0f1np1")
        assert cut.returncode == 0, cut.stderr
        out, err = proc.communicate(timeout=400)
        # launched again with the cable still out: the peer's fabric address is gone with its
        # carrier, so the receiver cannot listen (EADDRNOTAVAIL: a traceback before)
        again = subprocess.run(launch_argv(lab), capture_output=True, text=True,
                               env=env(tmp_path), timeout=400)
    finally:
        lab.cli("fault", "restore", "--node", head)
    link = (rf"^{peer}: the model copy over the fabric link {head} enp1s0f1np1 -> {peer} "
            rf"enp1s0f1np1 \(192\.168\.\d+\.\d+\) stopped: ")
    hint = "Is the cable in and the link up? `sparkctl status` shows each link"
    for run, cause in (((proc.returncode, out, err), r"the (receiver on|sender on) "),
                       ((again.returncode, again.stdout, again.stderr),
                        r"the receiver cannot listen on 192\.168\.\d+\.\d+: Cannot assign "
                        r"requested address")):
        code, stdout, stderr = run
        assert code != 0 and "Traceback" not in stdout + stderr, (stdout + stderr)[-4000:]
        assert "Errno" not in stdout + stderr, (stdout + stderr)[-4000:]
        message = distribute_message(stdout)
        assert re.search(link + cause, message) and hint in message, message
