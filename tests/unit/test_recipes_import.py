"""`sparkctl recipes import`: sparkrun and eugr recipes (our own fixtures in their formats, in
tests/unit/foreign_recipes/) become sparkctl recipes that load, list, show and complete by name;
what cannot be carried over is refused with exit 2, never a traceback."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from orchestrator.cli import cli

FIXTURES = Path(__file__).with_name("foreign_recipes")


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def user_dir() -> Path:
    return Path(os.environ["XDG_CONFIG_HOME"]) / "sparkctl" / "recipes"


def imported(fixture: str, *extra: str) -> dict[str, Any]:
    """Import a fixture into the user recipe folder; the written recipe's fields."""
    result = run("recipes", "import", str(FIXTURES / fixture), *extra)
    assert result.exit_code == 0, result.output
    name = Path(fixture).stem
    text = (user_dir() / f"{name}.yml").read_text()
    assert text.startswith(f"# Imported by `sparkctl recipes import` from {(FIXTURES / fixture).resolve()}")
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def refused(path: Path, *extra: str) -> str:
    result = run("recipes", "import", str(path), *extra)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    assert not user_dir().exists() or not list(user_dir().iterdir()), "nothing is written"
    return result.output


def write(tmp_path: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_sparkrun_vllm_one_node_keeps_flags_env_and_memory() -> None:
    data = imported("sparkrun-vllm-solo.yaml")
    assert data["engine"] == "vllm" and data["model"] == "Qwen/Qwen3-8B"
    assert data["tensor_parallel_size"] == 1 and data["port"] == 8001
    assert data["memory"] == {"weights_gb": 16.0, "kv_cache_fraction": 0.5}
    assert data["image"] == "scitrera/dgx-spark-vllm:0.31.0-t5"
    # a valid --no- form is never refused; underscores are vLLM's own spelling too
    assert "--no-enable-flashinfer-autotune" in data["serve_args"]
    assert data["serve_args"][:4] == ["--served-model-name", "qwen3-8b", "--max_model_len", "32768"]
    assert "--host" not in data["serve_args"] and data["env"] == {"VLLM_MARLIN_USE_ATOMIC_ADD": "1"}


def test_sparkrun_sglang_abbreviation_becomes_the_typed_field() -> None:
    data = imported("sparkrun-sglang-solo.yaml")
    assert data["engine"] == "sglang" and data["tp_size"] == 1 and data["trust_remote_code"]
    # from --speculative-algo (an abbreviation); eagle_topk too, without which 0.5.12 cannot start
    assert data["speculative"] == {"algorithm": "NEXTN", "num_steps": 3, "eagle_topk": 1}
    assert data["memory"] == {"weights_gb": 8.2, "kv_cache_fraction": 0.4}  # metadata.model_vram
    assert data["serve_args"] == ["--served-model-name", "qwen3-4b", "--reasoning-parser", "qwen3"]


def test_sparkrun_llamacpp_names_the_gguf_and_its_offload() -> None:
    data = imported("sparkrun-llamacpp-solo.yaml")
    assert (data["engine"], data["model"], data["gguf"]) == (
        "llamacpp", "Qwen/Qwen3-4B-GGUF", "Qwen3-4B-Q8_0.gguf")
    assert (data["gpu_layers"], data["ctx_size"], data["port"]) == (99, 16384, 8081)
    assert data["serve_args"] == ["--flash-attn", "on", "--jinja", "--no-webui"]


def test_sparkrun_sglang_two_nodes() -> None:
    from orchestrator.engines import load_recipe

    data = imported("sparkrun-sglang-tp2.yaml")
    assert data["tp_size"] == 2 and "--context-length" in data["serve_args"]
    recipe = load_recipe("sparkrun-sglang-tp2")  # launched by name from the user folder
    assert recipe.node_count == 2 and recipe.memory.kv_cache_fraction == 0.75


def test_eugr_minimax_two_nodes_on_the_default_image_without_ray() -> None:
    result = run("recipes", "import", str(FIXTURES / "eugr-minimax-m2.7-tp2.yaml"))
    assert result.exit_code == 2 and "--weights-gb" in result.output  # no size anywhere
    data = imported("eugr-minimax-m2.7-tp2.yaml", "--weights-gb", "131")
    assert data["tensor_parallel_size"] == 2 and data["image"] == "nvcr.io/nvidia/vllm:26.10-py3"
    assert "executor" not in data  # ray on an image without Ray: vLLM's own multi-node
    # str.format's doubled braces are single again; the env's numbers are strings
    assert data["serve_args"][-2:] == ["--compilation-config", '{"cudagraph_mode":"none"}']
    assert data["env"] == {"VLLM_USE_FLASHINFER_MOE_FP4": "0", "OMP_NUM_THREADS": "8"}
    header = (user_dir() / "eugr-minimax-m2.7-tp2.yml").read_text()
    assert "container vllm-node: an image built locally" in header
    assert "--host 0.0.0.0: not carried over" in header


def test_eugr_four_nodes_keeps_json_in_env() -> None:
    data = imported("eugr-four-node.yaml")
    assert data["tensor_parallel_size"] == 4 and data["memory"]["weights_gb"] > 300
    assert data["env"]["VLLM_DISTRIBUTED_EXECUTOR_CONFIG"].startswith('{"placement_group')


def test_a_unique_abbreviation_is_the_flag_itself(tmp_path: Path) -> None:
    text = (FIXTURES / "sparkrun-vllm-solo.yaml").read_text().replace(
        "--no-enable-flashinfer-autotune", "--no-enable-flashinfer-autot --tensor-parallel 1")
    out = tmp_path / "r.yml"
    result = run("recipes", "import", str(write(tmp_path, text)), "-o", str(out))
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(out.read_text())
    assert "--no-enable-flashinfer-autot" in data["serve_args"]  # verbatim, as vLLM reads it
    assert "--tensor-parallel" not in data["serve_args"] and data["tensor_parallel_size"] == 1


def test_image_option_replaces_the_container(tmp_path: Path) -> None:
    out = tmp_path / "r.yml"
    result = run("recipes", "import", str(FIXTURES / "sparkrun-sglang-tp2.yaml"), "-o", str(out),
                 "--image", "scitrera/dgx-spark-sglang:0.5.12-b")
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(out.read_text())["image"] == "scitrera/dgx-spark-sglang:0.5.12-b"
    assert "replaced by scitrera/dgx-spark-sglang:0.5.12-b (--image)" in out.read_text()


def test_ray_kept_on_an_image_that_has_it(tmp_path: Path) -> None:
    text = (FIXTURES / "eugr-minimax-m2.7-tp2.yaml").read_text().replace(
        "container: vllm-node", "container: nvcr.io/nvidia/vllm:26.03-py3")
    out = tmp_path / "out" / "m.yml"
    result = run("recipes", "import", str(write(tmp_path, text)), "-o", str(out),
                 "--weights-gb", "131")
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(out.read_text())["executor"] == "ray"


@pytest.mark.parametrize(("flag", "named", "nearest"), [
    ("--max-model-lenn 4096", "--max-model-lenn", "--max-model-len"),
    ("--enable-flashinfer-autotunes", "--enable-flashinfer-autotunes", "--enable-flashinfer-autotune"),
    ("--max-num 8", "--max-num", None),  # argparse: ambiguous abbreviation
])
def test_an_invalid_flag_is_refused_naming_it(tmp_path: Path, flag: str, named: str,
                                             nearest: str | None) -> None:
    text = (FIXTURES / "sparkrun-vllm-solo.yaml").read_text().replace(
        "--trust-remote-code", f"--trust-remote-code {flag}")
    output = refused(write(tmp_path, text))
    assert named in output and "vLLM 0.31.0" in output
    if nearest:
        assert f"did you mean {nearest}?" in output
    else:
        assert "ambiguous option" in output


@pytest.mark.parametrize(("text", "said"), [
    ("model: [unclosed\n", "not valid YAML (line 2"),
    ("just a string\n", "a recipe is a YAML mapping"),
    ("name: x\nengine: vllm\nmodel: a/b\nmemory: {weights_gb: 1}\n", "neither a sparkrun recipe"),
    ("model: a/b\nruntime: atlas\ncommand: atlas serve a/b\n", "runtime 'atlas' is not one"),
    ("model: a/b\nruntime: vllm\ncommand: vllm serve a/b && echo done\n", "`&&` makes it a shell"),
    ("model: a/b\nruntime: vllm\ncontainer: x/y:1\n", "`command` is missing"),
    ("model: a/b\nruntime: sglang\ncommand: vllm serve a/b\n", "runtime 'sglang' but the command"),
    ("recipe_version: '1'\nname: x\ncontainer: x/y\ncommand: vllm serve a/b --port {port}\n",
     "placeholder {port} has no value"),
    ("recipe_version: '1'\nname: x\ncontainer: x/y\ncommand: vllm serve a/b {\n", "str.format"),
    ("recipe_version: '1'\nname: x\ncontainer: vllm-node\nmodel: a/b-8B\nmods: [mods/fix-x]\n"
     "command: vllm serve a/b-8B\n", "mods mods/fix-x"),
    ("model: a/b-8B\nruntime: vllm\npre_exec: [pip install x]\ncommand: vllm serve a/b-8B\n",
     "`pre_exec`"),
    ("model: a/b-8B\nruntime: vllm\nenv: {HF_TOKEN: hf_x}\ncommand: vllm serve a/b-8B\n",
     "env HF_TOKEN: a secret"),
    ("model: a/b-8B\nruntime: vllm\nenv: {A: $HOME}\ncommand: vllm serve a/b-8B\n",
     "env A: '$HOME' is expanded"),
    ("model: a/b-8B\nruntime: llama-cpp\ncommand: llama-server -m /models/x.gguf\n",
     "-m /models/x.gguf: a file on the node"),
    ("model: a/b-8B\nruntime: vllm\ncommand: vllm serve a/b-8B -tp 2 -pp 2\n"
     "container: nvcr.io/nvidia/vllm:26.10-py3\n", None),  # imports: 4 nodes
])
def test_what_cannot_be_imported_exits_2_naming_it(tmp_path: Path, text: str, said: str | None) -> None:
    path = write(tmp_path, text)
    if said is None:
        result = run("recipes", "import", str(path))
        assert result.exit_code == 0, result.output
        return
    output = refused(path)
    assert str(path) in output and said in output, output


def test_user_recipes_are_listed_marked_shown_and_completed(monkeypatch: pytest.MonkeyPatch) -> None:
    imported("sparkrun-sglang-solo.yaml")
    (user_dir() / "broken.yml").write_text("name: broken\nengine: vllm\n")
    listing = run("recipes", "list")
    assert listing.exit_code == 0, listing.output
    line = next(x for x in listing.output.splitlines() if x.startswith("sparkrun-sglang-solo"))
    assert "sglang" in line and line.endswith("user")
    assert "INVALID" in next(x for x in listing.output.splitlines() if x.startswith("broken"))
    builtin = next(x for x in listing.output.splitlines() if x.startswith("qwen3-8b "))
    assert not builtin.endswith("user")
    show = run("recipes", "show", "sparkrun-sglang-solo")
    assert show.exit_code == 0 and "# memory: per node 8.2 GB weights" in show.output
    monkeypatch.setenv("COMP_WORDS", "sparkctl launch sparkrun-sg")
    monkeypatch.setenv("COMP_CWORD", "2")
    monkeypatch.setenv("_SPARKCTL_COMPLETE", "bash_complete")
    assert CliRunner().invoke(cli, [], prog_name="sparkctl").output.splitlines() == [
        "plain,sparkrun-sglang-solo"]


def test_no_silent_overwrite_and_no_builtin_shadowing(tmp_path: Path) -> None:
    imported("sparkrun-sglang-solo.yaml")
    again = run("recipes", "import", str(FIXTURES / "sparkrun-sglang-solo.yaml"))
    assert again.exit_code == 2 and "exists; pass --force" in again.output
    assert run("recipes", "import", str(FIXTURES / "sparkrun-sglang-solo.yaml"),
               "--force").exit_code == 0
    clash = run("recipes", "import", str(FIXTURES / "sparkrun-sglang-solo.yaml"), "--name", "qwen3-8b")
    assert clash.exit_code == 2 and "built-in recipe's name" in clash.output


def test_parse_reads_argv_as_the_engine_parser_does() -> None:
    from orchestrator.engines.vllm.options import table

    parsed = table().parse(["a/b", "-tp", "2", "--no-trust-remote-code", "--max_model_len=9",
                            "--served-model-name", "x", "y", "--port", "1"])
    assert parsed.positionals == ["a/b"] and not parsed.problems
    seen = [(o.flag, o.negated, o.values, o.words) for o in parsed.options]
    assert seen == [
        ("--tensor-parallel-size", False, ["2"], ["-tp", "2"]),
        ("--trust-remote-code", True, [], ["--no-trust-remote-code"]),
        ("--max-model-len", False, ["9"], ["--max_model_len=9"]),
        ("--served-model-name", False, ["x", "y"], ["--served-model-name", "x", "y"]),
        ("--port", False, ["1"], ["--port", "1"]),
    ]


def test_json_names_the_file_written_and_every_warning(tmp_path: Path) -> None:
    import json

    out = tmp_path / "elsewhere.yml"
    result = run("recipes", "import", str(FIXTURES / "eugr-four-node.yaml"), "-o", str(out), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["command"], doc["ok"], doc["name"], doc["engine"], doc["path"]) == (
        "recipes import", True, "elsewhere", "vllm", str(out))
    assert any(w.startswith("container vllm-node-tf5: an image built locally") for w in doc["warnings"])
    launched = run("recipes", "show", str(out))  # a recipe outside the folder, by path
    assert launched.exit_code == 0 and "--tensor-parallel-size 4" in launched.output


def test_a_recipe_real_sglang_cannot_start_is_refused_at_import(tmp_path: Path) -> None:
    """NEXTN with num_steps and no eagle_topk is a TypeError in SGLang 0.5.12's server_args:
    the import says so instead of writing a recipe that dies at start-up."""
    text = (FIXTURES / "sparkrun-sglang-solo.yaml").read_text()
    source = tmp_path / "no-topk.yaml"
    source.write_text(text.replace("      --speculative-eagle-topk 1 \\\n", ""))
    result = CliRunner().invoke(cli, ["recipes", "import", str(source), "-o", str(tmp_path / "o.yml")])
    assert result.exit_code == 2
    assert "eagle_topk" in result.output and "Traceback" not in result.output


def test_llamacpp_flags_the_pinned_build_takes_are_carried_as_they_are(tmp_path: Path) -> None:
    """--no-mmap and --mlock exist at the pinned b10456: carried word for word, not rewritten
    to a later build's --load-mode (which the pinned image would not take as written)."""
    text = (FIXTURES / "sparkrun-llamacpp-solo.yaml").read_text()
    source = tmp_path / "mmap.yaml"
    source.write_text(text.replace("      --no-webui", "      --no-webui \\\n      --no-mmap --mlock"))
    result = run("recipes", "import", str(source), "--name", "mmap-test")
    assert result.exit_code == 0, result.output
    data = yaml.safe_load((user_dir() / "mmap-test.yml").read_text())
    assert data["serve_args"][-2:] == ["--no-mmap", "--mlock"]
    assert "--load-mode" not in result.output


def test_a_value_that_is_not_a_number_is_refused_naming_the_flag(tmp_path: Path) -> None:
    text = (FIXTURES / "sparkrun-llamacpp-solo.yaml").read_text()
    source = tmp_path / "bad-ctx.yaml"
    source.write_text(text.replace("--ctx-size {ctx_size}", "--ctx-size lots"))
    # the engine's own table types it first, as llama-server's parser would
    assert "command: --ctx-size: 'lots' is not an integer in llama.cpp b10456" in refused(source)
