"""What to do about a finding: the next step and what to try if it does not clear the fault.

The severity ladder (monitor < reset < reboot < isolate) says how bad a finding is and what the agent
does (a taint from `reset` up). An operator or a remediation controller also needs the step that
fixes it, and the one after. The steps follow NVIDIA's resolution buckets (the Xid catalog's
"immediate action": RESTART_APP, RESET_GPU, RESTART_BM, CHECK_MECHANICALS, UPDATE_SWFW, ...), in
the order NVIDIA escalates them: restart the application → reset the GPU → reboot → service.
A warning before a fault (checks/trends.py) names `watch` or `plan-service`: nothing fails yet.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from agent.core.severity import Severity


class Action(str, enum.Enum):
    WATCH = "watch"  # nothing to do now; act if it recurs or grows
    PLAN_SERVICE = "plan-service"  # still works, wearing out: replace or repair at the next window
    RESTART_APP = "restart-app"  # the GPU is fine; the application faulted
    RESTART_FABRIC_MANAGER = "restart-fabric-manager"
    UPDATE_SOFTWARE = "update-software"  # driver / firmware
    RESET_GPU = "reset-gpu"  # nvidia-smi -r on a drained GPU
    REBOOT = "reboot"
    RESEAT = "reseat"  # check power and seating: hands on the machine
    SERVICE = "service"  # replace or send for repair (RMA)

    @property
    def text(self) -> str:
        return ACTION_TEXT[self]


ACTION_TEXT = {
    Action.WATCH: "nothing to do now; act if it recurs or grows",
    Action.PLAN_SERVICE: "the GPU still works but is wearing out: plan its repair or replacement "
    "(RMA) at the next maintenance window, and move long jobs off it",
    Action.RESTART_APP: "restart the application (the GPU is not at fault)",
    Action.RESTART_FABRIC_MANAGER: "restart NVIDIA Fabric Manager",
    Action.UPDATE_SOFTWARE: "update the GPU driver or firmware",
    Action.RESET_GPU: "drain the GPU's workloads and reset the GPU (nvidia-smi -r)",
    Action.REBOOT: "drain the node and reboot it",
    Action.RESEAT: "check the GPU's power and seating",
    Action.SERVICE: "take the node out of service: replace or repair the GPU",
}

# The escalation after each step: what to do when the step did not clear the fault.
LADDER = (Action.RESTART_APP, Action.RESET_GPU, Action.REBOOT, Action.SERVICE)
_AFTER = {
    Action.WATCH: (Action.RESET_GPU, Action.REBOOT, Action.SERVICE),
    Action.PLAN_SERVICE: (Action.SERVICE,),
    Action.RESTART_FABRIC_MANAGER: (Action.REBOOT, Action.SERVICE),
    Action.UPDATE_SOFTWARE: (Action.REBOOT, Action.SERVICE),
    Action.RESEAT: (Action.SERVICE,),
}

BY_SEVERITY = {
    Severity.NONE: Action.WATCH,
    Severity.MONITOR: Action.WATCH,
    Severity.RESET: Action.RESET_GPU,
    Severity.REBOOT: Action.REBOOT,
    Severity.ISOLATE: Action.SERVICE,
}

# NVIDIA's immediate-action buckets (the Xid catalog's `nvidia` column) → our step.
NVIDIA_BUCKETS = {
    "RESTART_APP": Action.RESTART_APP,
    "IGNORE": Action.WATCH,
    "WORKFLOW_XID_13": Action.RESTART_APP,
    "WORKFLOW_XID_31": Action.RESTART_APP,
    "RESET_GPU": Action.RESET_GPU,
    "WORKFLOW_XID_48": Action.RESET_GPU,
    "WORKFLOW_NVLINK_ERR": Action.RESET_GPU,
    "WORKFLOW_NVLINK5_ERR": Action.RESET_GPU,
    "CHECK_UVM": Action.RESET_GPU,
    "RESTART_BM": Action.REBOOT,
    "RESTART_VM": Action.REBOOT,
    "CHECK_MECHANICALS": Action.RESEAT,
    "UPDATE_SWFW": Action.UPDATE_SOFTWARE,
    "WORKFLOW_XID_45": Action.RESTART_FABRIC_MANAGER,
    "CONTACT_SUPPORT": Action.SERVICE,
}


@dataclass(frozen=True)
class Recommendation:
    action: Action
    escalation: tuple[Action, ...]

    def describe(self) -> str:
        """ "reboot (then: service)": what an Event or a table shows."""
        then = f" (then: {', '.join(a.value for a in self.escalation)})" if self.escalation else ""
        return f"{self.action.value}{then}"

    def as_dict(self) -> dict[str, object]:
        return {"action": self.action.value, "escalation": [a.value for a in self.escalation]}

    @classmethod
    def from_dict(cls, doc: Mapping[str, object]) -> Recommendation | None:
        """as_dict's inverse; None when the entry carries none (or steps this version does not know)."""
        then = doc.get("escalation")
        steps = then if isinstance(then, list) else []
        try:
            return cls(Action(str(doc["action"])), tuple(Action(str(a)) for a in steps))
        except (KeyError, TypeError, ValueError):
            return None


def escalation(action: Action) -> tuple[Action, ...]:
    if action in _AFTER:
        return _AFTER[action]
    return LADDER[LADDER.index(action) + 1 :]


def recommend(severity: Severity, explicit: Action | None = None) -> Recommendation:
    """The finding's own step when its check named one (an Xid's NVIDIA bucket, a rule's), else the
    step its severity implies; and the escalation after it."""
    action = explicit or BY_SEVERITY[severity]
    return Recommendation(action, escalation(action))


def from_nvidia_bucket(bucket: str) -> Action | None:
    """NVIDIA's immediate-action bucket as a step; None where the catalog leaves it blank."""
    return NVIDIA_BUCKETS.get(bucket.strip().upper()) if bucket else None
