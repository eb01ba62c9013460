"""The user's state directory: the run logs and the last inventory a successful `up` used.

Nothing here decides what is true on the cluster ("already done" is always proven on the
nodes); this only helps the user find logs and spares retyping --inventory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from pathlib import Path

from orchestrator.commands import Secret

_SECRETS: list[str] = []


def state_dir() -> Path:
    explicit = os.environ.get("SPARKCTL_STATE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "sparkctl"


def remember_inventory(path: Path) -> None:
    directory = state_dir()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "last-inventory").write_text(str(path.resolve()) + "\n")


def register_secret(secret: Secret | str) -> None:
    """Values registered here are replaced by *** in every log line."""
    value = secret.reveal() if isinstance(secret, Secret) else secret
    if value and len(value) >= 4 and value not in _SECRETS:
        _SECRETS.append(value)


def redact(text: str) -> str:
    for value in _SECRETS:
        text = text.replace(value, "***")
    # private keys that slipped into output are cut whatever registered them
    return re.sub(
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----",
        "<private key redacted>", text, flags=re.S,
    )


class _RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def start_run_log(command: str) -> Path | None:
    """Log this invocation to <state>/logs/<time>-<command>.log (0600), secrets redacted."""
    directory = state_dir() / "logs"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{command}.log"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError:
        return None
    handler = logging.FileHandler(path)
    os.close(fd)
    handler.setFormatter(_RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("sparkctl")
    root.setLevel(logging.DEBUG)
    root.addHandler(handler)
    _prune_old_logs(directory, keep=50)
    return path


def _prune_old_logs(directory: Path, keep: int) -> None:
    logs = sorted(directory.glob("*.log"))
    for old in logs[:-keep]:
        with contextlib.suppress(OSError):
            old.unlink()
