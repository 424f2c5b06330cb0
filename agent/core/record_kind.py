"""The kinds of the fleet's Lease records (the label `<prefix>/record=<kind>`), and which of them an
agent may write under each admission policy: the one place both the agent and the policy's kind lists
(scripts/gen-configmap.py writes them into manifests/30-admission-policy.yaml and the chart) take
them from. A new fleet control adds its kind here, to one policy's tuple, and its counting rule.
"""

from __future__ import annotations

from enum import unique

from agent.core.vocabulary import Vocabulary


@unique
class RecordKind(Vocabulary):
    """What a record is (reporters/lease_records.py writes and lists them)."""

    FAIL = "fail"  # a node failed on a finding key (the wave's count; core/repair_budget.py)
    MARK = "mark"  # a node newly marked for remediation (the repair budget's count)
    RELEASE = "release"  # an operator's release of the budget and wave holds (cli/brake.py)
    WAVE = "wave"  # a marker: a full count found a key's wave
    TAINT = "taint"  # a brake slot: its holder may carry our taint (reporters/brake_slots.py)
    SLOT = "slot"  # an active check's fleet slot (core/active_checks.py)


# gpu-healthcheck-own-slots: a fenced agent holds records of these kinds of its own node only
SLOT_POLICY_KINDS: tuple[RecordKind, ...] = (RecordKind.SLOT,)
# gpu-healthcheck-own-records (every other kind): a fenced agent may write these, of its own node;
# the rest (a release) are an operator's
AGENT_RECORD_KINDS: tuple[RecordKind, ...] = (
    RecordKind.FAIL,
    RecordKind.MARK,
    RecordKind.TAINT,
    RecordKind.WAVE,
)


def record_kind(value: object) -> RecordKind | None:
    """A label's value as a RecordKind; None when it is no kind of ours."""
    try:
        return RecordKind(value)
    except ValueError:
        return None


__all__ = ["AGENT_RECORD_KINDS", "SLOT_POLICY_KINDS", "RecordKind", "record_kind"]
