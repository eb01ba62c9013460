"""The rows every check reports (netcheck, its probes, the container and NCCL checks): one
result type and one JSON shape (docs/contracts.md), so there is one renderer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.remote.fact_records import Link
from orchestrator.remote.gathered import NodeFacts

Status = Literal["pass", "warn", "fail", "skip"]
"""`skip`: the check depends on an earlier check that failed (the message says which)."""


@dataclass
class CheckResult:
    """One line of the netcheck report (the JSON keys are a contract, see docs/contracts.md)."""

    check: str
    node: str
    status: Status
    message: str
    peer: str | None = None
    interface: str | None = None
    value: float | int | str | None = None
    unit: str | None = None
    threshold: float | int | str | None = None
    fix: str = ""
    """What to do about a warn/fail; also appended to `message` in JSON for older readers."""

    def to_json(self) -> dict[str, Any]:
        message = self.message if not self.fix else f"{self.message} Fix: {self.fix}"
        return {
            "check": self.check, "node": self.node, "peer": self.peer,
            "interface": self.interface, "status": self.status, "value": self.value,
            "unit": self.unit, "threshold": self.threshold, "message": message,
            "fix": self.fix,
        }


def _link(facts: NodeFacts, interface: str) -> Link | None:
    return facts.links.links.get(interface) if facts.links else None


__all__ = ["CheckResult", "Status", "_link"]
