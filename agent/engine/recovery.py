"""The hysteresis of one mark that a failure sets (the taint, a remediation condition): set by a
failure, lifted only after recoverAfter passing gpu-tier cycles or by an operator's clear, frozen by
any cycle that could not look. Kept in the results annotation so that a restart keeps it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.core.severity import Severity, Status
from agent.core.text import shorten

CAUSE_MAX = 256  # a recovering remediation condition's cause, as the results annotation keeps it


@dataclass
class Recovery:
    """Hysteresis of one mark that a failure sets (the taint, a remediation condition): a failure at
    min_severity or above sets it; it is lifted only after recover_after gpu-tier cycles whose verdict
    was pass or warn, or at once when an operator cleared the latches. Any other cycle (unknown, or a
    failure below min_severity) freezes the count where it is: a missing signal never lifts it."""

    wanted: bool = False
    severity: Severity = Severity.NONE  # the last failing severity (the taint's value)
    passes: int = 0
    frozen: bool = False  # the last gpu cycle while set was not a pass/warn
    cause: str = ""  # what the failure that set it said

    def settle(
        self,
        status: Status,
        severity: Severity,
        new_cycle: bool,
        recover_after: int,
        min_severity: Severity,
        cleared: bool,
        cause: str = "",
    ) -> None:
        if status is Status.FAIL and severity >= min_severity:
            self.wanted, self.passes, self.frozen = True, 0, False
            self.severity, self.cause = severity, cause
        elif cleared:
            self.wanted, self.passes, self.frozen = False, 0, False  # the operator said it is fixed
        elif self.wanted and new_cycle:
            if status in (Status.PASS, Status.WARN):
                self.frozen = False
                self.passes += 1
                if self.passes >= recover_after:
                    self.wanted, self.passes = False, 0
            else:
                self.frozen = True

    def note(self, recover_after: int) -> str:
        """Why it is still set while the verdict is not a failure; "" when it is not set."""
        if not self.wanted:
            return ""
        if self.frozen:
            return (
                f"recovery paused at {self.passes}/{recover_after} passing cycles: "
                "an unknown cycle does not count as passing"
            )
        return f"recovering: {self.passes}/{recover_after} passing cycles"

    def document(self, *, with_cause: bool = False) -> dict[str, Any] | None:
        if not self.wanted:
            return None
        doc: dict[str, Any] = {"severity": self.severity.label, "passes": self.passes}
        if with_cause and self.cause:
            doc["cause"] = shorten(self.cause, CAUSE_MAX)
        return doc

    @classmethod
    def restore(cls, doc: Any, failing: bool, severity: Severity) -> Recovery:
        """From its results-annotation field; without one, set when the node was failing."""
        if isinstance(doc, dict):
            passes = doc.get("passes")
            return cls(
                wanted=True,
                severity=severity_or(doc.get("severity"), Severity.RESET),
                passes=passes if isinstance(passes, int) and passes >= 0 else 0,
                cause=str(doc.get("cause") or ""),
            )
        return cls(wanted=True, severity=severity) if failing else cls()


def severity_or(text: Any, default: Severity) -> Severity:
    try:
        sev = Severity.parse(str(text))
    except ValueError:
        return default
    return sev if sev >= Severity.RESET else default
