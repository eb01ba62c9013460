"""`sparkctl bench` on the simulated lab: every figure, the lab's performance model, a sweep.

One `up` and one `launch qwen3-235b` for the module; small token counts keep each bench well
under a minute (the simulated server paces at the modelled rate, no time scaling).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, Lab, Sparkctl, e2e_state, fresh_up

pytestmark = pytest.mark.lab

SPARKCTL = [sys.executable, "-m", "orchestrator.cli"]
MODEL = "nvidia/Qwen3-235B-A22B-FP4"
STATE = e2e_state("bench")


sparkctl = Sparkctl("bench", token="hf_e2eBenchToken", argv=SPARKCTL)


def model_rate(draft_len: int, batch: int = 1) -> float:
    sys.path.insert(0, str(REPO / "lab" / "sparklab" / "image"))
    from sparklab_engine import perf_model

    return perf_model.decode_rate(MODEL, tp=2, draft_len=draft_len, batch=batch)


@pytest.fixture(scope="module")
def served(lab_session: list[Lab]) -> Iterator[Lab]:
    # start from no server at all: an earlier module on this lab may have left one serving
    lab = fresh_up(lab_session, sparkctl)
    launch = sparkctl("launch", "qwen3-235b", "--inventory", str(lab.inventory), "--yes",
                      "--replace", "--timeout", "180")
    assert launch.returncode == 0, launch.stdout + launch.stderr
    yield lab
    lab.exec(lab.nodes[0], "docker exec trtllm-multinode sh -c "
             "'kill $(cat /var/lib/sparkctl/run/servers/qwen3-235b/mpirun.pid)'", check=False)


def server_json(lab: Lab) -> dict[str, object]:
    out = lab.exec(lab.nodes[0], "cat /var/lib/sparkctl/run/servers/qwen3-235b/server.json").stdout
    return dict(json.loads(out))


def test_bench_json_reports_every_figure_and_matches_the_model(served: Lab) -> None:
    result = sparkctl("bench", "--inventory", str(served.inventory), "--json", "--tg", "64",
                      "--pp", "256", "--depth", "0,128", "-c", "1,2", "--runs", "2", "--no-warmup")
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert doc["ok"] and not doc["interrupted"] and len(doc["cells"]) == 4
    assert "requests left" in result.stderr  # progress on stderr
    server = doc["server"]
    assert server["recipe"] == "qwen3-235b" and server["engine"] == "trtllm"
    assert server["config_hash"] == server_json(served)["config_hash"]
    assert str(server["image_digest"]).startswith("sha256:")
    for cell in doc["cells"]:
        for name in ("tg_throughput", "tg_req_throughput", "peak_throughput", "pp_throughput",
                     "pp_req_throughput", "ttfr_ms", "est_ppt_ms", "e2e_ttft_ms", "ttft_ms"):
            assert cell["figures"][name]["mean"] > 0, (name, cell)
        spec = cell["spec_decoding"]
        assert spec and 0 < spec["acceptance_rate"] < 1 and 1 < spec["acceptance_length"] <= 4
        for node in served.nodes:
            state = cell["nodes"][node]
            assert state["sm_clock_mhz"] > 0 and state["temperature_c"] > 0
            assert state["power_w"] > 0 and state["memory_used_gb"] > 0
    assert set(doc["definitions"]) >= {"tg_throughput", "pp_throughput", "acceptance_length"}
    c1 = next(c for c in doc["cells"] if c["concurrency"] == 1 and c["depth"] == 0)
    predicted = model_rate(draft_len=3)
    measured = c1["figures"]["tg_throughput"]["mean"]
    assert abs(measured - predicted) / predicted < 0.10, (measured, predicted)
    c2 = next(c for c in doc["cells"] if c["concurrency"] == 2 and c["depth"] == 0)
    assert c2["figures"]["tg_throughput"]["mean"] > 1.3 * measured  # batching helps, sub-linearly
    assert c2["figures"]["tg_req_throughput"]["mean"] < measured


def test_bench_md_is_llama_benchys_table_at_every_depth(served: Lab) -> None:
    result = sparkctl("bench", "--inventory", str(served.inventory), "--format", "md", "--pp", "512",
                      "--tg", "32", "--depth", "0,1024", "-c", "1", "--runs", "2", "--no-warmup")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 cell(s), 4 request(s): expect about" in result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "| model | test | t/s | ttfr (ms) | est_ppt (ms) | e2e_ttft (ms) |"
    rows = {line.split(" | ")[1]: line.split(" | ")[2:] for line in lines[2:] if line.startswith("| ")}
    assert list(rows) == ["pp512", "tg32", "pp512 @ d1024", "tg32 @ d1024"]
    for test, values in rows.items():
        assert " ± " in values[0], (test, values)
        assert (" ± " in values[1]) == test.startswith("pp"), (test, values)  # latency on pp rows


def test_sweep_relaunches_finds_a_best_below_the_largest_and_restores(served: Lab, tmp_path: Path) -> None:
    original = server_json(served)["config_hash"]
    plot = tmp_path / "sweep.png"
    result = sparkctl("bench", "--inventory", str(served.inventory), "--sweep",
                      "speculative.max_draft_len=1,2,4,8", "--tg", "64", "--pp", "16", "--depth",
                      "0", "-c", "1", "--runs", "1", "--no-warmup", "--json", "--plot", str(plot),
                      "--save", str(tmp_path), "--timeout", "180", timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    sweep = json.loads(result.stdout)["sweep"]
    assert [r["value"] for r in sweep["runs"]] == [1, 2, 4, 8]
    lengths = {r["value"]: r["cells"][0]["spec_decoding"]["acceptance_length"] for r in sweep["runs"]}
    assert lengths[1] <= 2.0 < lengths[8]  # each value really served
    assert sweep["best"] != 8 and sweep["restored"]
    assert len({r["server"]["config_hash"] for r in sweep["runs"]}) == 4
    assert server_json(served)["config_hash"] == original
    from PIL import Image

    with Image.open(plot) as image:
        assert image.format == "PNG" and image.size[0] > 600 and image.size[1] > 300
    assert list(tmp_path.glob("bench-*.json"))


def test_ctrl_c_stops_the_bench_not_the_server(served: Lab) -> None:
    env = {**os.environ, "SPARKCTL_STATE_DIR": STATE}
    proc = subprocess.Popen([*SPARKCTL, "bench", "--inventory", str(served.inventory), "--tg",
                             "256", "--pp", "16", "--depth", "0", "-c", "1", "--runs", "5"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=REPO)
    time.sleep(10)  # connected and measuring (each request takes ~5 s)
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    chat = sparkctl("chat", "hello", "--inventory", str(served.inventory), "--max-tokens", "4")
    assert chat.returncode == 0, chat.stdout + chat.stderr
