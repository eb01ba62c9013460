"""Reading a file the user named, bounded before reading (inventories, recipes, keys, tokens).

Apart from the YAML parsing (yamlio.py, which re-exports these) so a command can read its
inventory file's bytes before it imports a YAML parser: a repeated `up` or `launch` keys its
early connections by them (core/speculate.py).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from orchestrator.errors import InputError

MAX_FILE_BYTES = 1_000_000

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def read_user_file(path: Path, what: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a file the user named, bounded BEFORE reading: only a regular file, and at
    most `limit` bytes (limit+1 are read to tell). Devices (/dev/zero), FIFOs, sockets and
    directories are refused by kind, never opened for a read that could block or never end.
    Every error is an InputError naming the file."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; the kind is checked on the
        # opened descriptor itself (fstat), so a file swapped after a stat cannot slip through
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(f"{what} file not found: {path}") from None
    except IsADirectoryError:
        raise InputError(f"{what} file {path} is a directory, not a file") from None
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO without a writer on some systems
            raise InputError(f"{what} file {path} is not a regular file") from None
        raise InputError(f"cannot read {what} file {path}: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise InputError(f"{what} file {path} is {file_kind(mode)}, not a regular file")
        chunks: list[bytes] = []
        remaining = limit + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    except OSError as exc:
        raise InputError(f"cannot read {what} file {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    raw = b"".join(chunks)
    if len(raw) > limit:
        raise InputError(f"{what} file {path} is larger than {limit} bytes; is it the right file?")
    return raw
