"""Severity and status: the two scales the whole product speaks (DESIGN.md §3)."""

from __future__ import annotations

import enum


class Severity(enum.IntEnum):
    """What it takes to fix a finding; ordered so that max() gives the node's severity."""

    NONE = 0
    MONITOR = 1
    RESET = 2
    REBOOT = 3
    ISOLATE = 4

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(
                f"unknown severity {text!r} (expected one of: {', '.join(s.label for s in cls)})"
            ) from None


class Status(str, enum.Enum):
    """The node (or one check) verdict written to the status label."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    UNKNOWN = "unknown"
    SKIPPED = "skipped"  # per check only: not applicable or not captured; never a node status
    # Node only, never a verdict: every failing finding is on GPUs that DeviceTaintRules the API server
    # accepted isolate, so the node keeps serving its other GPUs (engine/degraded.py, DESIGN.md §3.7).
    DEGRADED = "degraded"

    def __str__(self) -> str:
        return self.value
