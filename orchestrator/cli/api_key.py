"""`launch --host` beyond loopback needs an API key (`--api-key-file`).

A server bound to 0.0.0.0 (or any non-loopback address) answers anyone on the LAN; the rule is
that a server binds to localhost unless a key protects it. The key comes from a file (mode 0600
or stricter, one line), never from argv, so it is in no process list and no shell history.

Every engine takes the key in its own way (its `api_key` member, engines/apikey.py): from a
file mounted read-only into its container, never its argv or `docker inspect`. An engine without
a way would be refused here even with a key: an accepted key that no server checks would be
worse than no option at all. `sparkctl tunnel` reaches a loopback server from anywhere SSH does.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from orchestrator.commands import Secret
from orchestrator.engines.apikey import key_problem
from orchestrator.errors import InputError

MAX_KEY_BYTES = 4096


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


def read_api_key(path: str) -> Secret:
    """The key in `path`: a regular file no one else can read, one line of printable ASCII."""
    from orchestrator.state import register_secret
    from orchestrator.yamlio import read_user_file

    file = Path(path).expanduser()
    raw = read_user_file(file, "API key", limit=MAX_KEY_BYTES)
    mode = file.stat().st_mode
    if mode & 0o077:
        raise InputError(f"API key file {file} is readable by group or others (mode "
                         f"{mode & 0o777:04o}); refusing to use it: chmod 600 {file}")
    try:
        value = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise InputError(f"API key file {file} is not UTF-8 text") from None
    problem = key_problem(value)
    if problem:
        raise InputError(f"API key file {file}: {problem} (its content is not shown)")
    secret = Secret(value)
    register_secret(secret)
    return secret


def check_bind(host: str, api_key_file: str | None, way: Any, title: str) -> Secret | None:
    """The key for this launch, or InputError (exit 2) when the bind would be unprotected.
    `way` is the engine's `api_key` member (engines/apikey.KeyWay), None if it takes no key."""
    key = read_api_key(api_key_file) if api_key_file else None
    if key is None and not is_loopback(host):
        raise InputError(
            f"--host {host} serves beyond this node, and an open server answers anyone who "
            f"reaches {host}: pass --api-key-file FILE (mode 0600, one line), or keep the default "
            "127.0.0.1 and reach it with `sparkctl tunnel` (SSH) from other machines")
    if key is not None and way is None:
        raise InputError(
            f"--api-key-file: {title}'s launch does not pass an API key to its server, so the "
            "key would protect nothing; keep the default --host 127.0.0.1 and use `sparkctl "
            "tunnel`")
    return key
