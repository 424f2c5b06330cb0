"""Node verdict (DESIGN §3): the worst finding wins, unknown only when nothing failed; JSON stays small."""

from __future__ import annotations

import json

from agent.core.findings import CheckResult, Finding
from agent.core.results_doc import encode, results_document
from agent.core.severity import Severity, Status
from agent.engine.verdict import decide


def finding(sev: Severity, check: str = "c", latched: bool = False, msg: str = "m") -> Finding:
    return Finding(check=check, rule="r", severity=sev, message=msg, key=f"k/{check}/{sev}", latched=latched)


def test_pass_warn_fail_unknown() -> None:
    assert decide([CheckResult("a")]).status is Status.PASS
    assert decide([CheckResult("a", findings=(finding(Severity.MONITOR),))]).status is Status.WARN
    assert decide([CheckResult("a", unknown="engine unreachable")]).status is Status.UNKNOWN
    failing = decide([CheckResult("a", unknown="x"), CheckResult("b", findings=(finding(Severity.RESET),))])
    assert failing.status is Status.FAIL and failing.severity is Severity.RESET


def test_unknown_is_not_hidden_behind_a_warning() -> None:
    v = decide([CheckResult("a", unknown="x"), CheckResult("b", findings=(finding(Severity.MONITOR),))])
    assert v.status is Status.UNKNOWN and v.severity is Severity.MONITOR


def test_a_later_milder_finding_never_masks_an_earlier_severe_one() -> None:
    v = decide(
        [
            CheckResult("a", findings=(finding(Severity.ISOLATE),)),
            CheckResult("b", findings=(finding(Severity.MONITOR),)),
            CheckResult("c"),
        ]
    )
    assert v.severity is Severity.ISOLATE and v.status is Status.FAIL
    assert v.worst is not None and v.worst.severity is Severity.ISOLATE


def test_skipped_checks_do_not_make_a_node_unknown() -> None:
    assert decide([CheckResult("a", skipped="not captured"), CheckResult("b")]).status is Status.PASS


def test_results_stay_under_16_kib_and_keep_every_check() -> None:
    many = tuple(finding(Severity.RESET, check=f"xid{i}", latched=True, msg="x" * 2000) for i in range(60))
    results = [CheckResult(f"check{i}", findings=many[i : i + 1]) for i in range(60)]
    doc = results_document(decide(results), checked_at="2026-01-01T00:00:00Z", boot_id="b", instance_type="t")
    assert len(encode(doc).encode()) <= 16 * 1024
    assert len(doc["checks"]) == 60
    assert json.loads(encode(doc))["severity"] == "reset"
