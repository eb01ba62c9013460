"""The memory guard's node script in this process: what it reads, when it stops a server, how it
stops one (processes or containers) and what it records, with a fake `docker` on PATH. The
subprocess tests in test_memory_guard.py run it whole; these reach each function."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.node import memguard


def fake_docker(tmp_path: Path, script: str) -> Path:
    """A `docker` whose behaviour is SCRIPT (Python, argv in `args`), first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    docker = bin_dir / "docker"
    docker.write_text(f"#!{sys.executable}\nimport sys\nargs = sys.argv[1:]\n{script}\n")
    docker.chmod(0o755)
    return bin_dir


@pytest.fixture
def on_path(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    def put(bin_dir: Path) -> None:
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return put


def test_meminfo_reads_kb_as_bytes_and_decide_compares(tmp_path: Path) -> None:
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       1024 kB\nMemAvailable:    512 kB\nHugePages_Total:  3\n")
    figures = memguard.meminfo(str(info))
    assert figures == {"MemTotal": 1024 * 1024, "MemAvailable": 512 * 1024, "HugePages_Total": 3}
    assert memguard.decide(1, 2) and not memguard.decide(2, 2)


def test_a_process_and_its_children_are_found_alive_and_stopped(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
                               " time.sleep(60)"])
    try:
        (tmp_path / "rank-0.pid").write_text(f"{parent.pid}\n")
        (tmp_path / "memguard.pid").write_text("1\n")  # the guard's own: never a target
        (tmp_path / "broken.pid").write_text("not a pid\n")
        assert memguard.server_pids(str(tmp_path)) == [parent.pid]
        for _ in range(50):
            if memguard.children(parent.pid):
                break
            time.sleep(0.1)
        kids = memguard.children(parent.pid)
        assert kids and memguard.alive(parent.pid)
        targets, killed = memguard.stop([parent.pid], grace=5)
        assert targets == [parent.pid, *kids] and killed == []
        assert parent.wait(timeout=10) == -signal.SIGTERM
    finally:
        if parent.poll() is None:
            parent.kill()
    assert not memguard.alive(parent.pid) and memguard.server_pids(str(tmp_path / "none")) == []


def test_containers_running_tells_running_gone_and_unknown(tmp_path: Path, on_path) -> None:  # type: ignore[no-untyped-def]
    on_path(fake_docker(tmp_path, (
        "name = args[-1]\n"
        "if name == 'up': print('c0ffee true')\n"
        "elif name == 'down': print('d0d0 false')\n"
        "elif name == 'gone': sys.stderr.write('Error: No such object: gone\\n'); sys.exit(1)\n"
        "else: sys.stderr.write('Cannot connect to the Docker daemon\\n'); sys.exit(1)")))
    assert memguard.containers_running(["up", "down", "gone"]) == ["up"]
    assert memguard.containers_running(["up", "busy"]) is None  # docker could not tell
    first = {"up": "beef"}  # another container had this name when the guard first looked
    assert memguard.containers_running(["up"], first) == [] and first == {"up": "beef"}


def test_a_guard_ends_when_its_container_is_replaced_and_stops_nothing(
        tmp_path: Path, on_path) -> None:  # type: ignore[no-untyped-def]
    """`down --server` then `launch` between two looks: a container of the same name, another
    ID. The old guard ends (the new launch started its own) instead of watching, and one day
    stopping, the next server; the e2e lab had six guards on one server before."""
    looks = tmp_path / "looks"
    on_path(fake_docker(tmp_path, (
        f"import os\nlooks = {str(looks)!r}\n"
        "if args[0] == 'stop': open(looks + '.stop', 'w').write(' '.join(args)); sys.exit(0)\n"
        "n = int(open(looks).read()) if os.path.exists(looks) else 0\n"
        "open(looks, 'w').write(str(n + 1))\n"
        "print(('first' if n < 2 else 'second') + ' true')")))
    args = {"run": str(tmp_path), "node": "spark-a", "min_available_gb": 0, "interval": 0.01,
            "inspect_every": 0, "containers": ["sparkctl-llamacpp-x"]}
    assert memguard.main(args) == 0
    assert looks.read_text() == "3" and not (tmp_path / "looks.stop").exists()
    assert not (tmp_path / memguard.RECORD).exists()


def test_the_guard_stops_its_containers_and_records_why(tmp_path: Path, on_path) -> None:  # type: ignore[no-untyped-def]
    stopped = tmp_path / "stopped"
    on_path(fake_docker(tmp_path, (
        f"import os\nflag = {str(stopped)!r}\n"
        "if args[0] == 'stop': open(flag, 'w').write(' '.join(args)); sys.exit(0)\n"
        "print('f1a9 false' if os.path.exists(flag) else 'f1a9 true')")))
    args = {"run": str(tmp_path), "node": "spark-b", "min_available_gb": 1e6, "interval": 0.01,
            "inspect_every": 0, "grace": 1, "containers": ["sparkctl-sglang-x"]}
    assert memguard.main(args) == 0
    assert stopped.read_text() == "stop -t 1 f1a9"  # by ID: never a later namesake
    record = json.loads((tmp_path / memguard.RECORD).read_text())
    assert (record["state"], record["stopped"], record["node"]) == (
        "stopped", ["sparkctl-sglang-x"], "spark-b")
    assert record["available_gb"] < record["min_available_gb"]
    assert int((tmp_path / memguard.OWN_PID).read_text()) == os.getpid()


def test_the_guard_leaves_a_server_that_ended_without_stopping_anything(tmp_path: Path) -> None:
    victim = subprocess.Popen([sys.executable, "-c", "pass"])
    victim.wait()
    (tmp_path / "rank-0.pid").write_text(f"{victim.pid}\n")  # recorded, already gone
    args = {"run": str(tmp_path), "node": "spark-a", "min_available_gb": 1e6, "interval": 0.01,
            "start_timeout": 0}
    assert memguard.main(args) == 0
    assert not (tmp_path / memguard.RECORD).exists()
