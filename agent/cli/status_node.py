"""One node as `gpu-healthcheck status` shows it (cli/status.py builds it; the status_* sections
read it): the columns and the JSON/YAML form of a node, with nothing of how they are read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.cli import status_rollout as rollout_view

READY, NOT_READY, NO_AGENT, AGENT_UNKNOWN = "ready", "not-ready", "none", "?"


@dataclass(frozen=True)
class NodeStatus:
    """One node as `status` shows it (also its JSON/YAML form)."""

    node: str
    status: str
    severity: str
    worstFinding: str  # the JSON field names are camelCase, like the annotation's
    nextStep: str  # the worst finding's action and escalation (core/actions.py), or "-"
    lastCheck: str  # "<3m": checked less than that ago (Ready agent); "≤2d": at most that
    lastCheckMaxSeconds: int | None  # the bound behind lastCheck (None: unknown)
    agent: str  # ready | not-ready | none | ? (pods not readable)
    agentPod: str | None
    changedAt: str | None  # the results annotation's checkedAt: the last change
    taint: str | None
    instanceType: str | None
    agentVersion: str | None
    warnGpus: int = 0  # GPUs with a warning before a fault (the annotation's gpus[].warnings)
    gpus: int = 0  # GPUs in the annotation's verdict per GPU
    warnings: dict[str, int] | None = None  # trend rule → GPUs warned by it (None: none)
    # The last clear-latched request the agent acted on, when within CLEARED_WINDOW_S:
    # {at, by, reason, latches, requested[, force, failing]} (the results annotation's lastClear).
    clearedByHand: dict[str, Any] | None = None
    clearPending: dict[str, Any] | None = None  # a request on the Node no agent acted on yet
    # `gpu-healthcheck diag` (cli/status_diag.py): a request whose diag has not started, {by, reason,
    # at, level}; the last one an agent started, in the last 24 h (the results annotation's lastDiag).
    diagPending: dict[str, Any] | None = None
    lastDiag: dict[str, Any] | None = None
    rollout: rollout_view.Rollout | None = None  # its config and what mode taint would do there
    marked: str | None = None  # a node that would be marked: marked | held | pending (status_rollout)
    # While the Node carries the startup taint: {since, seconds, waitingFor} (status_validating)
    validating: dict[str, Any] | None = None
    track: str | None = None  # the agent pod's gpu-healthcheck/track label: "canary" on the image canary
    gpusInService: str = "-"  # "7/8": the GPUs serving, of those listed (cli/status_gpus.py)
    deviceTaints: list[str] | None = None  # ours "gpu-3=reboot:NoExecute", then "driver gpu-2:…"
    deviceTaintsOf: str = ""  # its DeviceTaintRules' `<prefix>/node` label value (node_label)

    @property
    def version(self) -> str:
        """The VERSION column: the version the agent wrote, and its track ("0.2.1 (canary)")."""
        return (self.agentVersion or "-") + (f" ({self.track})" if self.track else "")

    @property
    def warn(self) -> str:
        """The WARN column: "2/8" GPUs with a warning before a fault, "-" when none."""
        return f"{self.warnGpus}/{self.gpus}" if self.warnGpus else "-"

    @property
    def fresh(self) -> bool:
        return self.agent in (READY, AGENT_UNKNOWN)


__all__ = ["AGENT_UNKNOWN", "NOT_READY", "NO_AGENT", "READY", "NodeStatus"]
