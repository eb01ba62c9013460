"""A stand-in for iptables, ip6tables, their -restore and `docker inspect`, for the port guard's
unit tests (orchestrator/node/portguard.py): the subset of their command lines the guard uses,
printed as iptables 1.8 prints them, its tables kept in the JSON file $FAKE_IPTABLES_STATE (one
per tool). `docker inspect` says "true" for the containers listed in $FAKE_RUNNING. Any other
command line exits 2, so a guard that starts using more of iptables fails here first.

Usage (as the executables' wrapper runs it): python3 fake_iptables.py TOOL ARGS...
"""

from __future__ import annotations

import json
import os
import shlex
import sys


def load() -> dict[str, dict[str, list[str]]]:
    try:
        with open(os.environ["FAKE_IPTABLES_STATE"]) as handle:
            return dict(json.load(handle))
    except FileNotFoundError:
        return {}


def save(state: dict[str, dict[str, list[str]]]) -> None:
    with open(os.environ["FAKE_IPTABLES_STATE"], "w") as handle:
        json.dump(state, handle)


def rule(chain: str, spec: list[str]) -> str:
    return " ".join(["-A", chain, *(f'"{a}"' if " " in a else a for a in spec)])


def restore(table: dict[str, list[str]], text: str) -> int:
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    if lines[0] != "*filter" or lines[-1] != "COMMIT":
        return 2
    for line in lines[1:-1]:
        if line.startswith(":"):
            table[line[1:].split()[0]] = []  # declared: created, or emptied
        elif line.startswith("-A "):
            chain = line.split()[1]
            if chain not in table:
                return 1
            table[chain].append(line)
        else:
            return 2
    return 0


def iptables(table: dict[str, list[str]], args: list[str]) -> int:
    table.setdefault("INPUT", [])
    op, rest = args[0], args[1:]
    if op == "-S" and not rest:
        print("-P INPUT ACCEPT\n-P FORWARD ACCEPT\n-P OUTPUT ACCEPT")
        print("\n".join(f"-N {c}" for c in table if c != "INPUT"))
        print("\n".join(r for c in table for r in table[c]))
        return 0
    chain = rest[0]
    if chain not in table:
        print("iptables: No chain/target/match by that name.", file=sys.stderr)
        return 1
    if op == "-S":
        print("-P INPUT ACCEPT" if chain == "INPUT" else f"-N {chain}")
        print("\n".join(table[chain]))
        return 0
    if op == "-C":
        return 0 if rule(chain, rest[1:]) in table[chain] else 1
    if op == "-I" and rest[1] == "1":
        table[chain].insert(0, rule(chain, rest[2:]))
        return 0
    if op == "-D":
        wanted = rule(chain, rest[1:])
        if wanted not in table[chain]:
            return 1
        table[chain].remove(wanted)
        return 0
    if op == "-F":
        table[chain] = []
        return 0
    if op == "-X" and chain != "INPUT":
        if any(r.endswith(f"-j {chain}") for rules in table.values() for r in rules):
            return 1  # still referenced, as the kernel refuses
        del table[chain]
        return 0
    return 2


def main(argv: list[str]) -> int:
    tool, args = os.path.basename(argv[1]), argv[2:]
    if tool == "docker":
        running = os.environ.get("FAKE_RUNNING", "").split()
        print("true" if args[-1] in running else "false")
        return 0 if args[:1] == ["inspect"] else 2
    state = load()
    family = tool.replace("-restore", "")
    table = state.setdefault(family, {"INPUT": []})
    args = [a for a in args if a != "-w"]
    if tool.endswith("-restore"):
        code = restore(table, sys.stdin.read()) if args == ["--noflush"] else 2
    else:
        code = iptables(table, args)
    if code == 0:
        save(state)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))


def install(bin_dir: str) -> None:
    """The fake commands as executables in BIN_DIR (put it first on PATH)."""
    for tool in ("iptables", "ip6tables", "iptables-restore", "ip6tables-restore", "docker"):
        path = os.path.join(bin_dir, tool)
        with open(path, "w") as handle:
            handle.write(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} "
                         f"{shlex.quote(os.path.abspath(__file__))} \"$0\" \"$@\"\n")
        os.chmod(path, 0o755)
