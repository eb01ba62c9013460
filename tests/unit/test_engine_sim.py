"""The lab's simulated TensorRT-LLM tools (lab/sparklab/image), run without root on loopback."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

IMAGE = Path(__file__).resolve().parents[2] / "lab" / "sparklab" / "image"
BIN = IMAGE / "bin"
sys.path.insert(0, str(IMAGE))

from sparklab_engine import llm_args  # noqa: E402

MODEL = "nvidia/Qwen3-235B-A22B-FP4"
DRAFT = "nvidia/Qwen3-235B-A22B-Eagle3"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def lab(tmp_path: Path) -> dict[str, str]:
    """Environment of one simulated node: lab config dir, HF cache, outbox, hostfile."""
    (tmp_path / "lab" / "config").mkdir(parents=True)
    (tmp_path / "lab" / "faults").mkdir()
    (tmp_path / "outbox").mkdir()
    (tmp_path / "lab" / "config" / "lab.json").write_text(
        json.dumps({"engine_load_seconds": 0.5, "model_bytes": 50_000, "node": "spark-a"}))
    (tmp_path / "hostfile").write_text("127.0.0.1 slots=1\n127.0.0.1\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "OMPI_", "NCCL_", "SPARKLAB_"))}
    env.update(SPARKLAB_LAB_DIR=str(tmp_path / "lab"), HF_HOME=str(tmp_path / "hf"),
               SPARKLAB_OUTBOX=str(tmp_path / "outbox"), NCCL_SOCKET_IFNAME="lo",
               OMPI_MCA_orte_default_hostfile=str(tmp_path / "hostfile"),
               SPARKLAB_RDZV_PORT=str(free_port()), SPARKLAB_RDZV_TIMEOUT="60",
               PATH=f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}")
    return env


def run(tool: str, *args: str, env: dict[str, str], **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BIN / tool), *args], env=env,
                          capture_output=True, text=True, timeout=60, **kw)


def hf_download(env: dict[str, str], repo: str, *extra: str) -> subprocess.CompletedProcess:
    return run("hf", "download", repo, *extra, env={**env, "HF_TOKEN": "hf_unit_test"})


# ------------------------------------------------------------------ hf download
def test_hf_download_writes_the_hf_cache_layout(lab: dict[str, str]) -> None:
    res = hf_download(lab, MODEL)
    assert res.returncode == 0, res.stderr
    snap = Path(res.stdout.strip())
    repo_dir = Path(lab["HF_HOME"]) / "hub" / "models--nvidia--Qwen3-235B-A22B-FP4"
    assert snap.parent == repo_dir / "snapshots"
    assert (repo_dir / "refs" / "main").read_text() == snap.name
    shards = sorted(snap.glob("*.safetensors"))
    assert shards and all(p.is_symlink() for p in snap.iterdir())
    assert all(p.resolve().parent == repo_dir / "blobs" for p in shards)
    assert sum(p.stat().st_size for p in shards) == 50_000
    assert json.loads((snap / "config.json").read_text())["_name_or_path"] == MODEL
    assert "hf_unit_test" not in res.stdout + res.stderr
    log = (Path(lab["SPARKLAB_OUTBOX"]) / "hf-downloads.log").read_text().splitlines()
    assert [json.loads(line)["repo"] for line in log] == [MODEL]
    assert "hf_unit_test" not in "".join(log)


def test_hf_download_is_byte_identical_across_nodes_and_logs_only_real_transfers(
        lab: dict[str, str], tmp_path: Path) -> None:
    first = Path(hf_download(lab, MODEL).stdout.strip())
    other = {**lab, "HF_HOME": str(tmp_path / "hf-other")}
    second = Path(hf_download(other, MODEL).stdout.strip())
    assert first.name == second.name
    for path in first.iterdir():
        assert path.read_bytes() == (second / path.name).read_bytes()
    hf_download(lab, MODEL)  # cached: nothing fetched
    log = (Path(lab["SPARKLAB_OUTBOX"]) / "hf-downloads.log").read_text().splitlines()
    assert len(log) == 2


def test_gpt_oss_holds_other_formats_and_the_recipes_patterns_leave_them(
        lab: dict[str, str]) -> None:
    from orchestrator.engines import load_recipe

    # as on the Hub: original/ and metal/ are each as large as the weights, in folders whose
    # snapshot links go three levels up to the blobs
    whole = Path(hf_download(lab, "openai/gpt-oss-120b").stdout.strip())
    blobs = Path(lab["HF_HOME"]) / "hub" / "models--openai--gpt-oss-120b" / "blobs"
    for name in ("original/model.safetensors", "metal/model.bin"):
        assert (whole / name).is_symlink() and (whole / name).resolve().parent == blobs
        assert str(Path(os.readlink(whole / name)).parent) == "../../../blobs"
        assert (whole / name).stat().st_size == 50_000
    assert sum(p.stat().st_size for p in blobs.iterdir()) > 3 * 50_000
    for name in ("gpt-oss-120b", "gpt-oss-120b-vllm"):
        recipe = load_recipe(name)
        allow, deny = recipe.file_patterns(recipe.model)
        other = {**lab, "HF_HOME": str(Path(lab["HF_HOME"]).parent / f"hf-{name}")}
        args = [a for p in allow for a in ("--include", p)] + [a for p in deny for a in ("--exclude", p)]
        snap = Path(hf_download(other, recipe.model, *args).stdout.strip())
        names = sorted(str(p.relative_to(snap)) for p in snap.rglob("*") if not p.is_dir())
        assert "config.json" in names and "model.safetensors.index.json" in names, name
        assert not any(n.startswith(("original/", "metal/")) for n in names), (name, names)
        assert sum((snap / n).stat().st_size for n in names if n.endswith(".safetensors")) == 50_000


def test_hf_download_to_local_dir(lab: dict[str, str], tmp_path: Path) -> None:
    res = hf_download(lab, DRAFT, "--local-dir", str(tmp_path / "draft"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(tmp_path / "draft")
    assert (tmp_path / "draft" / "config.json").is_file()


@pytest.mark.parametrize(("repo", "env_extra", "expected"), [
    (MODEL, {}, "401 Client Error"),
    ("nobody/no-such-model", {"HF_TOKEN": "hf_x"}, "Repository Not Found"),
    (MODEL, {"HF_TOKEN": "hf_x", "HF_HUB_OFFLINE": "1"}, "outgoing traffic has been disabled"),
])
def test_hf_download_failures(lab: dict[str, str], repo: str, env_extra: dict[str, str],
                              expected: str) -> None:
    res = run("hf", "download", repo, env={**lab, **env_extra})
    assert res.returncode == 1
    assert expected in res.stderr
    assert not (Path(lab["HF_HOME"]) / "hub" / "models--nobody--no-such-model").exists()


def test_hf_token_from_token_file(lab: dict[str, str]) -> None:
    Path(lab["HF_HOME"]).mkdir()
    (Path(lab["HF_HOME"]) / "token").write_text("hf_from_file\n")
    assert run("hf", "download", MODEL, env=lab).returncode == 0


# ------------------------------------------------------------------ option validation
def eagle(**spec: object) -> dict:
    return {"speculative_config": {"decoding_type": "Eagle", **spec}}


def test_playbook_options_are_valid() -> None:
    options = {"enable_attention_dp": False, "disable_overlap_scheduler": False,
               "enable_autotuner": False, "enable_chunked_prefill": False,
               "cuda_graph_config": {"max_batch_size": 1},
               "kv_cache_config": {"free_gpu_memory_fraction": 0.9, "enable_block_reuse": False},
               **eagle(max_draft_len=3, speculative_model_dir="/opt/draft/")}
    assert llm_args.validate(options) == options


@pytest.mark.parametrize(("options", "message"), [
    ({"enable_attention_dpp": False}, "Extra inputs are not permitted"),
    ({"kv_cache_config": {"free_gpu_mem": 0.9}}, "kv_cache_config.free_gpu_mem"),
    # Field(ge=0, le=1): pydantic's constraint speaks before the field validator
    ({"kv_cache_config": {"free_gpu_memory_fraction": 1.5}}, "less than or equal to 1"),
    # removed before 1.3.0rc13: refused like any unknown key (sparkctl's own check names the successor)
    ({"use_cuda_graph": True}, "use_cuda_graph\n  Extra inputs are not permitted"),
    ({"kv_cache_dtype": "fp8"}, "Extra inputs are not permitted"),
    ({"speculative_config": {"decoding_type": "DraftTarget"}}, "Invalid decoding type: DraftTarget"),
    ({"max_num_tokens": "many"}, "valid int"),
    (eagle(max_draft_len=3), "Draft model must be provided for EAGLE"),
    (eagle(max_draft_len=0, speculative_model_dir="/d"), "max_draft_len must be > 0"),
    (eagle(max_draft_len=3, speculative_model_dir="/d", draft_len=2), "draft_len"),
    ({"speculative_config": {"decoding_type": "Medusa3"}}, "Invalid decoding type: Medusa3"),
])
def test_invalid_options_fail_like_trtllm(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        llm_args.validate(options)


def test_speculative_model_is_an_alias_of_speculative_model_dir() -> None:
    llm_args.validate(eagle(max_draft_len=3, speculative_model=DRAFT))


# ------------------------------------------------------------------ trtllm-serve CLI errors
@pytest.mark.parametrize(("args", "message"), [
    (["--tp_size", "2"], "Missing argument 'MODEL'"),
    ([MODEL, "--tensor_parallel", "2"], "No such option: --tensor_parallel"),
    ([MODEL, "--port", "http"], "'http' is not a valid integer"),
])
def test_serve_usage_errors_exit_2(lab: dict[str, str], args: list[str], message: str) -> None:
    res = run("trtllm-serve", *args, env=lab)
    assert res.returncode == 2
    assert message in res.stderr and "Usage: trtllm-serve" in res.stderr


def test_serve_rejects_tp_size_other_than_world_size(lab: dict[str, str]) -> None:
    res = run("trtllm-serve", MODEL, "--tp_size", "1",
              env={**lab, "SPARKLAB_LAUNCH_WORLD_SIZE": "2"})
    assert res.returncode == 1
    assert "n_workers must be equal to the number of processes in MPI" in res.stderr


def test_serve_fails_offline_without_the_model(lab: dict[str, str]) -> None:
    res = run("trtllm-serve", MODEL, "--port", str(free_port()),
              env={**lab, "HF_HUB_OFFLINE": "1"})
    assert res.returncode == 1
    assert "LocalEntryNotFoundError" in res.stderr


# ------------------------------------------------------------------ two ranks on loopback
class Cluster:
    def __init__(self, lab: dict[str, str], worker_env: dict[str, str], args: list[str]) -> None:
        self.port = free_port()
        self.procs = []
        for rank, env in ((1, worker_env), (0, lab)):
            env = {**env, "OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": "2"}
            self.procs.append(subprocess.Popen(
                [sys.executable, str(BIN / "trtllm-llmapi-launch"), "trtllm-serve", *args,
                 "--port", str(self.port)], env=env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True))
        self.worker, self.leader = self.procs

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except OSError:
            return 0, b""

    def post(self, path: str, body: dict) -> bytes:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.read()

    def wait_health(self, want: int) -> None:
        deadline = time.monotonic() + 60
        while self.get("/health")[0] != want:
            assert self.leader.poll() is None, self.leader.communicate()[0]
            assert time.monotonic() < deadline, f"/health never returned {want}"
            time.sleep(0.1)

    def stop(self) -> str:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        return "".join(proc.communicate(timeout=30)[0] for proc in self.procs)


@pytest.fixture
def served(lab: dict[str, str], tmp_path: Path) -> Iterator[Cluster]:
    hf_download(lab, MODEL)
    hf_download(lab, DRAFT, "--local-dir", str(tmp_path / "draft"))
    options = tmp_path / "extra.yml"
    options.write_text("enable_iter_perf_stats: true\nspeculative_config:\n  decoding_type: "
                       f"Eagle\n  max_draft_len: 3\n  speculative_model_dir: {tmp_path}/draft\n")
    cluster = Cluster(lab, lab, [MODEL, "--tp_size", "2", "--backend", "pytorch",
                                 "--extra_llm_api_options", str(options)])
    yield cluster
    cluster.stop()


def test_two_ranks_serve_after_loading(served: Cluster) -> None:
    served.wait_health(200)
    assert served.get("/health_generate")[0] == 200
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Paris is great because"}],
            "max_tokens": 12}
    first = json.loads(served.post("/v1/chat/completions", body))
    again = json.loads(served.post("/v1/chat/completions", body))
    assert first["choices"][0]["message"]["content"] == again["choices"][0]["message"]["content"]
    assert first["usage"]["completion_tokens"] == 12
    models = json.loads(served.get("/v1/models")[1])
    assert models["data"][0]["id"] == MODEL
    stream = served.post("/v1/completions", {"prompt": "hi", "max_tokens": 4, "stream": True})
    events = [e for e in stream.decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    metrics = json.loads(served.get("/metrics")[1])
    assert metrics and all("specDecodingStats" in m for m in metrics)
    assert json.loads(served.get("/metrics")[1]) == []  # drained
    log = served.stop()
    assert "NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>" in log
    assert "Application startup complete." in log


def test_rank_die_fault_makes_rank_0_unhealthy(served: Cluster, lab: dict[str, str]) -> None:
    served.wait_health(200)
    (Path(lab["SPARKLAB_LAB_DIR"]) / "faults" / "rank-die").touch()
    served.wait_health(503)
    assert served.get("/health_generate")[0] == 503
    assert "Executor worker failed" in served.stop()


def test_model_missing_on_another_rank_fails_startup(lab: dict[str, str],
                                                     tmp_path: Path) -> None:
    hf_download(lab, MODEL)
    worker_env = {**lab, "HF_HOME": str(tmp_path / "empty-cache")}
    cluster = Cluster(lab, worker_env, [MODEL, "--tp_size", "2"])
    try:
        assert cluster.leader.wait(timeout=60) == 1
    finally:
        log = cluster.stop()
    assert "rank 1" in log and f"model {MODEL}" in log


def test_missing_nccl_interface_fails_like_nccl(lab: dict[str, str]) -> None:
    hf_download(lab, MODEL)
    env = {**lab, "NCCL_SOCKET_IFNAME": "sparklab9-none", "SPARKLAB_LAUNCH_WORLD_SIZE": "2"}
    res = run("trtllm-serve", MODEL, "--tp_size", "2", "--port", str(free_port()), env=env)
    assert res.returncode == 1
    assert "NCCL WARN Bootstrap : no socket interface found" in res.stderr
    assert "RuntimeError: NCCL error" in res.stderr


def test_rank_0_that_cannot_reach_a_ranks_bootstrap_address_fails_like_nccl(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL's root connects back to each rank's bootstrap listener: a rank listening on a link
    rank 0 has no route to (a ring's other neighbour) fails the bootstrap, naming it."""
    from sparklab_engine import rendezvous
    from sparklab_engine.common import NcclError

    monkeypatch.setattr(rendezvous, "CONNECT_BACK_SECONDS", 0.5)
    peer = rendezvous.Peer.__new__(rendezvous.Peer)
    peer.rank, peer.host, peer.ifname = 1, "spark-b", "enp1s0f1np1"
    port = free_port()  # nothing listens there: refused, as an unrouted address times out
    with pytest.raises(NcclError, match=r"rank 0 could not reach rank 1 \(spark-b\) at its "
                                         rf"bootstrap address 127.0.0.1:{port} on enp1s0f1np1"):
        rendezvous.connect_back(peer, ("127.0.0.1", port))
