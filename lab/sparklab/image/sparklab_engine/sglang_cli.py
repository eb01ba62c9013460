"""Simulated `python3 -m sglang.launch_server` (sparklab: no GPU, no real model), SGLang 0.5.12.

The command line is checked against SGLang's real option table (the one sparkctl validates
recipes with, extracted from the pinned wheel): unknown flags and bad values exit 2 like its
argparse. Then it fails where SGLang 0.5.12 fails for what sparkctl depends on: the model missing
from the cache (offline), the checks of ServerArgs it mirrors (line numbers of
sglang/srt/server_args.py), EAGLE/NEXTN with eagle_topk > 1 and no num_draft_tokens (the
TypeError of tokenizer_manager.py l.281), NEXTN on a model without MTP layers, weights that do not fit in
--mem-fraction-static of the node's memory, and a multi-node rendezvous (--dist-init-addr) that
cannot be reached. It prints SGLang's start-up and ready lines and serves the OpenAI API
(sparklab_engine/server.py, paced by perf_model.py), /health, /health_generate, /get_model_info,
and with --enable-metrics Prometheus /metrics with SGLang's speculative metric names.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time

from .common import ModelMissing, UsageError, hostname, lab_config, option_table, resolve_model, usage_errors

VERSION = "0.5.12"
USAGE = "usage: launch_server.py [-h] --model-path MODEL_PATH [options]"
HYBRID = ("Qwen3NextForCausalLM", "Qwen3_5MoeForConditionalGeneration",
          "Qwen3_5ForConditionalGeneration", "InternS2PreviewForConditionalGeneration")
NAMES = {"--model-path": "model", "--tensor-parallel-size": "tp", "--pipeline-parallel-size": "pp",
         "--host": "host", "--port": "port", "--mem-fraction-static": "mem",
         "--speculative-algorithm": "algo", "--speculative-num-steps": "steps",
         "--speculative-eagle-topk": "topk", "--speculative-num-draft-tokens": "draft_tokens",
         "--nnodes": "nnodes", "--node-rank": "rank", "--dist-init-addr": "dist",
         "--dist-timeout": "dist_timeout", "--served-model-name": "served",
         "--disable-radix-cache": "no_radix", "--mamba-scheduler-strategy": "mamba",
         "--enable-metrics": "metrics", "--trust-remote-code": "trust",
         "--attention-backend": "attention", "--page-size": "page", "--api-key": "api_key"}


def log(message: str) -> None:
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def config_args(path: str) -> list[str]:
    """SGLang's --config: a YAML mapping turned into `--key value` words placed before the
    command line's (server_args_config_parser.py: a .yaml/.yml file, CLI wins over config)."""
    if not path.lower().endswith((".yaml", ".yml")):
        raise UsageError(f"Config file must be YAML format, got: {os.path.splitext(path)[1]}")
    try:
        with open(path) as handle:
            text = handle.read()
    except OSError as exc:
        raise UsageError(f"Config file not found: {path} ({exc})") from None
    try:
        import yaml  # type: ignore[import-untyped]

        data = yaml.safe_load(text) or {}
    except ImportError:  # the lab's python3 may lack PyYAML: `key: value` / `key: "json"` lines
        data = {}
        for line in text.splitlines():
            key, _, value = line.partition(":")
            value = value.strip()
            if key.strip() and not key.startswith("#"):
                data[key.strip()] = json.loads(value) if value.startswith('"') else value
    words: list[str] = []
    for key, value in data.items():
        if value is True:
            words.append(f"--{key}")
        elif value is not False:
            words += [f"--{key}", str(value)]
    return words


def parse(args: list[str], table) -> dict:  # type: ignore[no-untyped-def]
    if "--config" in args:
        at = args.index("--config")
        args = config_args(args[at + 1] if at + 1 < len(args) else "") + args[:at] + args[at + 2:]
    usage_errors(table.check_flags(args))
    opts: dict = {"tp": 1, "pp": 1, "host": "127.0.0.1", "port": 30000, "nnodes": 1, "rank": 0,
                  "mamba": "auto"}
    i = 0
    while i < len(args):
        flag, eq, inline = args[i].partition("=")
        name = table.canonical(flag) or flag  # aliases and unique abbreviations, as argparse
        kind = (table.flags.get(name) or {}).get("kind")
        if kind == "store_true":
            value, step = True, 1
        else:
            value, step = (inline, 1) if eq else (args[i + 1] if i + 1 < len(args) else "", 2)
        if name in NAMES:
            opts[NAMES[name]] = value
        i += step
    if not opts.get("model"):
        raise UsageError("the following arguments are required: --model-path")
    for key in ("tp", "pp", "port", "nnodes", "rank"):
        opts[key] = int(opts[key])
    return opts


def check_server_args(opts: dict, config: dict) -> None:
    """What SGLang 0.5.12's ServerArgs refuses, for the flags the lab knows."""
    algo = str(opts.get("algo") or "").upper() or None  # l.3562: upper-cased
    if algo == "NEXTN":
        algo = "EAGLE"  # l.344-350: NEXTN is EAGLE (over the model's own MTP layers)
        if not (config.get("mtp_num_hidden_layers") or config.get("num_nextn_predict_layers")):
            raise ValueError(
                f"--speculative-algorithm NEXTN needs the model's MTP (NextN) layers, but the "
                f"config of {opts['model']} has none (no mtp_num_hidden_layers / "
                "num_nextn_predict_layers); use EAGLE/EAGLE3 with a draft model instead")
    arch = (config.get("architectures") or ["?"])[0]
    if arch in HYBRID and algo and opts.get("mamba") != "extra_buffer" and not opts.get("no_radix"):
        raise ValueError(  # l.2561
            f"Speculative decoding for {arch} is not compatible with radix cache when using "
            "--mamba-scheduler-strategy no_buffer.To use radix cache with speculative decoding, "
            "please use --mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1.")
    if algo in ("EAGLE", "EAGLE3", "STANDALONE") and opts.get("steps") is None and (
            opts.get("topk") is not None or opts.get("draft_tokens") is not None):
        raise AssertionError("")  # l.3809: a bare assert, as in SGLang
    topk = int(opts.get("topk") or 1)
    if algo and topk > 1 and opts.get("attention") == "trtllm_mha":
        raise ValueError("trtllm_mha backend only supports topk = 1 for speculative decoding.")
    if algo in ("EAGLE", "EAGLE3") and opts.get("steps") is not None and opts.get("topk") is None:
        # l.3838 compares speculative_eagle_topk > 1 with the value still None
        raise SourceTypeError("sglang/srt/server_args.py", 3838, "self.speculative_eagle_topk > 1")
    if (opts["tp"] * opts["pp"]) % opts["nnodes"]:
        raise AssertionError("tp_size must be divisible by number of nodes")  # l.7231
    if opts["pp"] > 1 and algo:
        raise AssertionError("Pipeline parallelism is not compatible with overlap schedule, "
                             "speculative decoding")  # l.7250
    if opts["tp"] * opts["pp"] != opts["nnodes"]:
        raise RuntimeError(f"CUDA error: invalid device ordinal (sparklab: a Spark has one GPU; "
                           f"tp x pp = {opts['tp'] * opts['pp']} over {opts['nnodes']} node(s))")


class SourceTypeError(TypeError):
    """A TypeError SGLang's own code raises, printed as its traceback's last frame."""

    def __init__(self, path: str, line: int, code: str) -> None:
        super().__init__("'>' not supported between instances of 'NoneType' and 'int'")
        self.frame = f'  File "{path}", line {line}, in __init__\n    {code}'


def init_tokenizer_manager(opts: dict) -> None:
    """Rank 0's TokenizerManager (engine.py starts it after the scheduler processes; the other
    ranks only wait for their schedulers): tokenizer_manager.py l.281 reserves output slots for
    EAGLE's drafts as max(eagle_topk x num_steps, num_draft_tokens). ServerArgs fills
    num_draft_tokens itself only without --speculative-num-steps or with topk 1 (l.3807-3835),
    so topk > 1 and no --speculative-num-draft-tokens is max(20, None): a TypeError."""
    algo = str(opts.get("algo") or "").upper()
    if algo not in ("EAGLE", "EAGLE3", "NEXTN") or opts.get("steps") is None:
        return
    if int(opts.get("topk") or 1) > 1 and opts.get("draft_tokens") is None:
        raise SourceTypeError("sglang/srt/managers/tokenizer_manager.py", 281,
                              "self.num_reserved_tokens = max(")


def check_memory(opts: dict, config: dict) -> None:
    total = float(lab_config().get("node_memory_gb", 128.0))
    frac = float(opts.get("mem") or 0.88)
    weights = float(config.get("sparklab_weights_gb", 16.0)) / (opts["tp"] * opts["pp"])
    log(f"Load weight begin. avail mem={total:.2f} GB")
    if weights >= frac * total:
        raise RuntimeError(
            "Not enough memory. Please try to increase --mem-fraction-static. Current value: "
            f"mem_fraction_static={frac} (sparklab: {weights:.1f} GB of weights per rank, "
            f"{frac} x {total:g} GB = {frac * total:.1f} GB static pool)")
    log(f"Load weight end. type={(config.get('architectures') or ['?'])[0]}, "
        f"dtype=torch.bfloat16, avail mem={total - weights:.2f} GB, mem usage={weights:.2f} GB.")
    log(f"KV Cache is allocated. #tokens: {int((frac * total - weights) * 8192)}, "
        f"K size: {(frac * total - weights) / 2:.2f} GB, V size: {(frac * total - weights) / 2:.2f} GB")


def split_addr(text: str) -> tuple[str, int]:
    host, _, port = str(text).rpartition(":")
    return host.strip("[]"), int(port)


def rendezvous(opts: dict) -> socket.socket | list[socket.socket]:
    """torch.distributed's TCP store, roughly: rank 0 listens on --dist-init-addr, the others
    connect to it within the timeout; each names itself."""
    host, port = split_addr(opts["dist"])
    timeout = float(opts.get("dist_timeout") or lab_config().get("sglang_dist_timeout", 60))
    if opts["rank"] == 0:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind((host, port))
        except OSError as exc:
            raise RuntimeError(f"torch.distributed.DistNetworkError: The server socket has failed "
                               f"to bind to {host}:{port} (errno: {exc.errno} - "
                               f"{exc.strerror}).") from None
        server.listen(8)
        server.settimeout(timeout)
        peers = []
        while len(peers) < opts["nnodes"] - 1:
            try:
                conn, addr = server.accept()
            except TimeoutError:
                raise RuntimeError(
                    f"torch.distributed.DistStoreError: Timed out after {timeout:g} seconds "
                    f"waiting for clients. {len(peers) + 1}/{opts['nnodes']} clients joined.") from None
            conn.settimeout(None)  # a long-lived link from here on: only EOF means a dead rank
            hello = json.loads(conn.makefile().readline() or "{}")
            log(f"Rank {hello.get('rank')} ({hello.get('host')}) joined from {addr[0]}")
            peers.append(conn)
        return peers
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=5)
            conn.sendall((json.dumps({"rank": opts["rank"], "host": hostname()}) + "\n").encode())
            conn.settimeout(None)
            return conn
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    "torch.distributed.DistNetworkError: The client socket has timed out after "
                    f"{timeout:g}s while trying to connect to ({host}, {port}).") from None
            time.sleep(1)


def watch(conns: list[socket.socket], what: str) -> None:
    def loop(conn: socket.socket) -> None:
        try:
            while conn.recv(1024):
                pass
        except OSError:
            pass
        log(f"{what} is dead; exiting (sparklab: SGLang aborts when a rank dies)")
        os.kill(os.getpid(), signal.SIGTERM)
    for conn in conns:
        threading.Thread(target=loop, args=(conn,), daemon=True).start()


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    if argv[:1] == ["--version"]:
        print(VERSION)
        return 0
    try:
        opts = parse(argv, option_table("sglang"))
    except UsageError as exc:
        print(f"{USAGE}\nlaunch_server.py: error: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    log(f"server_args=ServerArgs(model_path='{opts['model']}', tp_size={opts['tp']}, "
        f"host='{opts['host']}', port={opts['port']}, nnodes={opts['nnodes']}, "
        f"node_rank={opts['rank']}, speculative_algorithm={opts.get('algo')!r}) "
        f"(sparklab simulation of SGLang {VERSION} on {hostname()})")
    server = None
    try:
        snapshot = resolve_model(opts["model"])
        with open(os.path.join(snapshot, "config.json")) as f:
            config = json.load(f)
        check_server_args(opts, config)
        if opts["rank"] == 0:
            init_tokenizer_manager(opts)
        conns: list[socket.socket] = []
        if opts["nnodes"] > 1:
            if not opts.get("dist"):
                raise ValueError("--dist-init-addr is required when --nnodes > 1")
            joined = rendezvous(opts)
            conns = joined if isinstance(joined, list) else [joined]
            watch(conns, "A peer rank" if opts["rank"] == 0 else "Rank 0")
        check_memory(opts, config)
        end = time.monotonic() + float(lab_config()["engine_load_seconds"])
        while time.monotonic() < end:
            time.sleep(0.1)
        if opts["rank"] > 0:  # the other ranks only compute for rank 0
            log(f"Rank {opts['rank']} scheduler ready; serving rank 0 at {opts['dist']}")
            while True:
                signal.pause()
        from .sglang_http import start_sglang_http

        server = start_sglang_http(opts, config)
        log("The server is fired up and ready to roll!")
        while True:
            signal.pause()
    except KeyboardInterrupt:
        print("INFO:     Shutting down\nINFO:     Application shutdown complete.", file=sys.stderr,
              flush=True)
        return 0
    except SourceTypeError as exc:
        print(f"Traceback (most recent call last):\n{exc.frame}\nTypeError: {exc}",
              file=sys.stderr, flush=True)
        return 1
    except AssertionError as exc:
        print(f"Traceback (most recent call last):\n  File \"sglang/srt/server_args.py\"\n"
              f"AssertionError: {exc}", file=sys.stderr, flush=True)
        return 1
    except (ValueError, RuntimeError, ModelMissing, OSError) as exc:
        text = str(exc)
        kind = "" if isinstance(exc, ModelMissing) or text.startswith(("torch.", "CUDA")) \
            else f"{type(exc).__name__}: "
        print(f"{kind}{exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if server:
            server.shutdown_quietly()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
