"""Run by the REAL vLLM's interpreter (`python -I vllm_argcheck.py serve ARGS...`): does vLLM 0.31.0
accept this `vllm serve` command line? Prints one JSON verdict: {"code": 0|1|2, "message": str}.

It builds `vllm serve`'s own parser as `vllm` does (FlexibleArgumentParser, every subcommand's
subparser; serve's is make_arg_parser), parses the argv, runs validate_parsed_serve_args and
AsyncEngineArgs.from_cli_args (the EngineArgs checks that need neither weights nor a GPU; the
--compilation-config JSON becomes the real CompilationConfig there). Nothing here loads a model.
Run with -I, so neither the simulator's PYTHONPATH nor this file's folder shadows vLLM's modules.
"""
from __future__ import annotations

import contextlib
import io
import json
import sys


def parser():  # type: ignore[no-untyped-def]
    """The parser `vllm` builds (vllm/entrypoints/cli/main.py at 0.31.0): every subcommand's, so
    the top-level usage and errors read as the real ones."""
    import importlib
    import importlib.metadata

    from vllm.entrypoints.serve.utils.api_utils import VLLM_SUBCMD_PARSER_EPILOG
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(prog="vllm", description="vLLM CLI",
                                 epilog=VLLM_SUBCMD_PARSER_EPILOG.format(subcmd="[subcommand]"))
    top.add_argument("-v", "--version", action="version",
                     version=importlib.metadata.version("vllm"))
    subparsers = top.add_subparsers(required=False, dest="subparser")
    for name in ("openai", "serve", "launch", "benchmark.main", "collect_env", "preload",
                 "run_batch", "snapshot"):
        module = importlib.import_module(f"vllm.entrypoints.cli.{name}")
        commands = module.cmd_init(create_requested=False) if name == "snapshot" else \
            module.cmd_init()
        for command in commands:
            command.subparser_init(subparsers)
    return top


def verdict(argv: list[str]) -> tuple[int, str]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
            args = parser().parse_args(argv)
    except SystemExit as exc:  # argparse's own exit: usage + error on stderr, code 2
        return int(exc.code or 0), said.getvalue().strip()
    try:
        validate_parsed_serve_args(args)
        if getattr(args, "model_tag", None) is not None:  # as ServeSubcommand.cmd does
            args.model = args.model_tag
        AsyncEngineArgs.from_cli_args(args)
    except Exception as exc:  # vllm serve dies of it before loading: traceback, exit 1
        return 1, f"{type(exc).__name__}: {exc}"
    return 0, ""


def main() -> int:
    code, message = verdict(sys.argv[1:])
    print(json.dumps({"code": code, "message": message}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
