"""`hf` (huggingface_hub CLI) simulation: `hf download` writes a small fake snapshot."""
from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import sys
import time

from .common import GATED_ORGS, SIMULATION_NOTE, hostname, hub_dir, lab_config, offline, repo_folder

KNOWN_REPOS = {
    "nvidia/Qwen3-235B-A22B-FP4": ("Qwen3MoeForCausalLM", 4),
    "nvidia/Qwen3-235B-A22B-Eagle3": ("LlamaForCausalLMEagle3", 1),
    "openai/gpt-oss-120b": ("GptOssForCausalLM", 3),
    "nvidia/gpt-oss-120b-Eagle3-long-context": ("LlamaForCausalLMEagle3", 1),
    "nvidia/Llama-3.3-70B-Instruct-FP4": ("LlamaForCausalLM", 3),
    "nvidia/Llama-3.1-8B-Instruct-FP4": ("LlamaForCausalLM", 1),
    "nvidia/MiniMax-M2.7-NVFP4": ("MiniMaxM2ForCausalLM", 4),
    "Qwen/Qwen3.6-27B-FP8": ("Qwen3_5ForConditionalGeneration", 3),
    "Qwen/Qwen3-8B": ("Qwen3ForCausalLM", 2),
    # the recipes built in for three and four Sparks (and the four-node eugr test recipe)
    "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-NVFP4": ("NemotronHForCausalLM", 4),
    "Intel/Qwen3.5-397B-A17B-int4-AutoRound": ("Qwen3_5MoeForConditionalGeneration", 4),
    "Qwen/Qwen3.5-397B-A17B-FP8": ("Qwen3_5MoeForConditionalGeneration", 4),
    "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8": ("Qwen3MoeForCausalLM", 4),
}
CONFIG_EXTRAS = {
    # the real config.json has an MTP (NextN) layer: SGLang's NEXTN drafts with it
    "Qwen/Qwen3.6-27B-FP8": {"mtp_num_hidden_layers": 1, "sparklab_weights_gb": 28.0},
    "Qwen/Qwen3-8B": {"sparklab_weights_gb": 16.4},
    "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-NVFP4": {"sparklab_weights_gb": 308.0},
    "Intel/Qwen3.5-397B-A17B-int4-AutoRound": {"mtp_num_hidden_layers": 1,
                                               "sparklab_weights_gb": 222.0},
    "Qwen/Qwen3.5-397B-A17B-FP8": {"mtp_num_hidden_layers": 1, "sparklab_weights_gb": 400.0},
    "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8": {"sparklab_weights_gb": 236.0},
}
"""More config.json keys per repo: MTP heads (what NEXTN needs) and the real weights' size in GB
(the lab's shards are small; the simulated engines check memory against this)."""
OTHER_FORMATS = {
    # the real repository also holds OpenAI's reference checkpoint (original/) and a build for
    # Apple's Metal (metal/), each as large as the weights: without patterns a download (and a
    # copy) moves three times what an engine loads (issue #18: "65 GB pulled as 195 GB")
    "openai/gpt-oss-120b": {"original/config.json": None, "original/dtypes.json": None,
                            "original/model.safetensors": "weights", "metal/model.bin": "weights"},
}
"""Files beside the served weights, by repo: "weights" ones are as large as the weights."""
REAL_HUB = "/usr/lib/sparklab/hub"
"""Repos with real files (in every node: a lower layer of /usr that `lab up` fills,
sparklab/llamacpp_install.py): `sparklab/tiny-llama-gguf`, a real GGUF for the real llama.cpp."""
VERSION = "0.35.3"
USAGE = f"""usage: hf <command> [<args>]

Hugging Face Hub CLI ({SIMULATION_NOTE})

positional arguments:
  {{auth,download,version}}
    auth       Manage authentication (lab: `auth whoami` only)
    download   Download files from the Hub (lab: writes a small fake snapshot)
    version    Print information about the hf version.
"""
DOWNLOAD_USAGE = ("usage: hf download [-h] [--repo-type {model,dataset,space}] "
                  "[--revision REVISION] [--cache-dir CACHE_DIR] [--local-dir LOCAL_DIR] "
                  "[--token TOKEN] [--include PATTERN] [--exclude PATTERN] [--quiet] "
                  "[--max-workers MAX_WORKERS] repo_id "
                  "[filenames ...]")


class HfError(Exception):
    pass


def outbox_path() -> str | None:
    path = os.environ.get("SPARKLAB_OUTBOX", "/var/lib/sparklab-outbox")
    return path if os.path.isdir(path) and os.access(path, os.W_OK) else None


def find_token(cli_token: str | None) -> str | None:
    if cli_token:
        return cli_token
    if os.environ.get("HF_TOKEN"):
        return os.environ["HF_TOKEN"]
    from .common import hf_home

    path = os.environ.get("HF_TOKEN_PATH") or os.path.join(hf_home(), "token")
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def stream(seed: bytes, size: int) -> bytes:
    block = b"".join(hashlib.sha256(seed + i.to_bytes(4, "big")).digest() for i in range(2048))
    return (block * (size // len(block) + 1))[:size]


def real_repo(repo: str) -> str | None:
    """The folder of a repo whose files are real (served as they are), or None."""
    folder = os.path.join(os.environ.get("SPARKLAB_REAL_HUB", REAL_HUB), *repo.split("/"))
    return folder if os.path.isfile(os.path.join(folder, "config.json")) else None


def real_files(folder: str) -> dict[str, bytes]:
    files = {}
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(n for n in names if not n.startswith(".")):
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, folder)] = f.read()
    return files


def snapshot_files(repo: str, revision: str) -> dict[str, bytes]:
    folder = real_repo(repo)
    if folder is not None:
        return real_files(folder)
    arch, shards = KNOWN_REPOS[repo]
    total = int(lab_config()["model_bytes"])
    config = {"_name_or_path": repo, "architectures": [arch], "model_type": arch.lower(),
              "sparklab_simulated": True, "revision": revision, **CONFIG_EXTRAS.get(repo, {})}
    files = {"config.json": json.dumps(config, indent=2).encode() + b"\n",
             "generation_config.json": b'{"do_sample": true, "temperature": 0.6}\n',
             "tokenizer_config.json": b'{"model_max_length": 131072}\n'}
    index: dict[str, str] = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        size = total // shards + (total % shards if i == shards - 1 else 0)
        files[name] = stream(f"{repo}/{name}".encode(), size)
        index[f"layer.{i}.weight"] = name
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": total}, "weight_map": index}, indent=2).encode()
    for name, kind in OTHER_FORMATS.get(repo, {}).items():
        files[name] = (stream(f"{repo}/{name}".encode(), total) if kind == "weights"
                       else json.dumps({"sparklab_simulated": True, "file": name}).encode())
    return files


def commit_for(repo: str, revision: str) -> str:
    if len(revision) == 40 and all(c in "0123456789abcdef" for c in revision):
        return revision
    folder = real_repo(repo)
    version = ""
    if folder is not None:  # a real repo whose files changed is a new commit
        try:
            with open(os.path.join(folder, ".sparklab-inputs")) as f:
                version = ":" + f.read().strip()
        except OSError:
            pass
    return hashlib.sha1(f"sparklab:{repo}@{revision}{version}".encode()).hexdigest()


def write_if_changed(path: str, data: bytes) -> int:
    try:
        if os.path.getsize(path) == len(data):
            with open(path, "rb") as f:
                if f.read() == data:
                    return 0
    except OSError:
        pass
    tmp = path + ".incomplete"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return len(data)


def format_size(num: float) -> str:
    """huggingface_hub.utils._format_size."""
    for unit in ("", "K", "M", "G", "T", "P"):
        if abs(num) < 1000.0:
            return f"{num:.1f}{unit}"
        num /= 1000.0
    return f"{num:.1f}E"


def wanted(name: str, include: list[str], exclude: list[str]) -> bool:
    """huggingface_hub's filter_repo_objects: fnmatch on the path; "dir/" means "dir/*"."""
    def fix(p: str) -> str:
        return p + "*" if p.endswith("/") else p
    if include and not any(fnmatch.fnmatch(name, fix(p)) for p in include):
        return False
    return not any(fnmatch.fnmatch(name, fix(p)) for p in exclude)


def download(repo: str, revision: str, local_dir: str | None, token: str | None,
             quiet: bool, include: list[str] | None = None,
             exclude: list[str] | None = None, dry_run: bool = False) -> str:
    if repo not in KNOWN_REPOS and real_repo(repo) is None:
        raise HfError(
            "huggingface_hub.errors.RepositoryNotFoundError: 404 Client Error. "
            f"(Request ID: Root=1-sparklab)\n\nRepository Not Found for url: "
            f"https://huggingface.co/api/models/{repo}/revision/{revision}.\nPlease make sure "
            "you specified the correct `repo_id` and `repo_type`.\nIf you are trying to access "
            "a private or gated repo, make sure you are authenticated.")
    commit = commit_for(repo, revision)
    folder = repo_folder(repo)
    snap = os.path.join(folder, "snapshots", commit)
    if offline():
        done = os.path.isfile(os.path.join(local_dir or snap, "config.json"))
        if done:
            return os.path.abspath(local_dir) if local_dir else snap
        raise HfError("huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an "
                      "appropriate cached snapshot folder for the specified revision on the "
                      "local disk and outgoing traffic has been disabled. To enable repo "
                      "look-ups and downloads online, set 'HF_HUB_OFFLINE=0' as environment "
                      "variable.")
    if repo.startswith(GATED_ORGS):
        if not token:
            raise HfError(
                "huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: "
                f"Root=1-sparklab)\n\nCannot access gated repo for url https://huggingface.co/"
                f"api/models/{repo}/revision/{revision}.\nAccess to model {repo} is "
                "restricted. You must have access to it and be authenticated to access it. "
                "Please log in.")
        if not token.startswith("hf_"):
            raise HfError("huggingface_hub.errors.HfHubHTTPError: 401 Client Error: "
                          "Unauthorized for url: https://huggingface.co/api/models/"
                          f"{repo}/revision/{revision} (Invalid credentials in Authorization "
                          "header)")
    files = {name: data for name, data in snapshot_files(repo, revision).items()
             if wanted(name, include or [], exclude or [])}
    fetched = 0
    if dry_run:  # like huggingface_hub's: counts what is not in the cache yet
        todo = {n: d for n, d in files.items() if not os.path.isfile(
            os.path.join(local_dir, n) if local_dir else
            os.path.join(folder, "blobs", hashlib.sha256(d).hexdigest()))}
        return (f"[dry-run] Will download {len(todo)} files (out of {len(files)}) totalling "
                f"{format_size(sum(len(d) for d in todo.values()))}.")
    if not quiet:
        print(f"Fetching {len(files)} files: 0%|          | 0/{len(files)}", file=sys.stderr)
    if local_dir:
        os.makedirs(local_dir, exist_ok=True)
        for name, data in files.items():
            os.makedirs(os.path.dirname(os.path.join(local_dir, name)), exist_ok=True)
            fetched += write_if_changed(os.path.join(local_dir, name), data)
        meta = os.path.join(local_dir, ".cache", "huggingface")
        os.makedirs(meta, exist_ok=True)
        write_if_changed(os.path.join(meta, ".gitignore"), b"*\n")
        result = os.path.abspath(local_dir)
    else:
        os.makedirs(os.path.join(folder, "blobs"), exist_ok=True)
        os.makedirs(os.path.join(folder, "refs"), exist_ok=True)
        os.makedirs(snap, exist_ok=True)
        for name, data in files.items():
            blob = hashlib.sha256(data).hexdigest()
            fetched += write_if_changed(os.path.join(folder, "blobs", blob), data)
            link = os.path.join(snap, name)
            os.makedirs(os.path.dirname(link), exist_ok=True)  # (files in folders: original/...)
            if os.path.islink(link) or os.path.exists(link):
                os.unlink(link)
            os.symlink(os.path.relpath(os.path.join(folder, "blobs", blob), os.path.dirname(link)),
                       link)
        if not (len(revision) == 40 and revision == commit):
            write_if_changed(os.path.join(folder, "refs", revision), commit.encode())
        result = snap
    if not quiet:
        print(f"Fetching {len(files)} files: 100%|██████████| {len(files)}/{len(files)}",
              file=sys.stderr)
    record_download(repo, fetched)
    return result


def record_download(repo: str, fetched: int) -> None:
    # Evidence for tests that a model came "from the internet" (never the token).
    box = outbox_path()
    if not box or not fetched:
        return
    line = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "repo": repo,
            "host": hostname(), "bytes": fetched}
    with open(os.path.join(box, "hf-downloads.log"), "a") as f:
        f.write(json.dumps(line) + "\n")


LAB_USER = "sparklab-user"


def whoami() -> int:
    """`hf auth whoami` against the lab's hub (this simulation: a token is valid when it looks
    like one, hf_...; the lab never asks huggingface.co). What the real CLI does: the token
    from HF_TOKEN or the token file, GET /api/whoami-v2, 401 for a token the hub refuses."""
    if offline():
        print("Error: Cannot reach the Hub: offline mode is enabled (HF_HUB_OFFLINE=1).",
              file=sys.stderr)
        return 1
    token = find_token(None)
    if not token:
        print("Not logged in")
        return 1
    if not token.startswith("hf_"):
        print("Error: Invalid user token. (401 Client Error: Unauthorized for url: "
              "https://huggingface.co/api/whoami-v2)", file=sys.stderr)
        return 1
    print(f"user: {LAB_USER}")
    return 0


def parse_download(args: list[str]) -> dict:
    opts: dict = {"revision": "main", "local_dir": None, "token": None, "quiet": False,
                  "repo": None, "cache_dir": None, "include": [], "exclude": []}
    lists = {"--include", "--exclude"}
    valued = {"--revision": "revision", "--local-dir": "local_dir", "--token": "token",
              "--cache-dir": "cache_dir", "--repo-type": "repo_type",
              "--max-workers": "max_workers", "--include": "include", "--exclude": "exclude"}
    i = 0
    while i < len(args):
        a = args[i]
        key, eq, val = a.partition("=")
        if key in valued:
            if not eq:
                i += 1
                if i >= len(args):
                    raise SystemExit(f"{DOWNLOAD_USAGE}\nhf download: error: argument {key}: "
                                     "expected one argument")
                val = args[i]
            if key in lists:  # repeatable (hf >= 1.0); older CLIs took several values at once
                opts[valued[key]].append(val)
                while i + 1 < len(args) and not args[i + 1].startswith("-") and not eq \
                        and opts["repo"] is not None:
                    i += 1
                    opts[valued[key]].append(args[i])
            else:
                opts[valued[key]] = val
        elif a == "--dry-run":
            opts["dry_run"] = True
        elif a in ("--quiet", "-q"):
            opts["quiet"] = True
        elif a in ("-h", "--help"):
            print(DOWNLOAD_USAGE + f"\n\n{SIMULATION_NOTE}")
            raise SystemExit(0)
        elif a.startswith("-"):
            raise SystemExit(f"{DOWNLOAD_USAGE}\nhf: error: unrecognized arguments: {a}")
        elif opts["repo"] is None:
            opts["repo"] = a
        i += 1
    if not opts["repo"]:
        raise SystemExit(f"{DOWNLOAD_USAGE}\nhf download: error: the following arguments are "
                         "required: repo_id")
    return opts


def main(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    if args[0] == "version":
        print(f"huggingface_hub version: {VERSION} (sparklab simulation)")
        return 0
    if args[:2] == ["auth", "whoami"]:
        return whoami()
    if args[0] != "download":
        print(f"{USAGE}\nhf: error: argument {{download,version}}: invalid choice: '{args[0]}'",
              file=sys.stderr)
        return 2
    try:
        opts = parse_download(args[1:])
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            return 2
        return int(exc.code or 0)
    if opts["cache_dir"]:
        os.environ["HF_HUB_CACHE"] = opts["cache_dir"]
    try:
        path = download(opts["repo"], opts["revision"], opts["local_dir"],
                        find_token(opts["token"]), opts["quiet"], opts["include"],
                        opts["exclude"], bool(opts.get("dry_run")))
    except HfError as exc:
        print(exc, file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"OSError: {exc} (cache {hub_dir()})", file=sys.stderr)
        return 1
    print(path)
    return 0
