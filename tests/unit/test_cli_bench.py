"""`sparkctl bench` through click's CliRunner: the session is a FakeCluster whose head runs a
vLLM server, and the measuring layer (bench/run.run_bench, the relaunch of a sweep) is
faked; what is real is the command's own work: options, the target it builds, the node state
it samples, the server's identity, the JSON document, --save, the table, --sweep, compare."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import SERVERS_CMD, FakeCluster, as_servers, make_inventory, servers_listing

from orchestrator.bench import run as bench_run
from orchestrator.bench.metrics import NODE_STATE_CMD
from orchestrator.cli import bench as bench_cli
from orchestrator.cli import cli
from orchestrator.engines.vllm.meter import VllmMeter
from orchestrator.errors import SparkctlError

INVENTORY = """\
cluster: {name: two-sparks, ssh_key: /k}
nodes:
  - {name: spark-a, host: a}
  - {name: spark-b, host: b}
"""
IMAGE = "nvcr.io/nvidia/vllm:26.10-py3"
SERVER = {"engine": "vllm", "recipe": "minimax-m2.7", "model": "nvidia/MiniMax-M2.7-NVFP4",
          "container": "sparkctl-vllm",
          "port": 8000, "config_hash": "abc123", "tp_size": 2, "started": "2026-11-23T10:00:00"}
NODE_STATE = ("2405, 3003, 61, 41.5, [N/A], 97\n--meminfo\n"
              "MemTotal:       128000000 kB\nMemAvailable:    28000000 kB\n")


def sparkctl(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def figures(tg: float, peak: float | None = None, errors: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {"tg_throughput": {"mean": tg, "std": 0.1},
                           "tg_req_throughput": {"mean": tg / 2, "std": 0.1},
                           "pp_throughput": {"mean": 3000.0, "std": 5.0},
                           "ttft_ms": {"mean": 250.0, "std": 2.0},
                           "error_count": errors, "errors": ["HTTP 500"] * errors}
    if peak is not None:
        out["peak_throughput"] = {"mean": peak, "std": 0.0}
    return out


def cell(depth: int, pp: int, tg: int, c: int, rate: float, **kwargs: Any) -> dict[str, Any]:
    spec = {"acceptance_rate": 0.5, "acceptance_length": 2.0} if c == 1 else None
    return {"depth": depth, "pp": pp, "tg": tg, "concurrency": c, "runs": 1,
            "figures": figures(rate, peak=rate * 1.2, **kwargs), "spec_decoding": spec,
            "spec_note": None if spec else "no draft model", "nodes": {}}


class Measured:
    """Stands in for bench_run.run_bench: one cell per configured cell, each `rate` t/s (or
    the next of `rates` per call), sampling the nodes through the target like the real one."""

    def __init__(self, rates: list[float] | None = None, errors: int = 0, interrupted: bool = False) -> None:
        self.rates = rates or [20.0]
        self.errors, self.interrupted = errors, interrupted
        self.calls: list[tuple[Any, Any]] = []

    def __call__(self, config: Any, target: Any, stop: Any = None) -> dict[str, Any]:
        self.calls.append((config, target))
        rate = self.rates[min(len(self.calls), len(self.rates)) - 1]
        target.note("[bench] measuring")
        before = target.node_state()
        cells = [cell(d, p, t, c, rate * c, errors=self.errors) for d, p, t, c in config.cells()]
        for one in cells:
            one["nodes"] = before
        return {"schema": bench_run.SCHEMA, "settings": {
            "tg": config.tg, "pp": config.pp, "depth": config.depth, "concurrency": config.concurrency,
            "runs": config.runs, "warmup": config.warmup}, "cells": cells, "nodes_before": before,
            "latency_ms": 1.5, "interrupted": self.interrupted, "started": "2026-11-23T10:00:00+0000"}


@pytest.fixture
def inv(tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("SPARKCTL_INVENTORY", raising=False)
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "two.yml"
    path.write_text(INVENTORY)
    return str(path)


@pytest.fixture
def cluster(fake_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    """The session's nodes: a vLLM server runs on the head; both nodes answer nvidia-smi."""
    c: FakeCluster = fake_cluster()
    c["spark-a"].on(SERVERS_CMD, answer=servers_listing(SERVER))
    c["spark-a"].on(r"docker inspect --type container .* sparkctl-vllm$", stdout=IMAGE + "\n")
    c["spark-a"].on(r"docker image inspect nvcr\.io/nvidia/vllm:26\.10-py3$", stdout=json.dumps([{
        "Id": "sha256:local", "RepoDigests": [f"nvcr.io/nvidia/vllm@sha256:{'f' * 64}"]}]))
    for name in ("spark-a", "spark-b"):
        c[name].on(r"nvidia-smi --query-gpu", stdout=NODE_STATE)

    @contextmanager
    def open_session(inventory: Any, command: str, **kwargs: Any) -> Iterator[Any]:
        yield c.session(command)
    monkeypatch.setattr("orchestrator.core.session.open_session", open_session)
    return c


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> Measured:
    fake = Measured()
    monkeypatch.setattr(bench_run, "run_bench", fake)
    return fake


@pytest.mark.parametrize(("args", "message"), [
    (["--tg", "64,abc"], "'64,abc': expected comma-separated integers from 1 to 65,536"),
    (["--depth", "0,-5"], "-5 is out of range: expected comma-separated integers from 0 to 1,048,576"),
    (["-c", ","], "expected comma-separated integers from 1 to 256"),
    # one thread per request: 100000 once buried the controller; 0 silently became 1
    (["-c", "100000"], "Invalid value for -c/--concurrency: 100000 is out of range: expected "
                       "comma-separated integers from 1 to 256"),
    (["-c", "0"], "0 is out of range: expected comma-separated integers from 1 to 256"),
    (["-c", "0,1,2"], "0 is out of range"),
    (["--tg", "0"], "Invalid value for --tg: 0 is out of range"),
    (["--pp", "0"], "Invalid value for --pp: 0 is out of range"),
    (["--pp", "2000000"], "from 1 to 1,048,576"),
    (["--tg", ",".join(str(n) for n in range(1, 18))], "17 values; at most 16"),
    (["--runs", "0"], "0 is not in the range 1<=x<=100"),
    (["--runs", "1000"], "1000 is not in the range 1<=x<=100"),
    (["--timeout", "0.5"], "0.5 is not in the range 1<=x<=86400"),
    # output paths are checked before minutes of measuring
    (["--save", "/etc/hostname"], "--save /etc/hostname: /etc/hostname is not a directory"),
    (["--save", "/etc/hostname/runs"], "/etc/hostname is not a directory"),
])
def test_bad_input_exits_2_with_a_message(inv: str, args: list[str], message: str,
                                          measured: Measured) -> None:
    result = sparkctl("bench", "-i", inv, *args)
    assert result.exit_code == 2 and message in result.stderr
    assert measured.calls == []


def test_json_document_has_the_cells_the_server_and_every_nodes_state(
        inv: str, cluster: FakeCluster, measured: Measured) -> None:
    result = sparkctl("bench", "-i", inv, "--tg", "64", "-c", "1,2", "--depth", "0", "--pp", "512",
                      "--runs", "2", "--no-warmup", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["command"] == "bench" and doc["ok"] is True and doc["schema"] == "sparkctl-bench/1"
    assert [(c["pp"], c["tg"], c["depth"], c["concurrency"]) for c in doc["cells"]] == [
        (512, 64, 0, 1), (512, 64, 0, 2)]
    assert doc["settings"] == {"tg": [64], "pp": [512], "depth": [0], "concurrency": [1, 2],
                               "runs": 2, "warmup": False}
    assert doc["server"] == {
        "recipe": "minimax-m2.7", "model": "nvidia/MiniMax-M2.7-NVFP4", "draft_model": None,
        "engine": "vllm", "config_hash": "abc123", "tp_size": 2, "port": 8000,
        "started": "2026-11-23T10:00:00", "image": IMAGE, "image_digest": "sha256:" + "f" * 64,
        "head": "spark-a", "server": "minimax-m2.7"}
    state = doc["nodes_before"]
    assert set(state) == {"spark-a", "spark-b"}
    assert state["spark-b"]["sm_clock_mhz"] == 2405.0 and state["spark-b"]["memory_used_gb"] == 95.37
    # the target the command built: the engine's meter and notes on stderr
    ((config, target),) = measured.calls
    assert config.concurrency == [1, 2] and not config.warmup
    assert isinstance(target.meter, VllmMeter) and target.endpoint.model == SERVER["model"]
    assert "[bench] nvidia/MiniMax-M2.7-NVFP4 (minimax-m2.7, vllm) on spark-a" in result.stderr
    assert "[bench] measuring" in result.stderr
    for name in ("spark-a", "spark-b"):
        assert NODE_STATE_CMD in cluster[name].commands


def test_failed_requests_exit_1_and_an_interrupted_run_130(inv: str, cluster: FakeCluster,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_run, "run_bench", Measured(errors=2))
    result = sparkctl("bench", "-i", inv, "--tg", "8", "-c", "1", "--depth", "0", "--json")
    assert result.exit_code == 1 and json.loads(result.stdout)["ok"] is False
    monkeypatch.setattr(bench_run, "run_bench", Measured(interrupted=True))
    result = sparkctl("bench", "-i", inv, "--tg", "8", "-c", "1", "--depth", "0", "--json")
    assert result.exit_code == 130
    doc = json.loads(result.stdout)
    assert doc["interrupted"] is True and doc["ok"] is False


def test_node_state_reports_unreachable_and_failing_nodes(inv: str, fake_cluster: Any,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           measured: Measured) -> None:
    c = fake_cluster(unreachable={"spark-b": "timed out"})
    c["spark-a"].on(SERVERS_CMD, answer=servers_listing(dict(SERVER, engine="trtllm")))
    c["spark-a"].on(r"docker image inspect", 1, "", "No such image")
    c["spark-a"].on(r"nvidia-smi", answer=SparkctlError("spark-a: connection lost"))

    @contextmanager
    def open_session(inventory: Any, command: str, **kwargs: Any) -> Iterator[Any]:
        yield c.session(command)
    monkeypatch.setattr("orchestrator.core.session.open_session", open_session)

    result = sparkctl("bench", "-i", inv, "--tg", "8", "-c", "1", "--depth", "0", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["nodes_before"] == {"spark-a": {"error": "spark-a: connection lost"},
                                   "spark-b": {"error": "unreachable"}}
    # the image unknown: no digest
    assert doc["server"]["engine"] == "trtllm" and doc["server"]["image_digest"] is None
    # the server's container could not say its image: `up`'s image is named
    assert doc["server"]["image"] == make_inventory().container.image


def test_server_refuses_another_recipe_and_a_missing_server(inv: str, cluster: FakeCluster,
                                                            measured: Measured) -> None:
    result = sparkctl("bench", "-i", inv, "--server", "qwen3-235b")
    assert result.exit_code == 2  # a --server nobody runs is bad input, naming who runs
    assert "no server named 'qwen3-235b' runs (running: minimax-m2.7)" in result.stderr
    cluster["spark-a"].rules[0].answer = servers_listing(SERVER, alive=False)
    result = sparkctl("bench", "-i", inv)
    assert result.exit_code == 1 and "no model server is running" in result.stderr
    assert measured.calls == []


def test_save_keeps_the_document_and_the_table_is_printed(inv: str, cluster: FakeCluster,
                                                          measured: Measured, tmp_path: Path) -> None:
    result = sparkctl("bench", "-i", inv, "--tg", "64,128", "-c", "1,4", "--pp", "256",
                      "--depth", "0,1024", "--save", str(tmp_path / "runs"))
    assert result.exit_code == 0, result.output
    (saved,) = (tmp_path / "runs").glob("bench-*.json")
    assert f"[bench] saved {saved}" in result.stderr
    doc = json.loads(saved.read_text())
    assert doc["ok"] is True and len(doc["cells"]) == 8 and doc["server"]["recipe"] == "minimax-m2.7"
    out = result.stdout
    assert "nvidia/MiniMax-M2.7-NVFP4 - recipe minimax-m2.7 (config abc123), engine vllm" in out
    assert "peak burst: 96.0 t/s at c4" in out and "speculative decoding: no draft model" in out
    assert "tg64 (t/s)" in out and "80.0 (40.0/req)" in out  # c4: 4 x 20 t/s, half per request
    assert "pp256, depth 1,024" in out and "3,000 t/s, TTFT 250 ms" in out
    assert "0.50 / 2.00" in out  # acceptance at c1
    assert "2,405 MHz" in out and "61 C" in out and "95.4 / 122.1 GB" in out


def test_compare_two_saved_runs(inv: str, cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch,
                                tmp_path: Path) -> None:
    monkeypatch.setattr(bench_run, "run_bench", Measured(rates=[20.0, 30.0]))
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    for path in (first, second):
        result = sparkctl("bench", "-i", inv, "--tg", "64", "-c", "1", "--depth", "0", "--json")
        path.write_text(result.stdout)

    result = sparkctl("bench", "compare", str(first), str(second), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["command"] == "bench compare" and doc["a"] == str(first)
    rows = {(r["cell"], r["figure"]): r for r in doc["rows"]}
    assert rows[("pp2048 tg64 d0 c1", "t/s")] == {"cell": "pp2048 tg64 d0 c1", "figure": "t/s",
                                                  "a": "20.0", "b": "30.0", "ratio": "1.50x"}
    assert rows[("whole run", "acceptance rate")]["ratio"] == "1.00x"

    table = sparkctl("bench", "compare", str(first), str(second))
    assert table.exit_code == 0
    flat = " ".join(table.stdout.split())
    assert f"A: {first}: minimax-m2.7 config abc123" in flat and "1.50x" in flat


def test_compare_refuses_what_is_not_a_bench_result(tmp_path: Path) -> None:
    good, bad, other = tmp_path / "good.json", tmp_path / "bad.json", tmp_path / "other.json"
    good.write_text(json.dumps({"cells": []}))
    bad.write_text("{nope")
    other.write_text(json.dumps({"command": "status"}))
    result = sparkctl("bench", "compare", str(good), str(bad))
    assert result.exit_code == 2 and f"{bad}: not JSON" in result.stderr
    result = sparkctl("bench", "compare", str(other), str(good))
    assert result.exit_code == 2 and f"{other}: not a `sparkctl bench` result (no cells)" in result.stderr
    result = sparkctl("bench", "compare", str(good), str(tmp_path / "missing.json"))
    assert result.exit_code == 2 and "does not exist" in result.stderr


def test_sweep_relaunches_each_value_measures_and_restores(inv: str, cluster: FakeCluster,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    monkeypatch.setattr(bench_run, "run_bench", Measured(rates=[10.0, 30.0, 20.0]))
    launched: list[str] = []
    seen: dict[str, Any] = {}

    def relauncher(inventory_path: str, timeout: float, server: Any = None,
                   key_file: Any = None) -> Any:
        seen.update(inventory=inventory_path, timeout=timeout, server=server, key_file=key_file)
        return lambda recipe: launched.append(str(recipe))
    monkeypatch.setattr(bench_cli, "relauncher", relauncher)

    plot = tmp_path / "sweep.png"
    result = sparkctl("bench", "-i", inv, "--tg", "32", "-c", "1", "--depth", "0", "--runs", "1",
                      "--sweep", "object_store_gb=1,2.5,4", "--timeout", "600", "--json",
                      "--plot", str(plot))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "sparkctl-bench-sweep/1" and doc["ok"] is True
    sweep = doc["sweep"]
    assert sweep["key"] == "ray.object_store_gb" and sweep["values"] == [1, 2.5, 4]
    assert sweep["best"] == 2.5 and sweep["restored"] is True and sweep["original"] == "minimax-m2.7"
    assert [r["value"] for r in sweep["runs"]] == [1, 2.5, 4]
    assert [Path(p).name for p in launched[:3]] == [
        "minimax-m2.7-ray.object_store_gb-1.yml", "minimax-m2.7-ray.object_store_gb-2.5.yml",
        "minimax-m2.7-ray.object_store_gb-4.yml"]
    assert launched[3] == "minimax-m2.7"  # the original put back
    assert seen["timeout"] == 600.0 and Path(seen["inventory"]).resolve() == Path(inv).resolve()
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the table of the same sweep, with an explicit recipe to vary
    monkeypatch.setattr(bench_run, "run_bench", Measured(rates=[10.0, 30.0]))
    launched.clear()
    result = sparkctl("bench", "-i", inv, "--tg", "32", "-c", "1", "--depth", "0",
                      "--sweep", "ray.join_timeout=60,90", "--recipe", "gpt-oss-120b-vllm")
    assert result.exit_code == 0, result.output
    flat = " ".join(result.stdout.split())
    assert "best: 90 (highest generation throughput" in flat
    assert "original recipe restored: True" in flat and "90 *best*" in flat
    assert launched[-1] == "gpt-oss-120b-vllm"


def test_a_bad_sweep_is_bad_input_before_anything_is_relaunched(inv: str, cluster: FakeCluster,
                                                                measured: Measured,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_cli, "relauncher", lambda *a: pytest.fail("relaunched"))
    result = sparkctl("bench", "-i", inv, "--sweep", "no_such_key=1,2")
    assert result.exit_code == 2 and "--sweep no_such_key: the recipe has no such key" in result.stderr
    result = sparkctl("bench", "-i", inv, "--sweep", "ray.port=1,2")  # below Ray's lowest port
    assert result.exit_code == 2 and "port" in result.stderr


def test_a_failing_output_step_never_loses_the_results(inv: str, cluster: FakeCluster,
                                                     measured: Measured, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The results come out first; a --save or --plot that fails afterwards (a disk filled
    during the run, a plotting error) is said, exits 1, and the figures stay."""
    from orchestrator.bench import plot as bench_plot

    def broken_plot(doc: Any, path: str) -> list[str]:
        raise RuntimeError("no space left on device")
    monkeypatch.setattr(bench_plot, "plot", broken_plot)
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", object())  # the option's check
    args = ["bench", "-i", inv, "--tg", "8", "-c", "1", "--depth", "0"]
    result = sparkctl(*args, "--json", "--plot", str(tmp_path / "p.png"))
    assert result.exit_code == 1
    assert json.loads(result.stdout)["ok"] is True  # the whole document, before the plot failed
    assert "[bench] could not draw" in result.stderr and "no space left on device" in result.stderr
    # the table only: the JSON is kept in a spare file, and the user is told where
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    result = sparkctl(*args, "--plot", str(tmp_path / "p.png"))
    assert result.exit_code == 1 and "tg8 (t/s)" in result.stdout
    (spare,) = tmp_path.glob("sparkctl-bench-*.json")
    assert f"[bench] the results are kept in {spare}" in result.stderr
    assert json.loads(spare.read_text())["cells"]
    # --save into a folder that became a file after the check: printed, then said
    monkeypatch.setattr(bench_cli, "check_outputs", lambda save, plot: None)
    (tmp_path / "runs").write_text("")
    result = sparkctl(*args, "--json", "--save", str(tmp_path / "runs"))
    assert result.exit_code == 1 and json.loads(result.stdout)["cells"]
    assert "[bench] could not save" in result.stderr


def test_plot_without_matplotlib_is_bad_input(inv: str, monkeypatch: pytest.MonkeyPatch,
                                              measured: Measured) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    result = sparkctl("bench", "-i", inv, "--plot", "x.png")
    assert result.exit_code == 2 and "plots need matplotlib" in result.stderr


# ------------------------------------------------------------------ the relaunch of a sweep
class Proc:
    """Stands in for subprocess.Popen: answers (stdout, stderr) and a return code."""

    made: list[Proc] = []

    def __init__(self, argv: list[str], **kwargs: Any) -> None:
        self.argv, self.kwargs, self.pid = argv, kwargs, 4242
        self.answer: tuple[str, str] = ("{}", "")
        self.returncode = 0
        self.raise_once: BaseException | None = None
        Proc.made.append(self)
        self.setup(self)

    setup: Any = staticmethod(lambda proc: None)

    def communicate(self) -> tuple[str, str]:
        if self.raise_once is not None:
            exc, self.raise_once = self.raise_once, None
            raise exc
        return self.answer


@pytest.fixture
def popen(monkeypatch: pytest.MonkeyPatch) -> type[Proc]:
    import subprocess

    Proc.made = []
    monkeypatch.setattr(subprocess, "Popen", Proc)
    return Proc


def test_relaunch_runs_launch_replace_in_its_own_session(popen: type[Proc]) -> None:
    import sys

    bench_cli.relauncher("/inv.yml", 900.0)("/tmp/variant.yml")
    (proc,) = popen.made
    assert proc.argv == [sys.executable, "-m", "orchestrator.cli", "launch", "/tmp/variant.yml",
                         "--inventory", "/inv.yml", "--replace", "--yes", "--json", "--timeout", "900.0"]
    assert proc.kwargs["start_new_session"] is True and proc.kwargs["text"] is True


def test_a_sweep_relaunches_exactly_the_measured_server(popen: type[Proc]) -> None:
    (server,) = as_servers([{"name": "mine", "nodes": ["spark-b"], "port": 30001,
                             "recipe": "qwen3.6-27b", "engine": "sglang"}], "spark-b")
    bench_cli.relauncher("/inv.yml", 60, server)("/tmp/variant.yml")
    (proc,) = popen.made
    assert proc.argv[-6:] == ["--name", "mine", "--nodes", "spark-b", "--port", "30001"]


def test_a_sweep_relaunches_a_server_with_its_key_where_it_binds(popen: type[Proc],
                                                                 tmp_path: Path) -> None:
    from conftest import FakeTransport

    from orchestrator.engines.apikey import key_copy

    (server,) = as_servers([{"name": "mine", "nodes": ["spark-b"], "port": 30001,
                             "host": "192.168.200.13", "engine": "sglang",
                             "api_key_file": "/var/lib/sparkctl/run/servers/mine/api_key"}])
    transport = FakeTransport("spark-b").on("cat ", stdout="sk-sweep-sentinel-1\n")
    copy = key_copy(transport, server.record, tmp_path)
    assert copy is not None and Path(copy).read_text() == "sk-sweep-sentinel-1\n"
    assert Path(copy).stat().st_mode & 0o777 == 0o600
    assert key_copy(transport, replace(server.record, api_key_file=None), tmp_path) is None
    bench_cli.relauncher("/inv.yml", 60, server, copy)("/tmp/variant.yml")
    (proc,) = popen.made
    assert proc.argv[-4:] == ["--host", "192.168.200.13", "--api-key-file", copy]
    assert "sk-sweep-sentinel-1" not in " ".join(proc.argv)


def test_a_failed_relaunch_says_why(popen: type[Proc], monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(proc: Proc) -> None:
        proc.returncode = 1
        proc.answer = (json.dumps({"ok": False, "error": "vllm serve exited at once"}), "noise")
    monkeypatch.setattr(Proc, "setup", staticmethod(fails))
    with pytest.raises(SparkctlError, match=r"launch r\.yml failed \(exit 1\): vllm serve exited at once"):
        bench_cli.relauncher("/inv.yml", 60)("r.yml")

    def crashes(proc: Proc) -> None:
        proc.returncode = 2
        proc.answer = ("Traceback (not JSON)", "x" * 1000 + " ImportError: no module")
    monkeypatch.setattr(Proc, "setup", staticmethod(crashes))
    with pytest.raises(SparkctlError) as err:
        bench_cli.relauncher("/inv.yml", 60)("r.yml")
    message = str(err.value)
    assert message.endswith("ImportError: no module") and len(message) < 850


def test_ctrl_c_during_a_relaunch_interrupts_the_launch_too(popen: type[Proc],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    killed: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pid, sig: killed.append((pid, sig)))
    monkeypatch.setattr(Proc, "setup", staticmethod(
        lambda proc: setattr(proc, "raise_once", KeyboardInterrupt())))
    with pytest.raises(KeyboardInterrupt):
        bench_cli.relauncher("/inv.yml", 60)("r.yml")
    assert killed == [(4242, signal.SIGINT)]


def test_default_is_quick_and_md_is_llama_benchys_table(inv: str, cluster: FakeCluster,
                                                        measured: Measured) -> None:
    result = sparkctl("bench", "-i", inv, "--format", "md")
    assert result.exit_code == 0, result.output
    ((config, _),) = measured.calls
    assert (config.tg, config.pp, config.depth, config.concurrency, config.runs) == (
        [32], [2048], [0], [1], 3)
    assert "1 cell(s), 4 request(s): expect about" in result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "| model | test | t/s | ttfr (ms) | est_ppt (ms) | e2e_ttft (ms) |"
    assert lines[2].startswith("| nvidia/MiniMax-M2.7-NVFP4 | pp2048 | ")
    assert lines[3].startswith("| nvidia/MiniMax-M2.7-NVFP4 | tg32 | 20.00 ± ")


def test_full_runs_the_blog_table(inv: str, cluster: FakeCluster, measured: Measured) -> None:
    result = sparkctl("bench", "-i", inv, "--full", "--format", "csv")
    assert result.exit_code == 0, result.output
    ((config, _),) = measured.calls
    assert config.requests() == 208 and "12 cell(s), 208 request(s)" in result.stderr
    assert "tg256 @ d16384 c8" in result.stdout


def test_an_unwritable_plot_path_stops_before_measuring(inv: str, cluster: FakeCluster,
                                                        measured: Measured, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    result = sparkctl("bench", "-i", inv, "--plot", str(tmp_path / "missing" / "p.png"))
    assert result.exit_code == 2 and "does not exist" in result.stderr
    assert measured.calls == []
