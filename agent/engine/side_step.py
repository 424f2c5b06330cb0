"""One protocol for the engine's side steps of a verdict (validation, active checks, an operator's
clear request, Events a check asks for on a new finding): each says what it wants of the Node write
(its taint wishes, our annotations to drop, Events, a note for the condition) as one SideStep, and
the Marks take them summed once (engine/marks_builder.py). A new side step is one more entry in the
engine's tuple, not a new field of Decided and three lines of build().

A check asks for an Event through its CheckSpec (`event`: the reason a new finding of it posts, once
per finding, not again while it lasts), so the engine holds no check's name."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from agent.core.findings import CheckResult
from agent.core.marks import NodeEvent
from agent.core.node_keys import WARNING, EventReason
from agent.core.severity import Severity


@dataclass(frozen=True)
class SideStep:
    """What one side step wants of this verdict's Node write. None: leave that taint as it is."""

    validating: bool | None = None  # the validating taint (engine/validation.py)
    testing: bool | None = None  # the testing taint (engine/active.py)
    drop: tuple[str, ...] = ()  # our annotations to remove (consumed requests)
    events: tuple[NodeEvent, ...] = ()
    note: str = ""  # for the condition's message (what the validating taint waits for)


def summed(steps: Sequence[SideStep]) -> SideStep:
    """The steps as one: Events and drops in the steps' order, notes joined, each taint wish from the
    one step that has it (the first, should two)."""
    return SideStep(
        validating=next((s.validating for s in steps if s.validating is not None), None),
        testing=next((s.testing for s in steps if s.testing is not None), None),
        drop=tuple(k for s in steps for k in s.drop),
        events=tuple(e for s in steps for e in s.events),
        note="; ".join(s.note for s in steps if s.note),
    )


def finding_events(
    results: Iterable[CheckResult], reasons: Mapping[str, EventReason], before: set[str]
) -> tuple[SideStep, set[str]]:
    """An Event (the check's CheckSpec.event) for each finding of those checks not there at the last
    verdict, and the finding keys now (the caller keeps them for the next verdict)."""
    found = {
        f.key: (reasons[r.name], f.message)
        for r in results
        if r.name in reasons
        for f in r.findings
        if f.severity > Severity.NONE
    }
    events = tuple(NodeEvent(found[k][0], found[k][1], WARNING) for k in sorted(found) if k not in before)
    return SideStep(events=events), set(found)


__all__ = ["SideStep", "finding_events", "summed"]
