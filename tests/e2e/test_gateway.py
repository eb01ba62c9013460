"""The gateway on the simulated lab: the REAL SGLang Model Gateway (PyPI sglang-router, its
pinned wheel unpacked by `gateway up`) in front of one SGLang replica per node. Bad input
refused before any change; `gateway up --host 0.0.0.0 --api-key-file K` serving /v1/models and
chat completions from the controller with the key (completions 401 without); a second `up`
changing nothing; requests at concurrency 4 through
a `launch --rolling` with a changed config (none fails, both replicas replaced); a replica's
container killed (requests still succeed 10 s later); the key in no argv, log, JSON output or
`docker inspect`; `gateway down` removing it all.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, Lab, Sparkctl, e2e_state, healthy_lab

pytestmark = pytest.mark.lab

RECIPE = REPO / "orchestrator" / "engines" / "sglang" / "recipes" / "qwen3-8b.yml"
MODEL = "Qwen/Qwen3-8B"
OUTPUTS: list[str] = []  # every sparkctl output of the module, for the sentinel test


sparkctl = Sparkctl("gateway", outputs=OUTPUTS)


def inv(lab: Lab) -> list[str]:
    return ["--inventory", str(lab.inventory)]


def key_file(tmp: Path, name: str, content: str, mode: int = 0o600) -> Path:
    path = tmp / name
    path.write_text(content)
    path.chmod(mode)
    return path


@pytest.fixture(scope="module")
def served(lab_session: list[Lab], tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[Lab, Path, str]]:
    lab = healthy_lab(lab_session)
    sparkctl("gateway", "down", *inv(lab))
    sparkctl("down", *inv(lab), "--yes")
    up = sparkctl("up", *inv(lab), "--yes")
    assert up.returncode == 0, up.stdout + up.stderr
    for node, name in zip(lab.nodes, ("r-a", "r-b"), strict=True):
        # r-a, on the gateway's node, persistent: it comes back with the gateway after a reboot
        persist = ["--persist"] if name == "r-a" else []
        launch = sparkctl("launch", "qwen3-8b", *inv(lab), "--nodes", node, "--name", name,
                          "--yes", "--timeout", "240", *persist)
        assert launch.returncode == 0, launch.stdout + launch.stderr
    tmp = tmp_path_factory.mktemp("gateway")
    secret = f"sk-e2e-sentinel-{os.getpid()}-{time.time_ns()}"
    yield lab, key_file(tmp, "key", secret + "\n"), secret
    sparkctl("gateway", "down", *inv(lab))
    sparkctl("down", *inv(lab), "--yes")


def call(lab: Lab, path: str, key: str | None, body: dict | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    url = f"http://{lab.hosts[lab.nodes[0]]}:4000{path}"
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers),
                                    timeout=120) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {}


CHAT = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hello"}]}


def test_bad_input_is_refused_before_any_change(served: tuple[Lab, Path, str]) -> None:
    lab, key, _ = served
    tmp = key.parent
    cases = [
        (["--host", "0.0.0.0"], "--api-key-file"),
        (["--host", "0.0.0.0", "--api-key-file", str(key_file(tmp, "open", "sk-0123456789ab",
                                                              0o644))], "chmod 600"),
        (["--host", "0.0.0.0", "--api-key-file", str(key_file(tmp, "empty", "\n"))], "empty"),
        (["--host", "0.0.0.0", "--api-key-file", str(tmp / "missing")], "not found"),
        (["--port", "30000"], "port 30000 on spark-a"),  # r-a's engine listens there
        # an address spark-a lacks: found by the first probe (41.7; it failed after 8 s as "did
        # not answer within 180 s" and left the config with the key behind)
        (["--host", "192.0.2.7", "--api-key-file", str(key)], "spark-a has no such address"),
    ]
    for args, message in cases:
        result = sparkctl("gateway", "up", *inv(lab), *args)
        assert result.returncode == 2, (args, result.stdout + result.stderr)
        assert message in result.stderr, (args, result.stderr)
    head = lab.nodes[0]
    assert lab.exec(head, "docker ps -aq --filter name=sparkctl-gateway").stdout.strip() == ""
    assert lab.exec(head, "ls /etc/sparkctl/gateway 2>/dev/null | wc -l").stdout.strip() == "0"


def test_up_serves_with_the_key_only_and_is_idempotent(served: tuple[Lab, Path, str]) -> None:
    lab, key, secret = served
    up = sparkctl("gateway", "up", *inv(lab), "--host", "0.0.0.0", "--api-key-file", str(key),
                  "--json", timeout=400)
    assert up.returncode == 0, up.stdout + up.stderr
    doc = json.loads(up.stdout)
    assert doc["outcome"] == "started" and doc["key"] is True and doc["live"] is True
    assert {(r["server"], r["node"], r["health"]) for r in doc["replicas"]} == {
        ("r-a", lab.nodes[0], "healthy"), ("r-b", lab.nodes[1], "healthy")}
    # the router answers its model list to anyone (names only), completions with the key only
    assert call(lab, "/v1/chat/completions", None, CHAT)[0] == 401
    assert call(lab, "/v1/chat/completions", "sk-wrong-key-000", CHAT)[0] == 401
    status, models = call(lab, "/v1/models", secret)
    assert status == 200 and [m["id"] for m in models["data"]] == [MODEL]
    status, answer = call(lab, "/v1/chat/completions", secret, CHAT)
    assert status == 200 and answer["choices"][0]["message"]["content"]
    again = sparkctl("gateway", "up", *inv(lab), "--host", "0.0.0.0", "--api-key-file",
                     str(key), "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["outcome"] == "unchanged"
    # `chat --gateway`: through the router with its key, read on its node (no key given here)
    chat = sparkctl("chat", "Hello", *inv(lab), "--gateway", "--max-tokens", "8", "--json")
    assert chat.returncode == 0, chat.stdout + chat.stderr
    said = json.loads(chat.stdout)
    assert said["gateway"] is True and said["node"] == lab.nodes[0] and said["model"] == MODEL
    assert said["reply"] and secret not in chat.stdout + chat.stderr
    # no door beside the gateway (41.2): r-a's relay answers the gateway's node only; r-a
    # itself has no key, so any other fabric host would have had it for free
    r_a = next(r for r in doc["replicas"] if r["server"] == "r-a")
    probe = (f"curl -s -m 10 -o /dev/null -w '%{{http_code}}' "
             f"http://{r_a['address']}:{r_a['port']}/v1/models; true")
    assert lab.exec(lab.nodes[1], probe).stdout.strip() == "000"  # closed on
    assert lab.exec(lab.nodes[0], probe).stdout.strip() == "200"  # the gateway's node
    # the record is private (41.7): mode 0600, a salted slow fingerprint, no key
    record = "/var/lib/sparkctl/run/gateway/gateway.json"
    assert lab.exec(lab.nodes[0], f"stat -c %a {record}").stdout.strip() == "600"
    text = lab.exec(lab.nodes[0], f"cat {record}").stdout
    assert '"salt"' in text and secret not in text
    # the engines stay on their node's loopback; the gateway reaches them over the fabric
    args = lab.exec(lab.nodes[1], "docker inspect -f '{{json .Args}}' sparkctl-sglang-r-b").stdout
    assert "127.0.0.1" in args and "0.0.0.0" not in args


class Load:
    """Requests at a fixed concurrency through the gateway until stopped; every failure kept."""

    def __init__(self, lab: Lab, secret: str, concurrency: int = 4) -> None:
        self.lab, self.secret = lab, secret
        self.ok, self.failed = 0, []  # type: ignore[var-annotated]
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.worker) for _ in range(concurrency)]

    def worker(self) -> None:
        while not self.stop.is_set():
            try:
                status, _ = call(self.lab, "/v1/chat/completions", self.secret, CHAT)
            except OSError as exc:
                status = repr(exc)  # type: ignore[assignment]
            with self.lock:
                if status == 200:
                    self.ok += 1
                else:
                    self.failed.append(status)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def started_at(lab: Lab) -> dict[str, str]:
    out = {}
    for node, name in zip(lab.nodes, ("r-a", "r-b"), strict=True):
        record = json.loads(lab.exec(node, f"cat /var/lib/sparkctl/run/servers/{name}/server.json").stdout)
        out[name] = record["config_hash"] + record["started"]
    return out


def test_rolling_relaunch_drops_no_request(served: tuple[Lab, Path, str], tmp_path: Path) -> None:
    lab, _, secret = served
    changed = tmp_path / "qwen3-8b.yml"
    changed.write_text(RECIPE.read_text().replace("kv_cache_fraction: 0.3 ",
                                                  "kv_cache_fraction: 0.32 "))
    before = started_at(lab)
    with Load(lab, secret) as load:
        time.sleep(2)
        rolling = sparkctl("launch", str(changed), *inv(lab), "--rolling", "--timeout", "240")
        time.sleep(2)
    assert rolling.returncode == 0, rolling.stdout + rolling.stderr
    assert load.failed == [] and load.ok > 0, (load.ok, load.failed[:5])
    after = started_at(lab)
    assert all(after[name] != before[name] for name in before), (before, after)
    assert "r-a: back in the gateway" in rolling.stderr and "r-b: back in" in rolling.stderr
    # each replica's ready and smoke-test lines are its own node's (r-b's said the head's)
    said = rolling.stdout + rolling.stderr
    for node in lab.nodes:
        assert f"✓ {node} ready: answering" in said, said[-3000:]
        assert f"✓ {node} smoke-test: chat completion on {node}" in said, said[-3000:]
    # --rolling relaunches replicas where they are: no --dry-run, --nodes, --name, --port
    single = sparkctl("launch", str(RECIPE), *inv(lab), "--rolling", "--dry-run")
    assert single.returncode == 2 and "--dry-run" in single.stderr


def test_the_gateway_comes_back_after_its_node_reboots(served: tuple[Lab, Path, str]) -> None:
    """LiteLLM's container came back with its node (docker's restart policy); the router and
    the relays are processes: sparkctl-gateway.service starts them at boot."""
    lab, keyfile, secret = served
    head = lab.nodes[0]
    up = sparkctl("gateway", "up", *inv(lab), "--host", "0.0.0.0", "--api-key-file", str(keyfile))
    assert up.returncode == 0, up.stdout + up.stderr
    enabled = lab.exec(head, "systemctl is-enabled sparkctl-gateway.service").stdout.strip()
    assert enabled == "enabled"
    pid_before = lab.exec(head, "cat /var/lib/sparkctl/run/gateway/router.pid").stdout.strip()
    result = lab.cli("reboot", "--node", head)
    assert result.returncode == 0, result.stdout + result.stderr
    deadline = time.monotonic() + 300
    while True:
        status = json.loads(sparkctl("gateway", "status", *inv(lab), "--json").stdout)
        served_by = {r["server"] for r in status.get("replicas") or []
                     if r["in_gateway"] and r["router_healthy"] and r["health"] == "healthy"}
        if served_by == {"r-a", "r-b"} or time.monotonic() > deadline:
            break
        time.sleep(5)
    boot = lab.exec(head, "cat /var/log/sparklab-boot.log /var/log/sparklab-journal/"
                          "sparkctl-gateway.service.log").stdout
    assert served_by == {"r-a", "r-b"}, json.dumps(status) + "\n" + boot[-3000:]
    assert "sparkctl-gateway: router started" in boot and "relay r-a started" in boot, boot
    pid_after = lab.exec(head, "cat /var/lib/sparkctl/run/gateway/router.pid").stdout.strip()
    assert pid_after != pid_before
    assert call(lab, "/v1/chat/completions", secret, CHAT)[0] == 200
    assert call(lab, "/v1/chat/completions", None, CHAT)[0] == 401  # the key came back too


def test_a_killed_replica_is_routed_around(served: tuple[Lab, Path, str]) -> None:
    lab, _, secret = served
    lab.exec(lab.nodes[1], "docker kill sparkctl-sglang-r-b >/dev/null")
    time.sleep(10)
    results = [call(lab, "/v1/chat/completions", secret, CHAT)[0] for _ in range(6)]
    assert results == [200] * 6
    status = json.loads(sparkctl("gateway", "status", *inv(lab), "--json").stdout)
    health = {r["server"]: r["health"] for r in status["replicas"]}
    assert health == {"r-a": "healthy", "r-b": "down"}


def test_the_key_is_in_no_argv_log_json_or_inspect(served: tuple[Lab, Path, str]) -> None:
    lab, _, secret = served
    seen = []
    for node in lab.nodes:
        seen.append(lab.exec(node, "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '",
                             check=False).stdout)
        seen.append(lab.exec(node, "for c in $(docker ps -aq); do docker inspect $c; "
                             "docker logs $c 2>&1; done; cat /var/lib/sparkctl/run/gateway/* "
                             "/var/lib/sparkctl/run/*.log 2>/dev/null", check=False).stdout)
    state = Path(e2e_state("gateway"))
    seen += [p.read_text(errors="replace") for p in state.rglob("*") if p.is_file()]
    seen += OUTPUTS
    assert all(secret not in text for text in seen)
    assert sum(len(text) for text in seen) > 10_000  # the probe read something
    mode = lab.exec(lab.nodes[0], "stat -c %a /etc/sparkctl/gateway/router.json").stdout.strip()
    assert mode == "600"


def test_down_removes_the_gateway(served: tuple[Lab, Path, str]) -> None:
    lab, _, _ = served
    down = sparkctl("gateway", "down", *inv(lab), "--json")
    assert down.returncode == 0, down.stdout + down.stderr
    head = lab.nodes[0]
    assert lab.exec(head, "docker ps -aq --filter name=sparkctl-gateway").stdout.strip() == ""
    for node in lab.nodes:
        assert lab.exec(node, "ls /var/lib/sparkctl/run/gateway/ 2>/dev/null | wc -l"
                        ).stdout.strip() == "0"
    assert lab.exec(head, "test -e /etc/sparkctl/gateway", check=False).returncode != 0
    for node in lab.nodes:  # nothing comes back at the next boot
        assert lab.exec(node, "test -e /etc/systemd/system/sparkctl-gateway.service",
                        check=False).returncode != 0
    status = json.loads(sparkctl("gateway", "status", *inv(lab), "--json").stdout)
    assert status["running"] is False
    # the unpacked router stays for the next `gateway up`; `sparkctl down` leaves nothing of it
    tree = "/opt/sparkctl/sglang-router-*"
    assert lab.exec(head, f"ls -d {tree}").stdout.strip()
    full = sparkctl("down", *inv(lab), "--yes")
    assert full.returncode == 0, full.stdout + full.stderr
    for node in lab.nodes:
        assert lab.exec(node, "test -e /opt/sparkctl", check=False).returncode != 0, node
