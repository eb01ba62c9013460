"""`ray` in the lab's vLLM image: the real Ray CLI, with the lab machine's resource caps.

Everything is passed through to Ray unchanged except, for `ray start`: the object store is capped
at lab.json's `ray_object_store_bytes` (default 100 MB; a Spark recipe asks for GBs, this machine
shares 2 cores and a few GB between several labs) and `--num-cpus` defaults to 1. Both caps are
printed, so a test or a person reading the log knows they were applied.
"""
from __future__ import annotations

import sys

from .common import lab_config

DEFAULT_OBJECT_STORE = 100 * 1024 * 1024


def _value(args: list[str], flag: str) -> tuple[int, str | None]:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return i, args[i + 1]
        if arg.startswith(flag + "="):
            return i, arg.split("=", 1)[1]
    return -1, None


def _set(args: list[str], flag: str, value: str) -> list[str]:
    i, _ = _value(args, flag)
    if i < 0:
        return [*args, flag, value]
    if args[i] == flag:
        return [*args[:i], flag, value, *args[i + 2:]]
    return [*args[:i], f"{flag}={value}", *args[i + 1:]]


def lab_caps(args: list[str]) -> list[str]:
    if not args or args[0] != "start":
        return args
    cap = int(lab_config().get("ray_object_store_bytes") or DEFAULT_OBJECT_STORE)
    _, asked = _value(args, "--object-store-memory")
    if asked is None or int(float(asked)) > cap:
        print(f"sparklab: object store capped at {cap} bytes (asked: {asked or 'Ray default'})",
              file=sys.stderr, flush=True)
        args = _set(args, "--object-store-memory", str(cap))
    if _value(args, "--num-cpus")[1] is None:
        args = _set(args, "--num-cpus", "1")
    return args


def main(args: list[str]) -> int:
    from ray.scripts.scripts import main as ray_main

    sys.argv = ["ray", *lab_caps(args)]
    return int(ray_main() or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
