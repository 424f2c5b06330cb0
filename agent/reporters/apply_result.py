"""What one NodeWriter.apply() did: the engine's metrics, logs and retries read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agent.core.node_keys import EventReason
from agent.core.repair_budget import HoldReason
from agent.core.severity import Status
from agent.reporters.refusals import Refusal


@dataclass(frozen=True)
class ApplyResult:
    """What one apply() did. ok=False: nothing is known to be written; the engine applies again later."""

    ok: bool
    node_writes: int = 0  # metadata/taint patches that succeeded
    status_writes: int = 0  # condition patches that succeeded
    conflicts: int = 0  # 409s retried
    tainted: bool = False  # our taint is on the Node after this apply
    brake_open: bool = False  # marks.taint, but the brake refused the taint
    taint_disabled: bool = False  # marks.taint, but `<prefix>/taint=disabled` is set
    events: tuple[EventReason, ...] = ()  # reasons of the Events posted (or, dry run, that would be)
    remediation_held: HoldReason | Literal[""] = ""  # a new remediation mark held back, and why
    held_key: str = ""  # the finding key of that hold
    error: str | None = None
    dry_run: bool = False
    refused: Refusal | None = None  # the API server refused a write (ok=False; an Event said so)
    # The status the Node was written with where it differs from the verdict's: `degraded`, the GPUs
    # isolated (reporters/device_isolation.py); the engine's next health Event is said from it.
    shown: Status | None = None

    @property
    def wrote(self) -> bool:
        return bool(self.node_writes or self.status_writes)


__all__ = ["ApplyResult"]
