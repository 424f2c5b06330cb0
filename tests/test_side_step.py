"""The engine's side steps as one protocol (engine/side_step.py): summed once, in order; a check's
Event comes from its CheckSpec, so the engine knows no check by name."""

from __future__ import annotations

import ast
from pathlib import Path

from agent.checks.registry import CHECK_EVENTS, CHECKS
from agent.core.findings import CheckResult, Finding
from agent.core.marks import NodeEvent
from agent.core.node_keys import EventReason
from agent.core.severity import Severity
from agent.engine.active import ActiveStep
from agent.engine.side_step import SideStep, finding_events, summed

ENGINE = Path(__file__).parent.parent / "agent" / "engine"


def test_steps_sum_once_in_order_and_each_taint_wish_comes_from_its_step() -> None:
    clear = SideStep(drop=("p/clear-latched",), events=(NodeEvent(EventReason.LATCHES_CLEARED, "cleared"),))
    active = ActiveStep(testing=True, drop=("p/diag-requested",), record={"outcome": "started"})
    gate = SideStep(validating=False, events=(NodeEvent(EventReason.VALIDATION_PASSED, "passed"),), note="n")
    side = summed((clear, SideStep(), active, gate))
    assert side.drop == ("p/clear-latched", "p/diag-requested")
    assert [e.reason for e in side.events] == [EventReason.LATCHES_CLEARED, EventReason.VALIDATION_PASSED]
    assert (side.testing, side.validating, side.note) == (True, False, "n")
    assert summed(()) == SideStep()  # nothing asked: both taints left as they are


def test_a_check_posts_its_event_once_per_new_finding_through_its_spec() -> None:
    assert {s.name: s.event for s in CHECKS if s.event is not None} == CHECK_EVENTS
    assert CHECK_EVENTS["gpu.stalled"] is EventReason.GPU_STALLED
    stall = Finding("gpu.stalled", "gpu.stalled", Severity.MONITOR, "GPU 2 stalled", key="gpu.stalled/2")
    other = Finding("gpu.ecc", "gpu.ecc.x", Severity.RESET, "ECC", key="gpu.ecc/2")
    results = [CheckResult("gpu.stalled", (stall,)), CheckResult("gpu.ecc", (other,))]
    step, seen = finding_events(results, CHECK_EVENTS, set())
    assert [(e.reason, e.message) for e in step.events] == [(EventReason.GPU_STALLED, "GPU 2 stalled")]
    again, seen = finding_events(results, CHECK_EVENTS, seen)
    assert again.events == () and seen == {"gpu.stalled/2"}  # not again while it lasts
    gone, seen = finding_events([CheckResult("gpu.stalled")], CHECK_EVENTS, seen)
    assert gone.events == () and seen == set()


def test_the_engine_imports_no_check_module_but_the_registry() -> None:
    """A check's Event is its CheckSpec's, not the engine's filter on its name."""
    for path in ENGINE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agent.checks."):
                assert node.module == "agent.checks.registry", f"{path.name} imports {node.module}"
