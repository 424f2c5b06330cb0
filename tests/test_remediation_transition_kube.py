"""The engines' timers (issue 31 item 2): a remediation condition's lastTransitionTime never moves while
its status holds, whatever its reason and message do; Karpenter counts its toleration from it.

On the real kube-apiserver: the engine's decision (engine/remediation.remediation_marks, the reason
from the vocabulary) applied by the agent's NodeWriter through cycles that change the worst finding,
the action and the recovery count at the same unhealthy status, in both reason styles. The writer's
clock is replaced by one that moves a minute per cycle, so a rewritten time could not go unseen
(RFC 3339 seconds), and no test waits on the wall clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from agent.core.actions import Action
from agent.core.findings import CheckResult, Finding, Verdict
from agent.core.marks import Marks
from agent.core.remediation_reasons import STYLE_EKS
from agent.core.remediation_types import RemediationCondition, RemediationReason
from agent.core.severity import Severity, Status
from agent.engine.recovery import Recovery
from agent.engine.remediation import remediation_marks
from agent.reporters import write_order
from agent.reporters.node_writer import NodeWriter
from tests.conftest import shipped

pytestmark = pytest.mark.kube

AHR, EKS = "AcceleratedHardwareReady", "example.com/GPURepairEKS"
ENTRIES = (
    RemediationCondition(AHR, "False", Severity.RESET),
    RemediationCondition(EKS, "False", Severity.RESET, STYLE_EKS),
)
R = RemediationReason


class Clock:
    """now_iso() for the writer: a minute later at each call of tick()."""

    def __init__(self) -> None:
        self.minute = 0

    def tick(self) -> str:
        self.minute += 1
        return self.now()

    def now(self) -> str:
        return f"2026-01-01T{self.minute // 60:02d}:{self.minute % 60:02d}:00Z"


@pytest.fixture
def core(kube: Any) -> Iterator[k8s.CoreV1Api]:
    with kube.api_client() as api:
        yield k8s.CoreV1Api(api)


def failing(rule: str, key: str, severity: Severity, action: Action | None = None) -> Verdict:
    finding = Finding("xid", rule, severity, f"{rule} on GPU 4 ({key})", ("GPU 4",), key, action=action)
    return Verdict(Status.FAIL, severity, (CheckResult("xid", (finding,)),))


PASSING = Verdict(Status.PASS, Severity.NONE, (CheckResult("gpu.ecc", note="8 GPUs, ECC clean"),))
UNKNOWN = Verdict(Status.UNKNOWN, Severity.NONE, (CheckResult("gpu.ecc", unknown="nvidia-smi hung"),))


def marks_for(verdict: Verdict, recovery: Recovery, *, taint: bool = True) -> Marks:
    remediation = remediation_marks(
        ENTRIES, {e.type: recovery for e in ENTRIES}, verdict, mode="taint", recover_after=3
    )
    severity = max(verdict.severity, Severity.RESET) if taint else verdict.severity
    return Marks(verdict.status, severity, "{}", taint, f"{verdict.status.value}", remediation=remediation)


def conditions(core: k8s.CoreV1Api, node: str) -> dict[str, Any]:
    return {c.type: c for c in core.read_node(node).status.conditions or ()}


def stamp(value: Any) -> str:
    return str(value.strftime("%Y-%m-%dT%H:%M:%SZ"))


def test_last_transition_time_holds_while_the_status_does(
    core: k8s.CoreV1Api, gpu_node: Any, kube_node_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu_node()
    clock = Clock()
    monkeypatch.setattr(write_order, "now_iso", clock.now)
    writer = NodeWriter(core, kube_node_name, cfg=shipped())
    fail = Recovery(wanted=True, severity=Severity.REBOOT, cause="fail (reboot): xid: Xid 79")
    cycles = [  # the same unhealthy status; reason and message change every cycle
        (
            failing("xid.79", "xid/79/0000:97:00.0", Severity.REBOOT),
            fail,
            "GPUHealthcheckXidReboot",
            "NvidiaXID79Error",
        ),
        (
            failing("xid.48", "xid/48/0000:97:00.0", Severity.RESET),
            fail,
            "GPUHealthcheckXidResetGPU",
            "NvidiaXID48Error",
        ),
        (
            failing("gpu.ecc.dram-uncorrectable", "gpu.ecc/0000:97:00.0", Severity.REBOOT, Action.SERVICE),
            fail,
            "GPUHealthcheckMemoryReplace",
            "NvidiaDoubleBitError",
        ),
        (
            PASSING,
            Recovery(wanted=True, passes=1, cause="fail (reboot): xid: Xid 79"),
            R.RECOVERING,
            R.RECOVERING,
        ),
        (UNKNOWN, Recovery(wanted=True, passes=1, frozen=True, cause="x"), R.RECOVERING, R.RECOVERING),
        (PASSING, Recovery(wanted=True, passes=2, cause="x"), R.RECOVERING, R.RECOVERING),
    ]
    turned: str | None = None
    seen: dict[str, set[tuple[str, str]]] = {AHR: set(), EKS: set()}
    for verdict, recovery, ours, eks in cycles:
        clock.tick()
        res = writer.apply(marks_for(verdict, recovery))
        assert res.ok and res.tainted and res.status_writes >= 1, res
        got = conditions(core, kube_node_name)
        assert (got[AHR].status, got[AHR].reason) == ("False", ours)
        assert (got[EKS].status, got[EKS].reason) == ("False", eks)
        assert stamp(got[AHR].last_heartbeat_time) == clock.now()  # written in this cycle, with this clock
        turned = turned or clock.now()
        for kind in (AHR, EKS):
            assert stamp(got[kind].last_transition_time) == turned, f"{kind} moved in cycle {clock.minute}"
            seen[kind].add((got[kind].reason, got[kind].message))
    assert len(seen[AHR]) == len(seen[EKS]) == len(cycles)  # a new reason or message every cycle

    # A status change moves it (the assertion above would see a moved time), and so does the next one
    clock.tick()
    assert writer.apply(marks_for(PASSING, Recovery(), taint=False)).ok
    got = conditions(core, kube_node_name)
    assert (got[AHR].status, got[AHR].reason) == ("True", R.PASSED)
    assert stamp(got[AHR].last_transition_time) == clock.now() != turned
    healthy_since = clock.now()
    clock.tick()
    assert writer.apply(marks_for(PASSING, Recovery(), taint=False)).ok  # nothing new: no write
    assert stamp(conditions(core, kube_node_name)[AHR].last_transition_time) == healthy_since
    clock.tick()
    assert writer.apply(marks_for(cycles[0][0], fail)).ok
    got = conditions(core, kube_node_name)
    assert got[AHR].status == "False" and stamp(got[AHR].last_transition_time) == clock.now()
