"""The conditions remediation engines act on (`node.remediationConditions`): an entry, the reasons ours
carry, and what the engine wants each to say."""

from __future__ import annotations

from dataclasses import dataclass
from enum import unique

from agent.core.node_keys import ConditionReason
from agent.core.remediation_reasons import STYLE_OURS, FaultReason, our_reasons
from agent.core.severity import Severity
from agent.core.vocabulary import Vocabulary

TRUE_FALSE = ("True", "False")


@dataclass(frozen=True)
class RemediationCondition:
    """One entry of `node.remediationConditions`: a NodeCondition type a remediation engine watches
    (Karpenter/EKS node repair, a Cluster API MachineHealthCheck, a medik8s NodeHealthCheck), written
    at `unhealthy_status` while the node carries our taint for a failure at `min_severity` or above
    (after hysteresis), and at the other of True/False otherwise."""

    type: str
    unhealthy_status: str = "False"  # "True" | "False"
    min_severity: Severity = Severity.RESET
    reason_style: str = STYLE_OURS  # the unhealthy reason's names: ours, or "eks" (remediation_reasons)

    @property
    def healthy_status(self) -> str:
        return TRUE_FALSE[1] if self.unhealthy_status == TRUE_FALSE[0] else TRUE_FALSE[0]


@unique
class RemediationReason(Vocabulary):
    """The reasons of the remediation conditions: distinct from every other component's, so that the
    agent (and the admission fence) can tell a condition it wrote from one it must never touch.
    The unhealthy status's reason while it fails names the fault and the action (a FaultReason, from
    core/remediation_reasons.py); those of `reasonStyle: eks` are the EKS agent's, never ours."""

    FAILED = "GPUHealthcheckFailed"  # unhealthy, written before the vocabulary: still ours to remove
    RECOVERING = "GPUHealthcheckRecovering"  # unhealthy still: recovering, or paused by an unknown cycle
    PASSED = "GPUHealthcheckPassed"  # healthy: pass or warn
    BELOW_MIN_SEVERITY = "GPUHealthcheckBelowMinSeverity"  # healthy: a failure below this minSeverity
    COULD_NOT_CHECK = "GPUHealthcheckCouldNotCheck"  # healthy: unknown never marks a node unhealthy
    BRAKE_HELD = "GPUHealthcheckBrakeHeld"  # healthy: the brake holds this node back
    TAINT_DISABLED = "GPUHealthcheckTaintDisabled"  # healthy: <prefix>/taint=disabled on the Node
    NOT_ENFORCED = "GPUHealthcheckNotEnforced"  # healthy: node.mode observe or label, or no taint
    BUDGET_HELD = "GPUHealthcheckBudgetHeld"  # healthy: node.repairBudget is spent for this window
    WAVE_HELD = "GPUHealthcheckWaveHeld"  # healthy: a correlated wave on this finding key (node.waveHold)


# Every reason of ours a remediation condition can carry: the fixed ones and the fault-class ones.
OUR_REMEDIATION_REASONS: tuple[str, ...] = (*RemediationReason, *our_reasons())
# Ours with the unhealthy status: the vocabulary, RECOVERING, and FAILED of older versions.
UNHEALTHY_REMEDIATION_REASONS: tuple[str, ...] = (
    RemediationReason.FAILED,
    RemediationReason.RECOVERING,
    *our_reasons(),
)


# Every reason a condition of ours can carry: the admission fence lets the agent delete a condition of
# a type no longer configured only when it carries one of these (it was ours).
OUR_CONDITION_REASONS: tuple[str, ...] = (*ConditionReason, *OUR_REMEDIATION_REASONS)


@dataclass(frozen=True)
class RemediationMark:
    """What the engine wants one remediation condition to say. `unhealthy` is the engine's wish (mode
    `taint`, a failure at minSeverity or above, hysteresis); the writer writes the unhealthy status
    only where our taint is on after the brake, and says why not otherwise."""

    type: str
    unhealthy_status: str
    unhealthy: bool
    # while the wish stands (a FaultReason, or RECOVERING), or why the node is not unhealthy
    reason: RemediationReason | FaultReason
    message: str
    key: str = ""  # the finding key a new mark is counted under (core/repair_budget.finding_key)

    @property
    def healthy_status(self) -> str:
        return RemediationCondition(self.type, self.unhealthy_status).healthy_status
