"""What changed between two looks, as the page's event list: a node's problems appearing and
clearing (the box guard's, the memory guard's stop record, links, containers), servers
starting, becoming healthy, failing or going away, a container restarting, and the looks
themselves failing or coming back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.dashboard.watch import Look


@dataclass(frozen=True)
class Event:
    at: float        # Unix time of the look that saw it
    subject: str     # node or server name, or "sparkctl"
    text: str
    level: str       # "problem", "ok" or "info"


def _problems(status: dict[str, Any] | None) -> dict[str, set[str]]:
    nodes = (status or {}).get("nodes") or {}
    return {name: set(node.get("problems") or []) for name, node in nodes.items()}


def _servers(status: dict[str, Any] | None) -> dict[str, str]:
    return {str(s.get("name")): str(s.get("state")) for s in (status or {}).get("servers") or []}


def _uptimes(status: dict[str, Any] | None) -> dict[str, int]:
    nodes = (status or {}).get("nodes") or {}
    out = {}
    for name, node in nodes.items():
        seconds = (node.get("container") or {}).get("uptime_seconds")
        if isinstance(seconds, int):
            out[name] = seconds
    return out


def changes(last_good: Look | None, previous: Look | None, look: Look) -> list[Event]:
    """The events of `look`: against the last look that worked (a failed look in between
    changes nothing on the nodes); the first look: its problems and servers as they are."""
    at = look.taken_at
    if look.status is None:
        if previous is not None and previous.status is None and previous.error == look.error:
            return []
        return [Event(at, "sparkctl", f"could not look: {look.error}", "problem")]
    before = last_good.status if last_good is not None else None
    events: list[Event] = []
    if previous is not None and previous.status is None:
        events.append(Event(at, "sparkctl", "looking works again", "ok"))
    old, new = _problems(before), _problems(look.status)
    for node, problems in new.items():
        events.extend(Event(at, node, p, "problem") for p in sorted(problems - old.get(node, set())))
        if last_good is not None:
            events.extend(Event(at, node, f"cleared: {p}", "ok")
                          for p in sorted(old.get(node, set()) - problems))
    old_servers, new_servers = _servers(before), _servers(look.status)
    for name, state in new_servers.items():
        if old_servers.get(name) != state:
            was = old_servers.get(name)
            text = f"server {state}" + (f" (was {was})" if was else "")
            events.append(Event(at, name, text, "ok" if state == "healthy" else
                                "info" if state in ("starting", "loading") else "problem"))
    events.extend(Event(at, name, "server gone", "info") for name in old_servers
                  if name not in new_servers)
    old_up = _uptimes(before)
    for node, seconds in _uptimes(look.status).items():
        if node in old_up and seconds < old_up[node]:
            events.append(Event(at, node, "container restarted", "info"))
    return events
