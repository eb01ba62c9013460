"""The lab's container runtime (dockerd-shim) and simulated engine on a real 2-node lab.

Real OpenSSH to the nodes as user nvidia, `docker` through sudo, real `mpirun` between the two
containers (their own sshd on port 2233), then the playbook's trtllm-serve at TP=2.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
LAB_ID = os.environ.get("SPARKLAB_ID", "6")
IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12"
MODEL = "nvidia/Qwen3-235B-A22B-FP4"
ENTRY = """#!/bin/bash
mkdir -p /root/.ssh /run/sshd
cp /tmp/.ssh/id_ed25519 /tmp/.ssh/authorized_keys /tmp/.ssh/config /root/.ssh/
chmod 700 /root/.ssh && chmod 600 /root/.ssh/*
exec /usr/sbin/sshd -D -e -f /tmp/.ssh/sshd_config
"""
SSHD_CONFIG = ("Port 2233\nHostKey /etc/ssh/ssh_host_ed25519_key\nUsePAM no\n"
               "PasswordAuthentication no\nPermitRootLogin prohibit-password\n"
               "AuthorizedKeysFile .ssh/authorized_keys\nPidFile /run/sshd-container.pid\n")
SSH_CONFIG = ("Host *\n  Port 2233\n  IdentityFile /root/.ssh/id_ed25519\n"
              "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
RUN = ("docker run -d --rm --name trtllm-multinode --gpus '\"device=all\"' --network host "
       "--ulimit memlock=-1 --ulimit stack=67108864 --device /dev/infiniband:/dev/infiniband "
       "-e NCCL_SOCKET_IFNAME=enp1s0f1np1 -e OMPI_MCA_btl_tcp_if_include=enp1s0f1np1 "
       "-e OMPI_MCA_oob_tcp_if_include=enp1s0f1np1 "
       "-e OMPI_MCA_orte_default_hostfile=/etc/openmpi-hostfile -e OMPI_MCA_rmaps_ppr_n_pernode=1 "
       "-e OMPI_ALLOW_RUN_AS_ROOT=1 "
       "-e OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 --label sparkctl.test=e2e "
       "-v $HOME/.cache/huggingface/:/root/.cache/huggingface/ "
       f"-v $HOME/e2e-ssh:/tmp/.ssh:ro {IMAGE} /tmp/.ssh/entry.sh")


def lab_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparklab.cli", *args], cwd=ROOT,
                          env={**os.environ, "SPARKLAB_ID": LAB_ID}, capture_output=True,
                          text=True, timeout=120)


class Node:
    def __init__(self, inventory: dict, index: int) -> None:
        self.cluster = inventory["cluster"]
        node = inventory["nodes"][index]
        self.name, self.host = node["name"], node["host"]
        self.fabric_ip = node["addresses"]["enp1s0f1np1"].split("/")[0]
        self.addresses = node["addresses"]

    def sh(self, command: str, user: str = "nvidia", stdin: str | None = None,
           check: bool = True) -> subprocess.CompletedProcess:
        res = subprocess.run(
            ["ssh", "-q", "-i", self.cluster["ssh_key"], "-o", "BatchMode=yes",
             "-o", f"UserKnownHostsFile={self.cluster['known_hosts']}",
             f"{user}@{self.host}", command], input=stdin, capture_output=True, text=True,
            timeout=120)
        if check:
            assert res.returncode == 0, f"{command}\n{res.stdout}\n{res.stderr}"
        return res


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Node]]:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    up = lab_cli("up", "--force", "--engine-load-seconds", "1", "--model-bytes", "100000")
    assert up.returncode == 0, up.stderr
    try:
        inventory = yaml.safe_load(Path(up.stdout.strip().splitlines()[-1]).read_text())
        pair = [Node(inventory, 0), Node(inventory, 1)]
        keys = tmp_path_factory.mktemp("keys")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sparklab-e2e",
                        "-f", str(keys / "id_ed25519")], check=True)
        files = {"id_ed25519": (keys / "id_ed25519").read_text(),
                 "authorized_keys": (keys / "id_ed25519.pub").read_text(),
                 "config": SSH_CONFIG, "sshd_config": SSHD_CONFIG, "entry.sh": ENTRY}
        hostfile = "".join(f"{n.fabric_ip}\n" for n in pair)
        for node in pair:
            set_fabric_addresses(node)
            for name, text in files.items():
                node.sh(f"mkdir -p ~/e2e-ssh && cat > ~/e2e-ssh/{name}", stdin=text)
            node.sh("chmod 600 ~/e2e-ssh/id_ed25519 && chmod 755 ~/e2e-ssh/entry.sh && "
                    "mkdir -p ~/.cache/huggingface && cat > ~/hostfile", stdin=hostfile)
        yield pair
    finally:
        assert lab_cli("down").returncode == 0


def set_fabric_addresses(node: Node) -> None:
    # What sparkctl's netplan step would do.
    for ifname, cidr in node.addresses.items():
        node.sh(f"ip addr replace {cidr} dev {ifname}", user="root")


def test_docker_errors_and_bookkeeping(nodes: list[Node]) -> None:
    a = nodes[0]
    res = a.sh("docker inspect nope", check=False)
    assert res.returncode == 1 and "No such object: nope" in res.stderr
    res = a.sh("docker run -d --name x nvcr.io/nvidia/tensorrt-llm/release:0.0.0 true",
               check=False)
    assert res.returncode == 125 and "Unable to find image" in res.stderr
    assert "manifest unknown" in res.stderr
    a.sh(f"docker run -d --name t --label k=v -e FOO=bar {IMAGE} sleep infinity")
    res = a.sh(f"docker run -d --name t {IMAGE} true", check=False)
    assert res.returncode == 125 and 'The container name "/t" is already in use' in res.stderr
    info = json.loads(a.sh("docker inspect t").stdout)[0]
    assert info["Name"] == "/t" and info["State"]["Running"] is True
    assert "FOO=bar" in info["Config"]["Env"] and info["Config"]["Labels"] == {"k": "v"}
    assert a.sh("docker ps --filter label=k=v --format '{{.Names}}'").stdout.split() == ["t"]
    assert a.sh("docker exec t sh -c 'exit 7'", check=False).returncode == 7
    assert a.sh("echo piped | docker exec -i t cat").stdout == "piped\n"
    tools = "for t in hf trtllm-serve trtllm-llmapi-launch; do command -v $t; done"
    assert a.sh(f"docker exec t sh -c '{tools}'").stdout.split() == [
        "/usr/local/bin/hf", "/usr/local/bin/trtllm-serve", "/usr/local/bin/trtllm-llmapi-launch"]
    assert a.sh("command -v hf", check=False).returncode != 0  # not on the node itself
    a.sh("docker exec t touch /etc/only-in-container")
    assert a.sh("test -e /etc/only-in-container", check=False).returncode == 1
    digest = a.sh(f"docker image inspect -f '{{{{index .RepoDigests 0}}}}' {IMAGE}").stdout
    assert digest.startswith(IMAGE.rsplit(":", 1)[0] + "@sha256:")
    a.sh("docker stop -t 1 t")
    assert a.sh("docker inspect -f '{{.State.Status}} {{.State.ExitCode}}' t").stdout.split() \
        == ["exited", "137"]
    a.sh("docker rm t")
    res = a.sh(f"docker run --rm {IMAGE} sh -c 'echo out; echo err >&2; exit 5'", check=False)
    assert (res.returncode, res.stdout) == (5, "out\n") and "err" in res.stderr
    a.sh(f"docker run -d --name l {IMAGE} sh -c 'echo one; echo two'")
    assert a.sh("docker logs -f --tail 1 l").stdout == "two\n"
    assert a.sh("docker inspect -f '{{.State.ExitCode}}' l").stdout.strip() == "0"
    a.sh("docker rm l")
    assert a.sh("docker ps -aq").stdout == ""


def test_playbook_flow_with_mpirun_and_tp2(nodes: list[Node]) -> None:
    a, b = nodes
    for node in nodes:
        node.sh(RUN)
        node.sh("docker cp ~/hostfile trtllm-multinode:/etc/openmpi-hostfile")
    hosts = a.sh("docker exec trtllm-multinode mpirun -np 2 hostname").stdout.split()
    assert sorted(hosts) == [a.name, b.name]
    a.sh("HF_TOKEN=hf_e2e_secret docker exec -e HF_TOKEN trtllm-multinode "
         f"mpirun -x HF_TOKEN -np 2 hf download {MODEL}")
    for node in nodes:
        log = node.sh("cat /var/lib/sparklab/outbox/hf-downloads.log").stdout
        assert [json.loads(line)["host"] for line in log.splitlines()] == [node.name]
        env = node.sh("docker inspect -f '{{json .Config.Env}}' trtllm-multinode").stdout
        assert "hf_e2e_secret" not in env
    serve = (f"mpirun -x NCCL_SOCKET_IFNAME -np 2 trtllm-llmapi-launch trtllm-serve {MODEL} "
             "--backend pytorch --tp_size 2 --port 8355 --host 0.0.0.0 > /tmp/serve.log 2>&1")
    a.sh(f"docker exec -d trtllm-multinode bash -c {shlex.quote(serve)}")
    wait_health(a, 200)
    reply = json.loads(a.sh(
        "curl -s localhost:8355/v1/chat/completions -H 'Content-Type: application/json' -d "
        "'{\"messages\":[{\"role\":\"user\",\"content\":\"Paris is great because\"}],"
        "\"max_tokens\":8}'").stdout)
    assert reply["usage"]["completion_tokens"] == 8
    log = a.sh("docker exec trtllm-multinode cat /tmp/serve.log").stdout
    assert f"NET/Socket : Using [0]enp1s0f1np1:{a.fabric_ip}<0>" in log
    assert f"Connected rank 1 ({b.name}) via enp1s0f1np1:{b.fabric_ip}<0>" in log
    assert lab_cli("fault", "rank-die", "--node", b.name).returncode == 0
    wait_health(a, 503)
    for node in nodes:
        node.sh("docker stop trtllm-multinode")
        assert node.sh("docker ps -aq").stdout == ""  # --rm
    assert a.sh("curl -s -o /dev/null localhost:8355/health", check=False).returncode != 0


def wait_health(node: Node, want: int) -> None:
    deadline = time.monotonic() + 90
    while True:
        code = node.sh("curl -s -o /dev/null -w '%{http_code}' localhost:8355/health",
                       check=False).stdout
        if code == str(want):
            return
        assert time.monotonic() < deadline, f"/health stayed {code}, wanted {want}"
        time.sleep(0.5)
