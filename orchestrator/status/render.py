"""Rendering `sparkctl status` for people (the JSON is the assessed dict itself)."""

from __future__ import annotations

from typing import Any


def human_duration(seconds: int | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 60:
        return f"{seconds}s"
    minutes, _ = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m"


# ------------------------------------------------------------------ rendering

STATE_STYLE = {"up": "green", "serving": "green", "healthy": "green", "not-set-up": "dim",
               "network-only": "cyan", "problem": "bold red", "unreachable": "bold red",
               "degraded": "bold red", "starting": "yellow", "down": "bold red",
               "unhealthy": "bold red", "partial": "yellow", "stalled": "bold red",
               "dead": "bold red", "guard-stopped": "bold red"}


def _styled(value: str) -> str:
    style = STATE_STYLE.get(value)
    return f"[{style}]{value}[/]" if style else value


def render_status(status: dict[str, Any]) -> None:
    from rich.markup import escape

    from orchestrator.core.output import console, print_table
    from orchestrator.status.memory import memory_text

    out = console()
    rows = []
    for name, node in status["nodes"].items():
        label = f"{name} ({node['role']})"
        if not node["reachable"]:
            rows.append([label, _styled("unreachable"), "-", "-", "-"])
            continue
        fabric = []
        for iface, link in node["network"]["interfaces"].items():
            mark = "" if link["ok"] else " [red]![/]"
            addresses = ",".join(link["addresses"]) or "no address"
            fabric.append(f"{iface} {link['state']} {addresses} mtu {link['mtu']}{mark}")
        if not node["network"]["configured"]:
            fabric.append("[dim]not configured by sparkctl[/]")
        rows.append([label, _styled(node["state"]), "\n".join(fabric),
                     _container_cell(node["container"]),
                     escape(memory_text(node.get("memory") or {}))])
    print_table(f"sparkctl status: {status['cluster']} ({_styled(status['state'])})",
                ("node", "state", "fabric", "container", "memory"), rows)
    server = status.get("server")
    if server is None and status.get("server_unknown"):
        out.print(f"server: unknown: {escape(status['server_unknown'])}")
    elif server is None and not status.get("servers"):
        out.print("server: none launched")
    elif server is None:
        out.print(servers_line("servers", status["servers"]), markup=True)
    else:
        out.print(
            f"server: {_styled(server['state'])} {server.get('recipe')} "
            f"({escape(str(server.get('engine')))}: {server.get('model')}"
            + (f", draft {server['draft_model']}" if server.get("draft_model") else "")
            + f"), {server['endpoint']} on {server.get('node')} (`sparkctl tunnel` forwards it), "
            + f"up {human_duration(server.get('uptime_seconds'))}",
            markup=True,
        )
        out.print("  " + escape(persistence_text(server.get("persistence") or {})))
        others = [s for s in status.get("servers") or [] if not s.get("legacy")]
        if others:
            out.print(servers_line("other servers", others), markup=True)
        ray = server.get("ray")
        if ray is not None:
            ips = ", ".join(f"{n.get('host')} {n.get('ip')}" for n in ray.get("nodes") or []
                            if n.get("alive"))
            out.print(f"  ray: {ray['alive']}/{ray['expected']} node(s) alive"
                          + (f" ({escape(ips)})" if ips else "")
                          + (f"; {escape(ray['error'])}" if ray.get("error") else "")
                          + (f"; its container is not running on {', '.join(ray['containers_not_running'])}"
                             if ray.get("containers_not_running") else ""))
        if server["state"] != "healthy" and server.get("log_tail"):
            out.print("  last lines of its log (`sparkctl logs` for more):")
            for line in server["log_tail"]:
                out.print("    " + line, markup=False)
    problems = [(name, p) for name, node in status["nodes"].items() for p in node["problems"]]
    for name, problem in problems:
        out.print(f"[bold red]✗[/] {name}: {escape(problem)}")
    out.print(("[green]OK[/]" if status["ok"] else "[bold red]UNHEALTHY[/]")
                  + f" in {status.get('seconds', 0):.1f}s")


def servers_line(title: str, listed: list[dict[str, Any]]) -> str:
    """`servers: 2: a (sglang on spark-b, healthy), ...` for the status header."""
    from rich.markup import escape

    return f"{title}: {len(listed)}: " + ", ".join(
        f"{escape(str(s.get('name')))} ({s.get('engine')} on "
        f"{','.join(map(str, s.get('nodes') or [s.get('node')]))}, {_styled(str(s.get('state')))}"
        + _key_words(s) + ")"
        for s in listed)


def _key_words(server: dict[str, Any]) -> str:
    """", HOST with API key" only when the server refused a guarded path without it."""
    from orchestrator.status.server import key_state

    state = key_state(server)
    if state is None:
        return ""
    return {"enforced": f", {server.get('host')} with API key",
            "not enforced": f", {server.get('host')}, [bold red]API key NOT enforced[/]"}.get(
        str(state), f", {server.get('host')}, API key set (not verified: no answer)")


def _container_cell(container: dict[str, Any]) -> str:
    status = container["status"]
    if status == "absent":
        return "[dim]none[/]"
    if status == "unknown":
        from rich.markup import escape

        return f"[yellow]unknown[/]: {escape(str(container.get('why') or 'could not look'))}"
    parts = [_styled("up") if status == "running" else _styled(status)]
    if container.get("uptime_seconds") is not None:
        parts.append(human_duration(container["uptime_seconds"]))
    digest = container.get("digest") or container.get("image_id") or ""
    if digest:
        parts.append(digest.split(":")[-1][:12])
    if container.get("config"):
        parts.append(f"config {container['config']}")
    return " ".join(parts)


def persistence_text(found: dict[str, Any]) -> str:
    """`persistent: yes (...)` / `persistent: no`, for status (launch --persist)."""
    if not found.get("persistent"):
        return "persistent: no (`sparkctl launch --persist` brings a server back after a reboot)"
    text = f"persistent: yes, {found['unit']} enabled on {', '.join(found['nodes'])}"
    if found.get("disabled_on"):
        text += f" (disabled on {', '.join(found['disabled_on'])}: it will not come back there)"
    return text
