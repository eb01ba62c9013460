"""`sparkctl doctor ssh`: how each node's connection resolved, and which step fails.

Per node: the resolution (host, port, user, keys and where they came from, ssh-agent, jump
hosts, known_hosts files), then the steps in order (TCP to the first hop, host keys of every
hop, authentication, sudo), each with the exact fix when it fails. Read-only: nothing is pinned
and nothing changes on a node.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

from orchestrator.errors import HostKeyError, SparkctlError, TransportError
from orchestrator.inventory import Inventory, Node

SUDO_FIX = ("run sparkctl from a terminal (it asks once and tries the password on every node), "
            "name a 0600 file in sudo_password_file, or allow passwordless sudo for {user}")


def _resolution(route: Any, agent_count: int | None) -> dict[str, Any]:
    target = route.target
    return {
        "alias": target.alias,
        "host": target.hostname,
        "port": target.port,
        "user": target.user,
        "sources": dict(target.sources),
        "keys": [{"path": str(k.path), "source": k.source} for k in target.key_files],
        "agent": ("no agent ($SSH_AUTH_SOCK unset)" if agent_count is None
                  else f"{agent_count} key(s)"),
        "agent_used": target.allow_agent,
        "jumps": [hop.describe() for hop in route.jumps],
        "proxy_command": target.proxy_command,
        "ssh_config": str(route.config_file) if route.config_file else None,
        "pinned_known_hosts": str(route.pinned),
        "known_hosts": [str(f) for f in route.known_hosts_files(target) if f.exists()],
        "warnings": list(route.warnings),
    }


def _step(name: str, status: str, detail: str = "", fix: str = "") -> dict[str, str]:
    return {"step": name, "status": status, "detail": detail, "fix": fix}


def _known_in(route: Any, hop: Any, key: Any) -> str:
    import paramiko

    name = hop.hostname if hop.port == 22 else f"[{hop.hostname}]:{hop.port}"
    for path in route.known_hosts_files(hop):
        if not path.is_file():
            continue
        try:
            entries = paramiko.HostKeys(str(path)).lookup(name)
        except (OSError, paramiko.SSHException):
            continue
        if entries is not None and entries.get(key.get_name()) == key:
            return str(path)
    return "?"


def diagnose_node(inventory: Inventory, node: Node) -> dict[str, Any]:
    from orchestrator.remote import sshkeys
    from orchestrator.remote.connect import AuthError, ReachError, _Retryable, open_route
    from orchestrator.remote.sshconfig import resolve
    from orchestrator.remote.transport import SSHTransport, SudoPassword

    out: dict[str, Any] = {"node": node.name, "ok": False, "steps": []}
    steps: list[dict[str, str]] = out["steps"]
    try:
        route = resolve(inventory, node)
    except SparkctlError as exc:
        steps.append(_step("resolve", "fail", str(exc), "fix the inventory or ssh_config named"))
        return out
    agent, agent_keys = sshkeys.agent_keys()
    if agent is not None:
        agent.close()
    out["resolution"] = _resolution(route, None if agent is None else len(agent_keys))
    first = route.hops[0]
    if first.proxy_command:
        steps.append(_step("tcp", "skip", f"through ProxyCommand `{first.proxy_command}`"))
    else:
        try:
            socket.create_connection((first.hostname, first.port), timeout=first.connect_timeout).close()
            steps.append(_step("tcp", "ok", f"{first.address} answers"))
        except OSError as exc:
            steps.append(_step("tcp", "fail", f"{first.address}: {exc.strerror or exc}",
                               f"check HostName/port of {first.alias} (`ssh -v {first.alias}`), "
                               "that sshd runs there and that this machine can reach it"))
            return out
    try:
        client, jumps = open_route(route, False, threading.Lock())
    except HostKeyError as exc:
        fix = ("remove the stale line and verify the new fingerprint" if "CHANGED" in str(exc)
               else "run once with --trust-new-hosts, or add the key with the ssh-keyscan line above")
        steps.append(_step("host key", "fail", str(exc), fix))
        return out
    except AuthError as exc:
        steps.append(_step("host key", "ok", "every hop's key is known"))
        if "no key to offer" in str(exc):
            fix = ("`ssh-add` your key (agent is empty)" if agent is not None and not agent_keys
                   else "name a key (cluster.ssh_key or IdentityFile), or start ssh-agent and `ssh-add`")
        elif "no terminal" in str(exc):
            fix = "`ssh-add` the key named above, or run from a terminal to type its passphrase"
        else:
            from orchestrator.remote.sshkeys import copy_id_hint

            key = route.target.key_files[0].path if route.target.key_files else None
            fix = (f"add your public key to ~{route.target.user}/.ssh/authorized_keys "
                   f"(`{copy_id_hint(route.target, key)}`)")
        steps.append(_step("auth", "fail", str(exc), fix))
        return out
    except (ReachError, _Retryable, TransportError) as exc:
        steps.append(_step("connect", "fail", str(exc), "check the jump host(s) can reach the node, "
                           "and the node's HostName and port"))
        return out
    key = client.get_transport().get_remote_server_key()
    steps.append(_step("host key", "ok", f"{key.get_name()} known in {_known_in(route, route.target, key)}"
                       + (f" ({len(jumps)} jump host(s) verified too)" if jumps else "")))
    result = getattr(client, "sparkctl_auth", None)
    used = repr(result[-1].source) if result else "?"
    steps.append(_step("auth", "ok", f"as {route.target.user} with {used}"))
    transport = SSHTransport(node.name, client, route.target.user, SudoPassword(prompt=False),
                             30, jumps=jumps)
    try:
        if route.target.user == "root":
            steps.append(_step("sudo", "ok", "logged in as root"))
        else:
            result = transport.run("sudo -n true", timeout=30)
            if result.ok:
                steps.append(_step("sudo", "ok", "passwordless"))
            elif "password is required" in result.stderr or "terminal is required" in result.stderr:
                steps.append(_step("sudo", "warn", "sudo needs a password",
                                   SUDO_FIX.format(user=route.target.user)))
            else:
                steps.append(_step("sudo", "fail", result.stderr.strip()[-300:],
                                   f"{route.target.user} must be allowed to sudo on the node"))
    except TransportError as exc:
        steps.append(_step("sudo", "fail", str(exc), ""))
    finally:
        transport.close()
    out["ok"] = all(step["status"] != "fail" for step in steps)
    return out


def diagnose(inventory: Inventory, nodes: list[Node]) -> dict[str, Any]:
    from orchestrator.remote.cluster import parallel

    outcomes = parallel(lambda name: diagnose_node(inventory, inventory.node(name)),
                        [n.name for n in nodes])
    result = {name: outcome.get() for name, outcome in outcomes.items()}
    return {"ok": all(r["ok"] for r in result.values()), "nodes": result}


def render(report: dict[str, Any]) -> None:
    from rich.markup import escape

    from orchestrator.core.output import console as make_console

    console = make_console()
    style = {"ok": "green", "fail": "bold red", "warn": "yellow", "skip": "dim"}
    for name, node in report["nodes"].items():
        res = node.get("resolution")
        console.print(f"[bold]{name}[/]")
        if res:
            src = res["sources"]
            console.print(f"  connects to {escape(res['user'])}@{escape(res['host'])}:{res['port']} "
                          f"(host {src.get('hostname')}, user {src.get('user')}, port {src.get('port')})")
            keys = ", ".join(f"{k['path']} ({k['source']})" for k in res["keys"]) or "none named"
            agent = res["agent"] + ("" if res["agent_used"] else ", IdentitiesOnly: named keys only")
            console.print(f"  keys: {escape(keys)}; ssh-agent: {escape(agent)}")
            if res["jumps"]:
                console.print(f"  through: {escape(' -> '.join(res['jumps']))}")
            if res["proxy_command"]:
                console.print(f"  ProxyCommand: {escape(res['proxy_command'])}")
            console.print(f"  ssh_config: {escape(str(res['ssh_config']))}; known_hosts: "
                          f"{escape(', '.join(res['known_hosts']) or 'none exist')} "
                          f"(pins go to {escape(res['pinned_known_hosts'])})")
            for warning in res["warnings"]:
                console.print(f"  [yellow]warning:[/] {escape(warning)}")
        for step in node["steps"]:
            mark = f"[{style[step['status']]}]{step['status']:4}[/]"
            console.print(f"  {mark} {step['step']:9} {escape(step['detail'])}")
            if step["fix"]:
                console.print(f"       [bold]fix:[/] {escape(step['fix'])}")
    console.print("[green]every node is reachable[/]" if report["ok"]
                  else "[bold red]some nodes cannot be reached as sparkctl needs[/]")
