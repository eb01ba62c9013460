"""SSH the way Spark owners already have it (issue #17), against real OpenSSH in the lab.

One module-scoped lab with a jump host (`lab up --jump-host`): the Sparks are reachable only
through the jump node's sshd. The user's setup is real OpenSSH: a HOME whose ~/.ssh/config
has aliases (spark-a, spark-b with ProxyJump jumpbox), a hashed ~/.ssh/known_hosts, and an
ssh-agent (`ssh-agent -a SOCK`) holding a key that exists nowhere on disk. The inventory names
no key, no user, no port, no jump: `host: spark-a`, as `ssh spark-a`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import REPO, lab_cli, require_lab_host, run_in_terminal

pytestmark = pytest.mark.lab

# its own lab (the jump-host variant), never the session's shared lab
LAB_ID = int(os.environ.get("SPARKLAB_JUMP_ID", "6"))
STATE = Path(f"/var/lib/sparklab/{LAB_ID}")
SPARKCTL = str(Path(sys.executable).parent / "sparkctl")
SENTINEL = "hf_SENTINELsshConfigToken"
JUMP = f"10.213.{LAB_ID}.10"
SUDO_A, SUDO_B = "sudo-pw-of-a-5521", "sudo-pw-of-b-9034"


@dataclass
class Setup:
    home: Path
    agent_sock: Path
    inventory: Path
    data: dict[str, object]
    env: dict[str, str]


def _node_input(node: str, command: str, text: str) -> None:
    """Run `command` in a node with `text` on stdin (secrets never go on a command line)."""
    from sparklab.node import node_exec

    node_exec(LAB_ID, node, ["sh", "-c", command], input_text=text)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    require_lab_host()
    lab_cli("up", "--force", "--jump-host", lab_id=LAB_ID, check=True)
    tmp = tmp_path_factory.mktemp("ssh-config")
    home = tmp / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    sock = tmp / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519

        key = ed25519.Ed25519PrivateKey.generate()
        key_file = tmp / "agent_only_key"
        key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.OpenSSH,
                                               serialization.NoEncryption()))
        key_file.chmod(0o600)
        subprocess.run(["ssh-add", "-q", str(key_file)], env={**os.environ, "SSH_AUTH_SOCK": str(sock)},
                       check=True, capture_output=True)
        key_file.unlink()  # agent-only from here on
        pubkey = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                               serialization.PublicFormat.OpenSSH).decode()
        for node in ("spark-a", "spark-b", "jump"):
            _node_input(node, "cat >> /home/nvidia/.ssh/authorized_keys", pubkey + " agent-only\n")
        lab = yaml.safe_load((STATE / "inventory.yml").read_text())
        hosts = {n["name"]: n["host"] for n in lab["nodes"]}
        known = home / ".ssh" / "known_hosts"
        known.write_text((STATE / "ssh" / "known_hosts").read_text())
        subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(known)], check=True, capture_output=True)
        Path(str(known) + ".old").unlink()
        (home / ".ssh" / "config").write_text(
            f"Host jumpbox\n    HostName {JUMP}\n    User nvidia\n"
            "Host spark-*\n    User nvidia\n    ProxyJump jumpbox\n"
            f"Host spark-a\n    HostName {hosts['spark-a']}\n"
            f"Host spark-b\n    HostName {hosts['spark-b']}\n"
            f"Host *\n    UserKnownHostsFile {known}\n    BatchMode yes\n")
        cluster = {"name": lab["cluster"]["name"], "management_interface": "eth0",
                   "known_hosts": str(tmp / "pinned_known_hosts")}
        data = {**lab, "cluster": cluster,
                "nodes": [{**n, "host": n["name"]} for n in lab["nodes"]]}
        inventory = tmp / "inventory.yml"
        inventory.write_text(yaml.safe_dump(data))
        env = {**os.environ, "HOME": str(home), "SSH_AUTH_SOCK": str(sock), "HF_TOKEN": SENTINEL,
               "SPARKCTL_STATE_DIR": str(tmp / "state"), "SPARKLAB_ID": str(LAB_ID)}
        yield Setup(home, sock, inventory, data, env)
    finally:
        os.kill(agent.pid, signal.SIGTERM)
        agent.wait(10)
        lab_cli("down", lab_id=LAB_ID)


def sparkctl(s: Setup, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SPARKCTL, *args], capture_output=True, text=True, timeout=timeout,
                          env=s.env, cwd=REPO, stdin=subprocess.DEVNULL)


def test_ssh_spark_a_works_and_sparkctl_resolves_it_the_same_way(setup: Setup) -> None:
    ssh = subprocess.run(["ssh", "-F", str(setup.home / ".ssh" / "config"), "spark-a", "hostname"],
                         env=setup.env, capture_output=True, text=True, timeout=60)
    assert ssh.returncode == 0 and ssh.stdout.strip() == "spark-a", ssh.stderr
    spark_a = yaml.safe_load((STATE / "inventory.yml").read_text())["nodes"][0]["host"]
    direct = subprocess.run(["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
                             f"nvidia@{spark_a}", "true"],
                            env=setup.env, capture_output=True, text=True, timeout=60)
    assert direct.returncode != 0, "the Sparks must be reachable only through the jump host"
    doctor = sparkctl(setup, "doctor", "ssh", "--inventory", str(setup.inventory), "--json")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    node = json.loads(doctor.stdout)["nodes"]["spark-a"]
    res = node["resolution"]
    assert res["jumps"] == [f"nvidia@{JUMP}:22"] and res["keys"] == [] and res["agent"] == "1 key(s)"
    assert res["sources"]["hostname"] == "ssh_config" and res["user"] == "nvidia"
    steps = {s["step"]: s for s in node["steps"]}
    assert steps["auth"]["status"] == "ok" and "agent key" in steps["auth"]["detail"]
    assert "known_hosts" in steps["host key"]["detail"] and steps["sudo"]["detail"] == "passwordless"


def test_up_launch_status_logs_chat_down_through_the_jump_with_the_agent(setup: Setup) -> None:
    inv = str(setup.inventory)
    up = sparkctl(setup, "up", "--inventory", inv, "--yes", "--json", timeout=600)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    launch = sparkctl(setup, "launch", "qwen3-235b", "--inventory", inv, "--yes", "--json",
                      "--timeout", "120", timeout=600)
    assert launch.returncode == 0, launch.stdout[-3000:] + launch.stderr[-3000:]
    status = sparkctl(setup, "status", "--inventory", inv, "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    assert json.loads(status.stdout)["servers"], status.stdout
    logs = sparkctl(setup, "logs", "--inventory", inv, "--tail", "5")
    assert logs.returncode == 0 and "spark-a" in logs.stdout, logs.stderr
    chat = sparkctl(setup, "chat", "Paris is great because", "--inventory", inv,
                    "--max-tokens", "8", "--json")
    assert chat.returncode == 0 and json.loads(chat.stdout)["reply"], chat.stderr
    down = sparkctl(setup, "down", "--inventory", inv, "--yes", "--json")
    assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-3000:]
    pinned = Path(setup.data["cluster"]["known_hosts"])  # type: ignore[index]
    assert not pinned.exists(), "nothing pinned: the user's hashed known_hosts knew every hop"


def test_a_wrong_host_key_on_the_jump_host_is_refused(setup: Setup, tmp_path: Path) -> None:
    lines = (STATE / "ssh" / "known_hosts").read_text().splitlines()
    spark_key = lines[0].split(" ", 1)[1]
    forged = [line for line in lines if not line.startswith(JUMP + " ")] + [f"{JUMP} {spark_key}"]
    (tmp_path / "known_hosts").write_text("\n".join(forged) + "\n")
    config = (setup.home / ".ssh" / "config").read_text().replace(
        str(setup.home / ".ssh" / "known_hosts"), str(tmp_path / "known_hosts"))
    (tmp_path / "ssh_config").write_text(config)
    data = {**setup.data, "cluster": {**setup.data["cluster"],  # type: ignore[dict-item]
                                      "ssh_config": str(tmp_path / "ssh_config")}}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data))
    result = sparkctl(setup, "up", "--inventory", str(inventory), "--dry-run", "--json",
                      "--trust-new-hosts")
    assert result.returncode == 1, result.stdout + result.stderr
    for node in ("spark-a", "spark-b"):
        error = json.loads(result.stdout)["hosts"][node]["error"]
        assert f"HOST KEY CHANGED for the jump host nvidia@{JUMP}:22" in error and "SHA256:" in error, error
    assert not Path(setup.data["cluster"]["known_hosts"]).exists()  # type: ignore[index]


def test_different_sudo_passwords_per_host(setup: Setup, tmp_path: Path) -> None:
    for node, password in (("spark-a", SUDO_A), ("spark-b", SUDO_B)):
        _node_input(node, "chpasswd", f"nvidia:{password}\n")
        _node_input(node, "sed -i 's/NOPASSWD: ALL$/ALL/' /etc/sudoers.d/sparklab", "")
    try:
        # a terminal: asked once, tried on both, asked again for spark-b only
        code, output = run_in_terminal(
            [SPARKCTL, "up", "--inventory", str(setup.inventory), "--dry-run"], setup.env,
            [(b"sudo password for nvidia on spark-b", SUDO_B),
             (b"sudo password for nvidia on the nodes", SUDO_A)], timeout=240)
        assert code == 0, output
        assert output.count("sudo password for nvidia on the nodes") == 1, output
        assert output.count("sudo password for nvidia on spark-b") == 1, output
        assert "sudo password for nvidia on spark-a" not in output
        assert SUDO_A not in output and SUDO_B not in output
        # per-host files, mode-checked
        files = {}
        for node, password in (("spark-a", SUDO_A), ("spark-b", SUDO_B)):
            files[node] = tmp_path / f"{node}.sudo"
            files[node].write_text(password + "\n")
            files[node].chmod(0o600)
        data = {**setup.data, "nodes": [{**n, "sudo_password_file": str(files[n["name"]])}
                                        for n in setup.data["nodes"]]}  # type: ignore[attr-defined]
        inventory = tmp_path / "inventory.yml"
        inventory.write_text(yaml.safe_dump(data))
        ok = sparkctl(setup, "up", "--inventory", str(inventory), "--dry-run", "--json")
        assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr
        files["spark-b"].chmod(0o644)
        refused = sparkctl(setup, "up", "--inventory", str(inventory), "--dry-run", "--json")
        assert refused.returncode == 2 and f"{files['spark-b']} is readable by group or others" \
            in refused.stderr, refused.stderr
        for text in (ok.stdout, ok.stderr, refused.stdout, refused.stderr):
            assert SUDO_A not in text and SUDO_B not in text
        for log in (Path(setup.env["SPARKCTL_STATE_DIR"]) / "logs").glob("*.log"):
            assert SUDO_A not in log.read_text() and SUDO_B not in log.read_text()
    finally:
        for node in ("spark-a", "spark-b"):
            _node_input(node, "sed -i 's/) ALL$/) NOPASSWD: ALL/' /etc/sudoers.d/sparklab", "")
