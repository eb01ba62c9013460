"""The node programs that were Python strings in the controller until issue 39 (the image
records' parser, the boot plan's TCP condition, status's /metrics fetch), run for real: each
command exactly as sparkctl builds it, in bash, against a fake `docker` on PATH, a listening
socket or a tiny HTTP server."""

from __future__ import annotations

import http.server
import io
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from nodescript import closed_port, http_server, run_node_script

from orchestrator.engines.trtllm import mpi_env
from orchestrator.engines.vllm import images
from orchestrator.node import image_record
from orchestrator.phases import image_records
from orchestrator.phases.persist import tcp_cmd
from orchestrator.remote.gathered import NodeFacts
from orchestrator.status.memory import metrics_cmd, server_metrics

IMAGE, IMAGE_ID = "example.org/engine:1.0", "sha256:" + "ab" * 32


def bash(command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def fake_docker(tmp_path: Path, answer: str, rc: int = 0) -> dict[str, str]:
    """A `docker` on PATH that prints ANSWER (whatever it was asked) and exits RC."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "answer").write_text(answer)
    docker = bin_dir / "docker"
    docker.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/argv\ncat {tmp_path}/answer\nexit {rc}\n")
    docker.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.fixture
def record_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "images"
    monkeypatch.setattr(image_records, "RECORD_DIR", str(where))
    return where


def test_the_open_mpi_record_is_parsed_stored_and_printed_by_the_node_program(
        tmp_path: Path, record_dir: Path) -> None:
    env = fake_docker(tmp_path, "TensorRT-LLM banner\nmpirun (Open MPI) 5.0.11\n\nReport bugs\n")
    ran = bash(mpi_env.detect_and_record_cmd(IMAGE, IMAGE_ID), env)
    assert ran.returncode == 0, ran.stderr
    record = json.loads(ran.stdout)
    assert {k: record[k] for k in ("image", "image_id", "implementation", "version", "major")} == {
        "image": IMAGE, "image_id": IMAGE_ID, "implementation": "Open MPI", "version": "5.0.11",
        "major": 5}
    assert json.loads(Path(mpi_env.record_path(IMAGE)).read_text()) == record
    assert Path(mpi_env.record_path(IMAGE)).parent == record_dir
    assert (tmp_path / "argv").read_text().split() == ["run", "--rm", "--network", "none", IMAGE,
                                                       "mpirun", "--version"]
    facts = NodeFacts.parse({"commands": {mpi_env.FACT_KEY: {"rc": 0, "out": ran.stdout}}})
    assert mpi_env.recorded(facts, IMAGE_ID) == record


def test_an_image_without_an_open_mpi_version_is_not_recorded(tmp_path: Path, record_dir: Path) -> None:
    env = fake_docker(tmp_path, "mpirun: command not found\n")
    ran = bash(mpi_env.detect_and_record_cmd(IMAGE, IMAGE_ID), env)
    assert ran.returncode == 3 and "no Open MPI version" in ran.stderr
    assert "command not found" in ran.stderr and not record_dir.exists()

    (tmp_path / "failing").mkdir()
    env = fake_docker(tmp_path / "failing", "no such image\n", rc=125)
    ran = bash(mpi_env.detect_and_record_cmd(IMAGE, IMAGE_ID), env)
    assert ran.returncode == 2 and "no such image" in ran.stderr


@pytest.mark.parametrize(("answer", "ray"), [("ray, version 2.49.1\n", "2.49.1"),
                                             ("no-ray\n", None)])
def test_the_ray_record_says_which_ray_or_none(tmp_path: Path, record_dir: Path, answer: str,
                                               ray: str | None) -> None:
    env = fake_docker(tmp_path, answer)
    ran = bash(images.detect_and_record_cmd(IMAGE, IMAGE_ID), env)
    assert ran.returncode == 0, ran.stderr
    record = json.loads(ran.stdout)
    assert record["ray"] == ray and record["image_id"] == IMAGE_ID
    facts = NodeFacts.parse({"commands": {images.FACT_KEY: {"rc": 0, "out": ran.stdout}}})
    assert images.recorded(facts, IMAGE_ID) == record
    assert images.recorded(facts, "sha256:other") is None


def test_an_unexpected_ray_answer_is_an_error_not_a_record(tmp_path: Path, record_dir: Path) -> None:
    env = fake_docker(tmp_path, "Traceback: ray is broken\n")
    ran = bash(images.detect_and_record_cmd(IMAGE, IMAGE_ID), env)
    assert ran.returncode == 3 and "unexpected answer" in ran.stderr and not record_dir.exists()


def test_the_node_program_parses_versions_as_the_controller_does(monkeypatch: pytest.MonkeyPatch) -> None:
    assert mpi_env._VERSION_RE.pattern == image_record.MPI_VERSION
    monkeypatch.setattr(sys, "stdin", io.StringIO("mpirun (Open MPI) 4.1.7a1\n"))
    request = {"kind": "mpi", "image": IMAGE, "image_id": IMAGE_ID}
    ran = run_node_script("image_record.py", [json.dumps(request)], monkeypatch)
    assert ran.code is None and ran.json["version"] == "4.1.7" and ran.json["major"] == 4
    assert mpi_env.parse_mpirun_version("mpirun (Open MPI) 4.1.7a1") == mpi_env.MpiVersion("4.1.7", 4)


def test_the_tcp_condition_holds_only_while_something_listens() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert bash(tcp_cmd("127.0.0.1", port)).returncode == 0
    assert bash(tcp_cmd("127.0.0.1", closed_port())).returncode != 0
    assert bash(tcp_cmd("no-such-host.invalid", 22)).returncode != 0


def test_metrics_are_fetched_whole_with_the_key_from_its_file(tmp_path: Path) -> None:
    key = tmp_path / "api_key"
    key.write_text("sk-metrics\n")
    body = "# HELP x\n" + "".join(f"spec_decode_num_drafts_total {i}\n" for i in range(3000))
    asked: list[tuple[str, str | None]] = []

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append((self.path, self.headers.get("Authorization")))
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        command = metrics_cmd(server.server_address[1], "0.0.0.0", str(key))
        ran = bash(command)
    finally:
        server.shutdown()
        server.server_close()
    assert ran.returncode == 0, ran.stderr
    content_type, _, text = ran.stdout.partition("\n")
    assert content_type == "text/plain; version=0.0.4" and text == body and len(text) > 20000
    assert asked == [("/metrics", "Bearer sk-metrics")] and "sk-metrics" not in command
    assert server_metrics(ran.returncode, ran.stdout)["ok"] is True


def test_metrics_that_do_not_answer_exit_non_zero() -> None:
    ran = bash(metrics_cmd(closed_port()))
    assert ran.returncode == 1 and "GET /metrics" in ran.stderr
    assert server_metrics(ran.returncode, ran.stdout)["ok"] is False
    with http_server({}) as (port, _):
        ran = bash(metrics_cmd(port))
    assert ran.returncode == 1 and "404" in ran.stderr
