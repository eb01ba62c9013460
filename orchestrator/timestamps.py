"""Times as docker and sparkctl's records write them (ISO 8601, docker's nanoseconds and Z
included), read as Unix timestamps: status ages, and which of two containers started first."""

from __future__ import annotations

import itertools
import time
from datetime import datetime


def age(iso: str | None, now: float | None) -> int | None:
    started = parse_time(iso)
    if started is None:
        return None
    return max(0, int((now or time.time()) - started))


def parse_time(iso: str | None) -> float | None:
    """An ISO time (docker's nanoseconds and Z included) as a timestamp; None if not one."""
    if not iso or iso.startswith("0001-"):
        return None
    text = iso.replace("Z", "+00:00")
    if "." in text:  # docker prints nanoseconds; fromisoformat takes at most microseconds
        head, _, rest = text.partition(".")
        digits = "".join(itertools.takewhile(str.isdigit, rest))
        zone = rest[len(digits):]
        text = f"{head}.{digits[:6]}{zone}"
    try:
        started = datetime.fromisoformat(text)
    except ValueError:
        return None
    if started.tzinfo is None:
        return None
    return started.timestamp()
