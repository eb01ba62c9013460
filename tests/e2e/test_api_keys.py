"""API keys on the simulated lab (`launch --host ADDR --api-key-file FILE`): the REAL llama-server
(lab-tiny-llama, on the first node) and the simulated SGLang (qwen3-8b, on the second), each
bound to its node's fabric address with a sentinel key. One `up` for the module. Without the
key (or with a wrong one) the API answers 401 and /health stays open, as each engine does;
`chat`, `status` and launch's own readiness and smoke test pass with it; the key is in no
`docker inspect`, no process's argv on the nodes, no sparkctl output, --json report or log;
the node's copy is 0600 root; `launch --host` beyond loopback without a key exits 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Lab, Sparkctl, e2e_state, fresh_up

from orchestrator.inventory_checks import load_inventory

pytestmark = pytest.mark.lab

STATE = e2e_state("api_keys")
OUTPUTS: list[str] = []  # every sparkctl output of the module, for the sentinel test
SEEN: dict[str, str] = {}  # docker inspect and every argv on the nodes while the later servers ran
# (recipe, server name, node index, port)
SERVERS = [("lab-tiny-llama", "keyed-llama", 0, 8080),
           ("qwen3-8b", "keyed-sglang", 1, 30000)]
# a GET (or POST of a JSON body) from a node, the key on stdin: prints the HTTP status
GET = ("import sys, urllib.error, urllib.request\n"
       "key = sys.stdin.read().strip()  # on stdin: the test puts no key on a command line\n"
       "h = {'Authorization': 'Bearer ' + key} if key else {}\n"
       "data = sys.argv[2].encode() if len(sys.argv) > 2 else None\n"
       "h['Content-Type'] = 'application/json'\n"
       "try:\n"
       "    print(urllib.request.urlopen(urllib.request.Request(sys.argv[1], data, h), "
       "timeout=120).status)\n"
       "except urllib.error.HTTPError as e:\n"
       "    print(e.code)\n"
       "except OSError:\n"
       "    print(0)\n")


# the lab's hub takes any token; TensorRT-LLM's and vLLM's recipes name gated models
sparkctl = Sparkctl("api_keys", token="hf_e2eApiKeysLabToken0", outputs=OUTPUTS)


def inv(lab: Lab) -> list[str]:
    return ["--inventory", str(lab.inventory)]


Served = tuple[Lab, str, dict[str, str], Path]


@pytest.fixture(scope="module")
def served(lab_session: list[Lab], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    # an earlier module may have left a server
    lab = fresh_up(lab_session, sparkctl)
    secret = f"sk-e2e-keysentinel-{os.getpid()}-{time.time_ns()}"
    key = tmp_path_factory.mktemp("api-keys") / "key"
    key.write_text(secret + "\n")
    key.chmod(0o600)
    inventory = load_inventory(lab.inventory)
    addresses = {}
    for recipe, name, index, _ in SERVERS:
        node = lab.nodes[index]
        addresses[name] = inventory.mpi_address(inventory.node(node))
        launch = sparkctl("launch", recipe, *inv(lab), "--nodes", node, "--name", name,
                          "--host", addresses[name], "--api-key-file", str(key), "--yes",
                          "--json", "--timeout", "240")
        assert launch.returncode == 0, launch.stdout + launch.stderr
        assert json.loads(launch.stdout)["endpoint"] == f"http://{addresses[name]}:{SERVERS[index][3]}"
    yield lab, secret, addresses, key
    sparkctl("down", *inv(lab), "--yes")


def get(lab: Lab, node: str, url: str, key: str | None = None, body: str | None = None) -> int:
    command = ["python3", "-c", GET, url, *([body] if body else [])]
    return int(lab.exec(node, command, input_text=key or "").stdout.strip())


def test_launch_beyond_loopback_needs_a_key(served: Served) -> None:
    lab = served[0]
    refused = sparkctl("launch", "lab-tiny-llama", *inv(lab), "--host", "0.0.0.0", "--yes")
    assert refused.returncode == 2 and "--api-key-file" in refused.stderr, refused.stderr


@pytest.mark.parametrize(("name", "open_path"), [("keyed-llama", "/health"),
                                                 ("keyed-sglang", "/health")])
def test_the_api_needs_the_key_and_health_stays_open(served: Served, name: str,
                                                     open_path: str) -> None:
    lab, secret, addresses, _ = served
    _, _, index, port = next(s for s in SERVERS if s[1] == name)
    node, base = lab.nodes[index], f"http://{addresses[name]}:{port}"
    assert get(lab, node, base + "/v1/models") == 401
    assert get(lab, node, base + "/v1/models", "sk-wrong-key-0000") == 401
    assert get(lab, node, base + "/v1/models", secret) == 200
    assert get(lab, node, base + open_path) == 200  # what the engine leaves open
    assert get(lab, node, f"http://127.0.0.1:{port}/health") == 0  # the fabric address only
    chat = sparkctl("chat", "Hello", *inv(lab), "--server", name, "--json")
    assert chat.returncode == 0, chat.stdout + chat.stderr
    assert json.loads(chat.stdout)["reply"].strip()


def test_status_probes_pass_with_the_key(served: Served) -> None:
    lab = served[0]
    status = sparkctl("status", *inv(lab), "--json")
    doc = json.loads(status.stdout)
    states = {s["name"]: s["state"] for s in doc["servers"]}
    assert states == {"keyed-llama": "healthy", "keyed-sglang": "healthy"}, states
    for server in doc["servers"]:
        assert server.get("api_key_file", "").endswith(f"/servers/{server['name']}/api_key")
        # issue 41: "with API key" only when the server really refuses without it
        assert server.get("keyless") in (401, 403), server
    text = sparkctl("status", *inv(lab)).stdout
    assert text.count(" with API key") == 2 and "NOT enforced" not in text, text
    # a relaunch with the same key changes nothing (the key's file and digest are the same)
    again = sparkctl("launch", "lab-tiny-llama", *inv(lab), "--nodes", lab.nodes[0], "--name",
                     "keyed-llama", "--host", served[2]["keyed-llama"], "--api-key-file",
                     str(served[3]), "--yes", "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads(again.stdout)["changed"] == 0, again.stdout[-3000:]


def test_the_key_is_nowhere_but_its_files(served: Served) -> None:
    lab, secret = served[0], served[1]
    for _, name, index, _ in SERVERS:
        node = lab.nodes[index]
        path = f"/var/lib/sparkctl/run/servers/{name}/api_key"
        assert lab.exec(node, f"stat -c '%a %U' {path}").stdout.split() == ["600", "root"]
        inspect = lab.exec(node, "docker inspect $(docker ps -aq)").stdout
        assert secret not in inspect and path in inspect  # the file is mounted, never the key
        argv = lab.exec(node, "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '",
                        check=False).stdout
        assert secret not in argv and ("--api-key-file" in argv or "--config" in argv)
        assert "--api-key " not in argv  # the engine's argv flag is never used


def test_the_gateway_sends_a_replicas_key_to_it(served: Served) -> None:
    """A replica on its node's loopback with its own key: the router gets that key from the
    gateway's 0600 config (in its `POST /workers`) and its requests pass; the fabric-bound
    servers are no replicas."""
    lab, secret, _, key = served
    node = lab.nodes[1]
    launch = sparkctl("launch", "qwen3-8b", *inv(lab), "--nodes", node, "--name", "keyed-loop",
                      "--port", "30001", "--api-key-file", str(key), "--yes", "--timeout", "240")
    assert launch.returncode == 0, launch.stdout + launch.stderr
    assert get(lab, node, "http://127.0.0.1:30001/v1/models") == 401
    up = sparkctl("gateway", "up", *inv(lab), "--host", "0.0.0.0", "--api-key-file", str(key),
                  "--json", timeout=400)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        doc = json.loads(up.stdout)
        assert [r["server"] for r in doc["replicas"]] == ["keyed-loop"], doc["replicas"]
        body = json.dumps({"model": "Qwen/Qwen3-8B", "max_tokens": 8,
                           "messages": [{"role": "user", "content": "Hello"}]})
        gateway = "http://127.0.0.1:4000/v1/chat/completions"
        assert get(lab, lab.nodes[0], gateway, secret, body) == 200
    finally:
        sparkctl("gateway", "down", *inv(lab))
        sparkctl("down", *inv(lab), "--server", "keyed-loop", "--yes")


BIG = [("qwen3-235b", 8355, "/health", "TensorRT-LLM behind the relay"),
              ("minimax-m2.7", 8000, "/version", "vLLM's VLLM_API_KEY")]


def stop_all_but(lab: Lab, keep: str) -> None:
    """Every other server stopped by name: a two-node model does not fit beside them."""
    listed = json.loads(sparkctl("status", *inv(lab), "--json").stdout)["servers"]
    for server in listed:
        if server["name"] != keep:
            down = sparkctl("down", *inv(lab), "--server", server["name"], "--yes")
            assert down.returncode == 0, down.stdout + down.stderr


@pytest.mark.parametrize(("recipe", "port", "open_path", "how"), BIG)
def test_tensorrt_llm_and_vllm_take_the_key_too(served: Served, recipe: str, port: int,
                                                open_path: str, how: str) -> None:
    """TensorRT-LLM (no key of its own: sparkctl's relay in front) and vLLM (its variable, set
    by the start wrapper), each alone on both nodes, on the head's fabric address."""
    lab, secret, _, key = served
    head = lab.nodes[0]
    stop_all_but(lab, recipe)
    inventory = load_inventory(lab.inventory)
    address = inventory.mpi_address(inventory.node(head))
    launch = sparkctl("launch", recipe, *inv(lab), "--host", address, "--api-key-file", str(key),
                      "--replace", "--yes", "--json", "--timeout", "300")
    assert launch.returncode == 0, launch.stdout + launch.stderr
    base = f"http://{address}:{port}"
    assert get(lab, head, base + "/v1/models") == 401, how
    assert get(lab, head, base + "/v1/models", "sk-wrong-key-0000") == 401
    assert get(lab, head, base + "/v1/models", secret) == 200
    assert get(lab, head, base + open_path) == 200
    chat = sparkctl("chat", "Hello", *inv(lab), "--server", recipe, "--json")
    assert chat.returncode == 0, chat.stdout + chat.stderr
    status = json.loads(sparkctl("status", *inv(lab), "--json").stdout)
    states = {s["name"]: s["state"] for s in status["servers"]}
    assert states.get(recipe) == "healthy", status["servers"]
    SEEN.update({node: lab.exec(node, "docker inspect $(docker ps -aq); cat /proc/[0-9]*/cmdline "
                                "2>/dev/null | tr '\\0' ' '", check=False).stdout
                 for node in lab.nodes})


def test_no_output_log_or_report_holds_the_key(served: Served) -> None:
    """Last: every sparkctl output and --json report of the module, the controller's logs, and
    what the nodes showed while TensorRT-LLM and vLLM ran."""
    secret = served[1]
    assert SEEN and not [node for node, text in SEEN.items() if secret in text]
    logs = subprocess.run(["grep", "-rl", secret, STATE], capture_output=True, text=True)
    assert logs.stdout == "", logs.stdout
    assert OUTPUTS and not [out for out in OUTPUTS if secret in out]
