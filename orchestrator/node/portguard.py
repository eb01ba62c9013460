"""A server's port guard on one node (node side; runs as root; Python 3.8+, standard library only).

Some servers' control planes have no authentication and listen on every interface whatever
address they are given (Ray 2.60's GCS and raylet: `--node-ip-address` picks the address they
announce, not the one they bind). The guard is one iptables chain per server, hooked first in
INPUT, for IPv4 and IPv6 alike:

    -A <chain> -i lo -j RETURN                      (the node itself)
    -A <chain> -i <each fabric interface> -j RETURN (the server's peers)
    -A <chain> -p tcp -m multiport --dports <ports> -j REJECT --reject-with tcp-reset
    -A <chain> -p tcp --dport <lowest>:<highest> -j REJECT --reject-with tcp-reset

so the server's ports answer on loopback and the fabric only; every other interface (the
management network) is refused. RETURN, not ACCEPT: the guard never opens what the node's own
firewall closes. The jump carries a comment naming the chain's container, so a chain whose
container no longer runs is found and removed by the next install.

Usage: python3 portguard.py MODE JSON
  state   CONFIG: print {"current": the chain and hook are exactly CONFIG's, "ranges": the
          port ranges the chain closes now, "leftovers": other chains of the prefix whose
          container is not running} (no change). CONFIG's "ranges" null: "current" leaves
          them out (the controller picks a server's Ray worker range after asking)
  install CONFIG = {"chain", "container", "interfaces", "ports", "ranges", "prefix"}: make the
          chain exactly that (atomically, iptables-restore --noflush: no moment with the ports
          open), hook it, remove the leftovers; print {"changed", "removed": [chains]}
  remove  {"chain"} or {"all": true}: unhook and delete that chain, or every `sparkctl-...`
          chain; print {"removed": [chains]}
  list    {}: print {"chains": every `sparkctl-...` chain} (no change)
Exit 3 with {"missing": ...} when iptables (or ip6tables) is not installed: never silently open.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys

os.environ["PATH"] = os.environ.get("PATH", "/usr/bin:/bin") + ":/usr/local/sbin:/usr/sbin:/sbin"
TOOLS = ("iptables", "ip6tables")
MISSING = 3
COMMENT = "sparkctl port guard for "
REJECT = ["-j", "REJECT", "--reject-with", "tcp-reset"]
ALL_PREFIX = "sparkctl-"
MULTIPORT_MAX = 15  # iptables' multiport match takes at most 15 ports


def run(argv, data=None):
    proc = subprocess.run(argv, input=data, capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout, proc.stderr


def missing_tools():
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def chain_rules(config):
    """The chain's rules, as `iptables -S CHAIN` prints them (so the installed state compares)."""
    chain = config["chain"]
    rules = ["-A %s -i lo -j RETURN" % chain]
    rules += ["-A %s -i %s -j RETURN" % (chain, iface) for iface in config["interfaces"]]
    ports = sorted(set(int(p) for p in config["ports"]))
    for start in range(0, len(ports), MULTIPORT_MAX):
        group = ",".join(str(p) for p in ports[start:start + MULTIPORT_MAX])
        rules.append("-A %s -p tcp -m multiport --dports %s %s" % (chain, group, " ".join(REJECT)))
    for low, high in config.get("ranges") or []:
        rules.append("-A %s -p tcp -m tcp --dport %d:%d %s" % (chain, low, high, " ".join(REJECT)))
    return rules


def hook_rule(config):
    """The INPUT rule that sends every TCP packet through the chain."""
    return ["INPUT", "-p", "tcp", "-m", "comment", "--comment",
            COMMENT + config["container"], "-j", config["chain"]]


def listed(tool, chain):
    """`-S CHAIN` without its `-N` line, or None when the chain does not exist."""
    rc, out, _ = run([tool, "-w", "-S", chain])
    if rc != 0:
        return None
    return [line for line in out.splitlines() if line and not line.startswith("-N ")]


def hooks(tool, chain):
    """INPUT's rules that jump to CHAIN, as `-S INPUT` prints them."""
    rc, out, _ = run([tool, "-w", "-S", "INPUT"])
    return [line for line in out.splitlines() if rc == 0 and line.endswith("-j " + chain)]


def range_of(rule):
    """[lowest, highest] of a chain's `--dport LOW:HIGH` rule, or None for any other rule."""
    words = rule.split()
    if "--dport" not in words:
        return None
    low, _, high = words[words.index("--dport") + 1].partition(":")
    return [int(low), int(high or low)]


def state(config):
    """Whether the chain and its hook are exactly as CONFIG wants, in both tables (its port
    ranges aside when CONFIG's are null), the ranges it closes, and which other chains of the
    prefix are left over (their container does not run)."""
    chain, want = config["chain"], chain_rules(config)
    known = config.get("ranges") is not None
    found = {tool: listed(tool, chain) for tool in TOOLS}
    closed = [r for r in map(range_of, found["iptables"] or []) if r is not None]
    if not known:
        found = {tool: None if rules is None else [r for r in rules if range_of(r) is None]
                 for tool, rules in found.items()}
    current = all(found[tool] == want and len(hooks(tool, chain)) == 1
                  and run([tool, "-w", "-C", *hook_rule(config)])[0] == 0 for tool in TOOLS)
    return {"current": current, "ranges": closed,
            "leftovers": leftovers(config["prefix"], [chain])}


def install(config):
    chain, want = config["chain"], chain_rules(config)
    changed = False
    for tool in TOOLS:
        if listed(tool, chain) != want:
            # declaring the chain in a --noflush restore creates or empties it; the new rules
            # replace the old in one commit
            text = "*filter\n:%s - [0:0]\n%s\nCOMMIT\n" % (chain, "\n".join(want))
            rc, _, err = run([tool + "-restore", "-w", "--noflush"], text)
            if rc != 0:
                raise SystemExit(fail("%s-restore refused the chain %s: %s" % (tool, chain, err)))
            changed = True
        found = hooks(tool, chain)
        hook = hook_rule(config)
        if len(found) != 1 or run([tool, "-w", "-C", *hook])[0] != 0:
            for line in found:
                run([tool, "-w", *unhook_listed(line)])
            rc, _, err = run([tool, "-w", "-I", hook[0], "1", *hook[1:]])
            if rc != 0:
                raise SystemExit(fail("%s could not hook %s into INPUT: %s" % (tool, chain, err)))
            changed = True
    removed = leftovers(config["prefix"], [chain])
    for other in removed:
        drop_chain(other)
    return {"changed": changed, "removed": removed}


def our_chains(tool, prefix):
    rc, out, _ = run([tool, "-w", "-S"])
    return [line.split()[1] for line in out.splitlines()
            if rc == 0 and line.startswith("-N " + prefix)]


def container_of(tool, chain):
    for line in hooks(tool, chain):
        if COMMENT in line:
            return line.split(COMMENT, 1)[1].split('"', 1)[0].split()[0]
    return None


def drop_chain(chain):
    for tool in TOOLS:
        for line in hooks(tool, chain):
            run([tool, "-w", *unhook_listed(line)])
        run([tool, "-w", "-F", chain])
        run([tool, "-w", "-X", chain])


def unhook_listed(line):
    """`-A INPUT ... --comment "a b" -j C` -> argv for -D (the comment's quotes respected)."""
    return ["-D", *shlex.split(line)[1:]]


def all_chains():
    """Every chain of sparkctl's (named `sparkctl-...`: sparkctl makes no other) in either table."""
    return sorted({c for tool in TOOLS for c in our_chains(tool, ALL_PREFIX)})


def remove(config):
    chains = all_chains() if config.get("all") else [config["chain"]]
    removed = [chain for chain in chains if any(listed(tool, chain) is not None for tool in TOOLS)]
    for chain in removed:
        drop_chain(chain)
    return {"removed": removed}


def list_chains(config):
    return {"chains": all_chains()}


def running(container):
    rc, out, _ = run(["docker", "inspect", "-f", "{{.State.Running}}", container])
    return rc == 0 and out.strip() == "true"


def leftovers(prefix, keep):
    """The chains of PREFIX (but KEEP) whose container is not running."""
    chains = sorted({c for tool in TOOLS for c in our_chains(tool, prefix)} - set(keep))
    return [chain for chain in chains
            if not running(container_of("iptables", chain) or container_of("ip6tables", chain)
                           or "")]


def fail(message):
    print(json.dumps({"error": message}))
    return 1


def main(argv):
    mode, config = argv[1], json.loads(argv[2])
    missing = missing_tools()
    if missing:
        print(json.dumps({"missing": missing}))
        return MISSING if mode in ("install", "state") else 0
    actions = {"state": state, "install": install, "remove": remove, "list": list_chains}
    print(json.dumps(actions[mode](config)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
