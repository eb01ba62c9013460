"""netcheck's link probes: what to run on each node, and how to judge what came back.

Each node gets ONE remote command: the facts gatherer with a `probes` request (pings to every
peer address from the right interface, don't-fragment pings at the full MTU, SSH to every peer's
container sshd from the node and from inside the container, and on the head `mpirun hostname`),
all run at once on the node so a dead link costs one timeout. Judging is pure (unit-tested).
`--deep` adds a longer ping train and an iperf3 run per link, one link at a time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from orchestrator.inventory import Inventory, Node
from orchestrator.netcheck.checks import CheckResult, Link, fabric_links
from orchestrator.paths import SSH_CONFIG
from orchestrator.remote.container import ContainerCommands
from orchestrator.remote.gathered import NodeFacts, ProbeResult

MPIRUN_DEADLINE = 60
DEEP_PINGS = 50
IPERF_SECONDS = 2
IPERF_PORT_BASE = 5301
MAX_LOSS_PCT = 1.0


@dataclass(frozen=True)
class Probe:
    key: str
    kind: str
    argv: list[str]
    timeout: float
    link: Link | None = None


def _ping_argv(link: Link, count: int, interval: float, extra: list[str] | None = None) -> list[str]:
    return ["ping", "-n", "-q", "-c", str(count), "-i", str(interval), "-W", "2", *(extra or []),
            "-I", link.interface, link.peer_ip]


def build_probes(inventory: Inventory, node: Node, deep: bool) -> list[Probe]:
    """Every probe `node` runs; keys are unique per node and name the link."""
    from orchestrator.engines import up_container

    probes: list[Probe] = []
    # the cluster SSH trust, the container and mpirun exist only with an engine's `up`
    # container (TensorRT-LLM's): without one, the links are pinged only
    up = up_container(inventory)
    name = up.settings.name if up else ""
    ssh = ["ssh", "-F", SSH_CONFIG, "-o", "ConnectTimeout=5"]
    for link in fabric_links(inventory):
        if link.node != node.name:
            continue
        tag = f"{link.interface}>{link.peer_ip}"
        probes += [
            Probe(f"ping {tag}", "ping", _ping_argv(link, 3, 0.2), 15, link),
            Probe(f"mtu-ping {tag}", "mtu-ping",
                  _ping_argv(link, 2, 0.2, ["-M", "do", "-s", str(inventory.fabric.mtu - 28)]),
                  15, link),
        ]
        if up:
            probes += [
                Probe(f"ssh-node {tag}", "ssh-node",
                      ["timeout", "-k", "2", "15", *ssh, link.peer_ip, "true"], 25, link),
                Probe(f"ssh-container {tag}", "ssh-container",
                      ["timeout", "-k", "2", "20",
                       *ContainerCommands(name).exec_argv([*ssh, link.peer_ip, "true"])], 30, link),
            ]
        if deep:
            probes.append(Probe(f"latency {tag}", "latency", _ping_argv(link, DEEP_PINGS, 0.02), 30, link))
    if up and node.name == inventory.head_name and len(inventory.nodes) > 1:
        argv = ["timeout", "-k", "5", str(MPIRUN_DEADLINE + 10), *ContainerCommands(name).exec_argv(
            ["timeout", "-k", "5", str(MPIRUN_DEADLINE), "mpirun", "-np", str(len(inventory.nodes)),
             "hostname"])]
        probes.append(Probe("mpirun", "mpirun", argv, MPIRUN_DEADLINE + 30))
    return probes


def probe_request(probes: list[Probe]) -> dict[str, Any]:
    return {p.key: {"argv": p.argv, "timeout": p.timeout} for p in probes}


# ---------------------------------------------------------------- parsing and judging

def parse_ping(text: str) -> tuple[int, int, float | None]:
    """(sent, received, average rtt in ms) from iputils ping's summary."""
    counts = re.search(r"(\d+) packets transmitted, (\d+) (?:packets )?received", text)
    rtt = re.search(r"= [\d.]+/([\d.]+)/", text)
    sent, received = (int(counts.group(1)), int(counts.group(2))) if counts else (0, 0)
    return sent, received, float(rtt.group(1)) if rtt else None


NOISE = ("Warning: source address might be selected",)


def _tail(answer: ProbeResult) -> str:
    """The most telling line of a probe's output (ping's loss summary beats its warnings)."""
    out = answer.out.strip().splitlines()
    err = [line for line in answer.err.strip().splitlines()
           if line.strip() and not any(n in line for n in NOISE)]
    summary = [line for line in out if "packets transmitted" in line]
    lines = err or summary or out
    return lines[-1].strip()[:200] if lines else f"exit {answer.rc}"


def _base(kind: str, link: Link, **kwargs: Any) -> CheckResult:
    return CheckResult(kind, link.node, "pass", "", peer=link.peer, interface=link.interface, **kwargs)


def judge_ping(inventory: Inventory, link: Link, answer: ProbeResult) -> CheckResult:
    sent, received, avg = parse_ping(answer.out)
    limit = inventory.fabric.max_latency_ms
    result = _base("ping", link, value=avg, unit="ms", threshold=limit)
    route = f"{link.node} {link.interface} -> {link.peer} {link.peer_interface} ({link.peer_ip})"
    if received == 0:
        result.status = "fail"
        result.message = (f"no reply on {route}: {_tail(answer)}. Likely: the cable is cut or "
                          f"unplugged, {link.peer}'s {link.peer_interface} is down, or its address "
                          "is not the inventory's.")
        result.fix = (f"see the interface/address checks of both nodes; `ip -br addr show "
                      f"{link.peer_interface}` on {link.peer}; `sparkctl up` restores addresses")
    elif received < sent:
        result.status = "warn"
        result.message = f"{sent - received} of {sent} pings lost on {route}."
        result.fix = "a lossy link: reseat the cable; `sparkctl netcheck --deep` measures loss"
    elif avg is not None and avg > limit:
        result.status = "warn"
        result.message = f"round trip {avg:.3f} ms on {route}, above fabric.max_latency_ms."
        result.fix = "`sparkctl netcheck --deep` measures it properly"
    else:
        result.message = f"{route} answers."
    return result


def judge_mtu_ping(inventory: Inventory, link: Link, answer: ProbeResult) -> CheckResult:
    mtu = inventory.fabric.mtu
    _, received, avg = parse_ping(answer.out)
    result = _base("mtu-ping", link, value=avg, unit="ms", threshold=mtu)
    if received == 0 and inventory.topology == "switch":
        from orchestrator.phases.mtu_path import switch_mtu_message

        result.status = "fail"
        result.message = (f"{switch_mtu_message(link.node, link.interface, link.peer_ip, mtu)} "
                          f"({link.peer}; {_tail(answer)}). When the ping row of this link "
                          "passes, a switch port on the path drops jumbo frames.")
        result.fix = (f"set the switch ports to MTU >= {mtu} (jumbo frames), or fabric.mtu: 1500 "
                      "in the inventory and `sparkctl up`; if the mtu rows differ, `sparkctl up`")
    elif received == 0:
        result.status = "fail"
        result.message = (f"a {mtu}-byte don't-fragment ping from {link.node} {link.interface} to "
                          f"{link.peer} ({link.peer_ip}) got no answer ({_tail(answer)}): the MTU "
                          "differs somewhere on the path (or the link is down).")
        result.fix = (f"both ends need MTU {mtu}: check the mtu results of {link.node} and "
                      f"{link.peer}; `sparkctl up` sets it")
    else:
        result.message = f"full {mtu}-byte frames pass without fragmenting."
    return result


SSH_CAUSES = [
    ("Connection refused", "the container's sshd on {peer} is not running (container exited or "
     "sshd stopped)", "`docker logs {name}` on {peer}; `sparkctl up` restarts the container"),
    ("Permission denied", "the cluster key is not authorized on {peer} (keys not exchanged)",
     "`sparkctl up` rewrites /etc/sparkctl/authorized_keys on every node"),
    ("Host key verification failed", "{peer}'s container host key differs from the pinned one",
     "`sparkctl up` re-pins the host keys in /etc/sparkctl/known_hosts"),
    ("REMOTE HOST IDENTIFICATION HAS CHANGED", "{peer}'s container host key changed",
     "`sparkctl up` re-pins the host keys in /etc/sparkctl/known_hosts"),
    ("timed out", "the fabric path to {peer} is broken or filtered",
     "fix the ping failures first"),
    ("No route to host", "the fabric path to {peer} is broken", "fix the ping failures first"),
    ("Can't open user config file", "sparkctl's SSH files are missing on {node}",
     "run `sparkctl up`"),
    ("No such container", "the container is not running on {node}", "run `sparkctl up`"),
    ("is not running", "the container is not running on {node}", "run `sparkctl up`"),
]


def judge_ssh(inventory: Inventory, link: Link, kind: str, answer: ProbeResult) -> CheckResult:
    port = inventory.container.ssh_port
    result = _base(kind, link, value=answer.seconds, unit="s")
    origin = f"{link.node}'s container" if kind == "ssh-container" else link.node
    if answer.rc == 0:
        result.message = f"{origin} reaches {link.peer}:{port} ({link.peer_ip}) with pinned keys."
        return result
    text = answer.err + answer.out
    cause, fix = "unknown", f"run `ssh -F {SSH_CONFIG} -v {link.peer_ip} true` on {link.node}"
    if answer.rc == 124:
        cause, fix = "the connection hung", "fix the ping failures first"
    for marker, why, what in SSH_CAUSES:
        if marker.lower() in text.lower():
            cause, fix = why, what
            break
    fill = {"peer": link.peer, "node": link.node, "name": inventory.container.name}
    result.status = "fail"
    result.message = (f"ssh from {origin} to {link.peer}:{port} ({link.peer_ip}) failed: {_tail(answer)}. "
                      f"Likely: {cause.format(**fill)}.")
    result.fix = fix.format(**fill)
    return result


def judge_mpirun(inventory: Inventory, answer: ProbeResult,
                 hostnames: dict[str, str]) -> CheckResult:
    head = inventory.head_name
    want = sorted(hostnames.values())
    seen = sorted(line.strip() for line in answer.out.splitlines() if line.strip())
    result = CheckResult("mpirun", head, "pass", "", value=answer.seconds, unit="s",
                         threshold=MPIRUN_DEADLINE)
    if answer.rc == 124 or (answer.seconds or 0) >= MPIRUN_DEADLINE:
        result.status = "fail"
        result.message = (f"`mpirun -np {len(inventory.nodes)} hostname` hung for {MPIRUN_DEADLINE}s in "
                          f"{inventory.container.name} on {head}.")
        result.fix = "hostfile IPs must be fabric IPs, and every ssh check must pass; fix those first"
    elif answer.rc != 0 or sorted(set(seen)) != sorted(set(want)):
        result.status = "fail"
        result.message = (f"`mpirun -np {len(inventory.nodes)} hostname` on {head} exited "
                          f"{answer.rc} and printed {', '.join(seen) or 'nothing'} (expected "
                          f"{', '.join(want)}): {_tail(answer)}.")
        result.fix = "fix the ssh-container and hostfile checks first; then `sparkctl up --verify`"
    else:
        result.message = f"mpirun reached every container: {', '.join(seen)}."
    return result


def judge_latency(inventory: Inventory, link: Link, answer: ProbeResult) -> CheckResult:
    sent, received, avg = parse_ping(answer.out)
    limit = inventory.fabric.max_latency_ms
    loss = 100.0 * (sent - received) / sent if sent else 100.0
    result = _base("latency", link, value=avg, unit="ms", threshold=limit)
    route = f"{link.node} {link.interface} -> {link.peer} ({link.peer_ip})"
    if received == 0 or avg is None:
        result.status = "fail"
        result.message = f"no replies on {route}: {_tail(answer)}."
        result.fix = "fix the ping check first"
    elif loss > MAX_LOSS_PCT or avg > limit:
        result.status = "fail"
        result.message = (f"{route}: average round trip {avg:.3f} ms (limit {limit} ms), "
                          f"{loss:.0f}% of {sent} pings lost: a degraded cable or port, or traffic "
                          "shaping (tc qdisc) on the interface.")
        result.fix = (f"`tc qdisc show dev {link.interface}` on both nodes; reseat or replace the "
                      "cable; all-reduce latency bounds decode speed")
    else:
        result.message = f"{route}: {avg:.3f} ms average, no loss in {sent} pings."
    return result


def judge_probes(inventory: Inventory, node: Node, probes: list[Probe],
                 answers: dict[str, ProbeResult], facts_by_node: dict[str, NodeFacts]) -> list[CheckResult]:
    from orchestrator.netcheck.container import container_running

    out: list[CheckResult] = []
    running = container_running(inventory, facts_by_node.get(node.name) or NodeFacts(node.name))
    for probe in probes:
        answer = answers.get(probe.key) or ProbeResult(-1, err="the probe did not run")
        link = probe.link
        if probe.kind in ("ssh-container", "mpirun") and not running:
            continue  # the container check already failed this node
        if probe.kind == "mpirun":
            hostnames = {n: f.hostname or "?" for n, f in facts_by_node.items()}
            out.append(judge_mpirun(inventory, answer, hostnames))
            continue
        assert link is not None
        if probe.kind == "ping":
            out.append(judge_ping(inventory, link, answer))
        elif probe.kind == "mtu-ping":
            out.append(judge_mtu_ping(inventory, link, answer))
        elif probe.kind in ("ssh-node", "ssh-container"):
            out.append(judge_ssh(inventory, link, probe.kind, answer))
        elif probe.kind == "latency":
            out.append(judge_latency(inventory, link, answer))
    return out


LINK_DEPENDENT = ("mtu-ping", "latency", "ssh-node", "ssh-container", "throughput")
"""Checks over one link that cannot say anything when that link's ping failed."""


def apply_dependencies(results: list[CheckResult]) -> list[CheckResult]:
    """A check that depends on an earlier failed check is shown as skipped with the reason,
    instead of failing with a misleading cause; a fix that blames pings is only given when a
    ping on that link did fail."""
    failed_pings = {(r.node, r.interface, r.peer) for r in results
                    if r.check == "ping" and r.status == "fail"}
    unreached = sorted({r.node for r in results if r.check in ("connect", "facts") and r.status == "fail"})
    failed_ssh = [r for r in results if r.check == "ssh-container" and r.status == "fail"]
    for r in results:
        if r.status not in ("fail", "warn"):
            continue
        key = (r.node, r.interface, r.peer)
        if r.check in LINK_DEPENDENT and key in failed_pings:
            _skip(r, f"the ping from {r.node} {r.interface} to {r.peer} failed (see that row)")
        elif r.check == "mpirun" and unreached:
            _skip(r, f"{', '.join(unreached)} could not be checked (see the connect/facts rows), "
                     "so the expected hostnames are not all known")
        elif r.check == "mpirun" and failed_ssh:
            links = ", ".join(f"{x.node}->{x.peer}" for x in failed_ssh)
            _skip(r, f"ssh between containers failed ({links}; see those rows)")
        elif "ping" in r.fix and r.check != "ping":
            r.fix = (f"the ping on this link passed, so the path works: another process may hold "
                     f"the port on {r.peer} (`ss -ltnp` there), or a firewall drops it")
            if r.check == "throughput":
                r.fix = "is iperf3 installed on both nodes? " + r.fix
            elif r.check.startswith("ssh"):
                r.fix += "; `sparkctl up` restarts the container's sshd"
    return results


def _skip(result: CheckResult, reason: str) -> None:
    result.status = "skip"
    result.message = f"skipped: {reason}."
    result.fix = ""
