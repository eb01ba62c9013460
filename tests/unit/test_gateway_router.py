"""The gateway's node-side router scripts against stand-ins that speak the router's API: the
launcher (keys read from the 0600 config, never from its argument; workers added through
`POST /workers`), the worker changes (`POST`/`DELETE /workers`, a rotated key replaced, the
config rewritten with the fingerprint `gateway up` computes), and the wheel's installer (the
pinned sha256 or nothing)."""

from __future__ import annotations

import hashlib
import json
import platform
import socket
import subprocess
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from orchestrator.commands import Secret
from orchestrator.node import script
from orchestrator.phases import gateway_spec as gs

KEY = "sk-unit-router-0123456789"
REPLICA_KEY = "sk-replica-key-42"


class FakeRouter:
    """The router's worker API as 0.3.2 answers it (measured): GET /workers lists
    {"id", "url", "is_healthy", "load"}, POST /workers answers 202, DELETE /workers/ID 202."""

    def __init__(self) -> None:
        self.workers: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str, str | None, dict[str, Any] | None]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self, code: int, doc: dict[str, Any]) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def note(self, body: dict[str, Any] | None = None) -> None:
                outer.calls.append((self.command, self.path,
                                    self.headers.get("Authorization"), body))

            def do_GET(self) -> None:
                self.note()
                listed = [{"id": i, "url": w["url"], "is_healthy": True, "load": 0}
                          for i, w in outer.workers.items()]
                self.answer(200, {"workers": listed} if self.path == "/workers" else {})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self.note(body)
                outer.workers[f"id-{len(outer.calls)}"] = body
                self.answer(202, {"status": "accepted"})

            def do_DELETE(self) -> None:
                self.note()
                outer.workers.pop(self.path.rsplit("/", 1)[1], None)
                self.answer(202, {"status": "accepted"})

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def router() -> Any:
    fake = FakeRouter()
    yield fake
    fake.server.shutdown()


def config_file(tmp_path: Path, port: int, workers: list[dict[str, Any]]) -> Path:
    path = tmp_path / "router.json"
    path.write_text(json.dumps({"host": "0.0.0.0", "port": port, "api_key": KEY,
                                "settings": gs.POLICY, "workers": workers}))
    path.chmod(0o600)
    return path


def worker(url: str, key: str = gs.NO_KEY) -> dict[str, Any]:
    return {"url": url, "model_id": "m", "api_key": key}


def change(request: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", script("gateway_workers.py")], check=True,
                         input=json.dumps(request), capture_output=True, text=True).stdout
    return dict(json.loads(out))


def test_workers_join_leave_and_a_rotated_key_is_replaced(router: FakeRouter,
                                                          tmp_path: Path) -> None:
    path = config_file(tmp_path, router.port, [worker("http://a:1")])
    router.workers = {"ida": worker("http://a:1"), "idb": worker("http://b:1")}
    wanted = [worker("http://a:1", REPLICA_KEY), worker("http://c:1")]
    out = change({"config": str(path), "workers": wanted, "extra": ["x"], "salt": "s",
                  "rounds": 10})
    # b left, c joined, a's key changed (a rolling key rotation): removed and added again
    assert sorted(out["removed"]) == ["http://a:1", "http://b:1"]
    assert sorted(out["added"]) == ["http://a:1", "http://c:1"]
    assert {w["url"]: w["api_key"] for w in router.workers.values()} == {
        "http://a:1": REPLICA_KEY, "http://c:1": gs.NO_KEY}
    assert all(auth == f"Bearer {KEY}" for _, _, auth, _ in router.calls)  # its own key
    text = path.read_text()
    assert json.loads(text)["workers"] == wanted and path.stat().st_mode & 0o777 == 0o600
    assert out["fingerprint"] == hashlib.pbkdf2_hmac(
        "sha256", (text + json.dumps(["x"])).encode(), b"s", 10).hex()
    assert KEY not in json.dumps(out) and REPLICA_KEY not in json.dumps(out)


def test_a_replica_is_taken_out_now_without_changing_the_config(router: FakeRouter,
                                                               tmp_path: Path) -> None:
    path = config_file(tmp_path, router.port, [worker("http://a:1"), worker("http://b:1")])
    router.workers = {"ida": worker("http://a:1"), "idb": worker("http://b:1")}
    before = path.read_text()
    out = change({"config": str(path), "workers": None, "remove": ["http://b:1"], "wait": 5})
    assert out["removed"] == ["http://b:1"] and ("DELETE", "/workers/idb") in [
        c[:2] for c in router.calls]
    assert path.read_text() == before and [w["url"] for w in out["workers"]] == ["http://a:1"]
    back = change({"config": str(path), "workers": None})  # put back from the config
    assert back["added"] == ["http://b:1"] and len(router.workers) == 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


FAKE_ROUTER = '''
import json, os, sys, time, urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Router:
    @classmethod
    def from_args(cls, args):
        router = cls()
        router.args = args
        return router

    def start(self):
        out = os.environ["FAKE_OUT"]
        seen = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200); self.end_headers()

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                seen.append({"auth": self.headers.get("Authorization"), "body": json.loads(body)})
                self.send_response(202); self.end_headers()
                with open(out, "w") as handle:
                    json.dump({"args": vars(self_router.args), "posts": seen}, handle)

            def log_message(self, *args):
                pass

        self_router = self
        ThreadingHTTPServer(("127.0.0.1", self.args.port), Handler).serve_forever()
'''
FAKE_ARGS = '''
class RouterArgs:
    def __init__(self, **fields):
        self.__dict__.update(fields)
'''


def test_the_launcher_reads_the_keys_from_the_file_and_adds_the_workers(tmp_path: Path) -> None:
    tree = tmp_path / "tree" / gs.ROUTER_MODULE
    tree.mkdir(parents=True)
    (tree / "__init__.py").write_text("")
    (tree / "router.py").write_text(FAKE_ROUTER)
    (tree / "router_args.py").write_text(FAKE_ARGS)
    port = free_port()
    spec = gs.GatewaySpec("n", "127.0.0.1", port, (gs.Replica(
        "r", "m", "n", "10.0.0.2", 30000, key=Secret(REPLICA_KEY)),), Secret(KEY))
    config = tmp_path / "router.json"
    config.write_text(spec.config_text())
    argv = json.dumps({"config": str(config), "tree": str(tree.parent), "module": gs.ROUTER_MODULE,
                       "pidfile": str(tmp_path / "router.pid")})
    assert KEY not in argv and REPLICA_KEY not in argv  # what `ps` shows
    out = tmp_path / "seen.json"
    launcher = subprocess.Popen([sys.executable, "-c", script("gateway_router.py"), argv],
                                env={"FAKE_OUT": str(out), "PATH": "/usr/bin:/bin"})
    try:
        for _ in range(200):
            if out.exists() and out.read_text():
                break
            launcher.poll()
            assert launcher.returncode is None, "the launcher ended"
            import time
            time.sleep(0.05)
        seen = json.loads(out.read_text())
    finally:
        launcher.terminate()
        launcher.wait(10)
    assert seen["args"]["api_key"] == KEY and seen["args"]["worker_urls"] == []
    assert seen["args"]["policy"] == gs.POLICY["policy"] and seen["args"]["port"] == port
    (post,) = seen["posts"]
    assert post["auth"] == f"Bearer {KEY}" and post["body"] == {
        "url": "http://10.0.0.2:30000", "model_id": "m", "api_key": REPLICA_KEY}
    assert (tmp_path / "router.pid").read_text() == str(launcher.pid)


def wheel(tmp_path: Path) -> tuple[Path, str, str]:
    house = tmp_path / "wheels"
    house.mkdir()
    name = f"sglang_router-{gs.ROUTER_VERSION}-cp38-abi3-test.whl"
    with zipfile.ZipFile(house / name, "w") as archive:
        archive.writestr(f"{gs.ROUTER_MODULE}/__init__.py", "")
    return house, name, hashlib.sha256((house / name).read_bytes()).hexdigest()


def install(tmp_path: Path, house: Path, name: str, digest: str) -> subprocess.CompletedProcess[str]:
    args = {"tree": str(tmp_path / "opt" / "router"), "module": gs.ROUTER_MODULE,
            "version": gs.ROUTER_VERSION, "requirement": "none-such==0", "wheelhouse": str(house),
            "wheels": {platform.machine(): [name, digest]}}
    return subprocess.run([sys.executable, "-c", script("router_install.py"), json.dumps(args)],
                          capture_output=True, text=True, check=False)


def test_the_installer_unpacks_the_pinned_wheel_only(tmp_path: Path) -> None:
    house, name, digest = wheel(tmp_path)
    refused = install(tmp_path, house, name, "0" * 64)
    assert refused.returncode == 2 and "not the pinned" in refused.stderr
    assert not (tmp_path / "opt" / "router").exists()  # nothing unpacked
    done = install(tmp_path, house, name, digest)
    assert done.returncode == 0 and done.stdout.strip() == "installed"
    assert (tmp_path / "opt" / "router" / gs.ROUTER_MODULE / "__init__.py").is_file()
    assert install(tmp_path, house, name, digest).stdout.strip() == "present"


def test_the_pins_name_the_wheels_of_the_version() -> None:
    assert set(gs.WHEELS) == {"aarch64", "x86_64"}  # a Spark, and the lab
    for machine, (name, digest) in gs.WHEELS.items():
        assert name.startswith(f"sglang_router-{gs.ROUTER_VERSION}-") and machine in name
        assert len(digest) == 64 and int(digest, 16) >= 0


def test_a_leaving_replica_is_deleted_from_the_router_before_its_relay_drains() -> None:
    """`down --server b` and a rolling relaunch: `DELETE /workers/ID` through the router's
    node (found by its record) first, then the relay's door closes and its requests drain."""
    from conftest import FakeTransport, as_servers, make_inventory

    from orchestrator.gateway import control as gateway
    from orchestrator.phases import gateway_relays

    spec = gateway.desired(make_inventory(), "spark-a", "127.0.0.1", 4000, None, as_servers([
        {"name": n, "node": node, "nodes": [node], "model": "m", "port": 30000, "alive": True}
        for n, node in (("a", "spark-a"), ("b", "spark-b"))]))
    head, other = FakeTransport("spark-a"), FakeTransport("spark-b")
    head.on('"dir"', stdout=json.dumps({"state": spec.record(), "relays": {}}))
    order: list[str] = []
    head.on("old_keys", answer=lambda _c: order.append("router") or {"added": [], "workers": []})
    drained = {"alive": True, "accepting": False, "busy": 0}
    other.on("kill -USR1", answer=lambda _c: order.append("door") or {})
    other.on('"dir"', stdout=json.dumps({"state": None, "relays": {"b": drained}}))
    ts = {"spark-a": head, "spark-b": other}
    assert gateway_relays.drain(other, "b", 5, print, ts)  # type: ignore[arg-type]
    (delete,) = [c for c in head.calls if "old_keys" in c.command]
    request = json.loads(str(delete.stdin))
    assert request["remove"] == ["http://192.168.200.13:30000"] and request["workers"] is None
    assert order == ["router", "door"]  # out of the router first, then the relay's door


def test_the_launchers_argument_is_what_the_start_command_and_the_boot_plan_give() -> None:
    """The launcher reads config, tree, module and pidfile: `gateway up`'s start command and the
    boot unit's plan (which the boot program hands on) both carry them, the module the pin's."""
    import shlex

    start = shlex.split(gs.start_cmd().split("{ ", 1)[1].split(" >", 1)[0])
    args = json.loads(start[-1])
    assert set(args) == {"config", "tree", "module", "pidfile"}
    assert args["module"] == gs.ROUTER_MODULE and args["tree"] == gs.ROUTER_TREE
    plan = next(json.loads(text) for path, _, text in gs.boot_files() if path.endswith(".json"))
    assert {"config", "tree", "module"} <= set(plan) and plan["module"] == gs.ROUTER_MODULE
