"""What `sparkctl down` (the whole cluster) does about the gateway.

The gateway's config (the keys) goes with /etc/sparkctl; its router and relays are plain
processes (orchestrator/node/gateway_router.py and relay.py, detached with setsid), so without
this step they would outlive `down`: found by their pid files and command lines and stopped
here, and the verify step names any still running. Its boot unit goes with them, and the
router's unpacked wheel (/opt/sparkctl/sglang-router-<version>, any version an earlier
sparkctl unpacked too, and a staging folder an interrupted install left) after them: the
verify step names any of them still there.
"""

from __future__ import annotations

from typing import Any

from orchestrator.commands import quote
from orchestrator.core.step import Change, NodeContext, Outcome, Step, Unchanged
from orchestrator.phases import gateway_spec as gs

DRAIN_TIMEOUT = 120.0
"""Seconds `down --server` waits for a replica's requests through the gateway to finish."""


def router_trees(install_dir: str = gs.INSTALL_DIR) -> str:
    """Every router tree a sparkctl unpacked (shell patterns), and what an interrupted unpack
    left (orchestrator/node/router_install.py stages beside the tree)."""
    return f"{quote(install_dir)}/{gs.ROUTER_DIST}-* {quote(install_dir)}/.staging-*"


def router_trees_cmd(install_dir: str = gs.INSTALL_DIR) -> str:
    """The router trees on the node, one a line."""
    return f"for d in {router_trees(install_dir)}; do [ -e \"$d\" ] && echo \"$d\"; done; true"


def remove_router_cmd(install_dir: str = gs.INSTALL_DIR) -> str:
    """The router trees removed, and INSTALL_DIR with them when nothing else is in it."""
    return f"rm -rf -- {router_trees(install_dir)}; rmdir {quote(install_dir)} 2>/dev/null; true"


def facts() -> dict[str, Any]:
    return {"commands": {"gateway_relays": gs.relay_pids_cmd(),
                         "gateway_boot_unit": f"[ -e {quote(gs.BOOT_UNIT_PATH)} ] && echo "
                                              "present; true",
                         "gateway_router_trees": router_trees_cmd()}}


def relay_pids(ctx: NodeContext) -> list[str]:
    return [p for p in ctx.facts.output("gateway_relays").split() if p.isdigit()]


class StopRelays(Step):
    """Stop every gateway relay on the node (all of them: `down` removes the gateway) and
    remove the gateway's boot unit."""

    name = "gateway-relays"

    def check(self, ctx: NodeContext) -> Outcome:
        pids = relay_pids(ctx)
        unit = "present" in ctx.facts.output("gateway_boot_unit")
        if not pids and not unit:
            return Unchanged("no gateway relay")
        what = [f"stop {len(pids)} gateway relay(s) (pid {', '.join(pids)})"] if pids else []
        what += [f"remove {gs.BOOT_UNIT}"] if unit else []
        # the unit first: nothing it would start again at the next boot is left
        return Change(", ".join(what), commands=(gs.boot_remove_cmd(), gs.stop_relays_cmd()))


class RemoveRouter(Step):
    """Remove the router's unpacked wheel (after StopRelays stopped the router it runs)."""

    name = "gateway-router"

    def check(self, ctx: NodeContext) -> Outcome:
        trees = ctx.facts.output("gateway_router_trees").split()
        if not trees:
            return Unchanged("no gateway router installed")
        return Change(f"remove {', '.join(trees)}", commands=(remove_router_cmd(),))


def verify_line() -> str:
    """For `down`'s verify step: one line per relay still running, the gateway's boot unit and
    each router tree still there."""
    return (f"{{ {gs.relay_pids_cmd()}; }} | sed 's/^/gateway relay: pid /'; "
            f"[ ! -e {quote(gs.BOOT_UNIT_PATH)} ] || echo 'boot unit: {gs.BOOT_UNIT_PATH}'; "
            f"{router_trees_cmd()} | sed 's/^/gateway router: /'")


def server_relay_facts(server: str) -> dict[str, Any]:
    pid = gs.relay_paths(server)["pidfile"]
    return {"commands": {f"gateway_relay_{server}":
                         f"[ -f {quote(pid)} ] && kill -0 $(cat {quote(pid)}) 2>/dev/null "
                         "&& echo alive; true"}}


class LeaveGateway(Step):
    """`down --server NAME`, before its engine stops: take it out of the router (`DELETE
    /workers/ID`) and close its relay's door, wait for its requests in flight, stop the
    relay."""

    name = "gateway-leave"

    def __init__(self, server: str) -> None:
        self.server = server

    def check(self, ctx: NodeContext) -> Outcome:
        if "alive" not in ctx.facts.output(f"gateway_relay_{self.server}"):
            return Unchanged(f"{self.server} is not behind the gateway here")
        return Change(f"take {self.server} out of the gateway and let its requests finish "
                      f"(up to {DRAIN_TIMEOUT:.0f} s)")

    def apply(self, ctx: NodeContext, change: Change) -> str | None:
        from orchestrator.phases.gateway_relays import drain

        if ctx.transport is None:  # only a dry run has none, and it applies nothing
            return None
        drained = drain(ctx.transport, self.server, DRAIN_TIMEOUT, lambda _line: None,
                        ctx.transports or {ctx.node.name: ctx.transport})
        ctx.run(gs.relay_signal_cmd(self.server, "TERM"), sudo=True, timeout=30,
                display=f"stop the relay of {self.server}").check()
        return "drained" if drained else (f"requests still in flight after {DRAIN_TIMEOUT:.0f} s "
                                          "(the router retries them on another replica)")
