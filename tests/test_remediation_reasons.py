"""The reason vocabulary of the remediation conditions (issue 31 item 2): the fault class and the
action, one table in core/remediation_reasons.py that docs/clusters/node-repair.md renders, and
`reasonStyle: eks`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.checks.registry import RULES
from agent.config import parse_config
from agent.core.actions import Action, recommend
from agent.core.findings import CheckResult, Finding, Verdict
from agent.core.remediation_reasons import (
    ACTIONS,
    FAULT_CLASSES,
    MANAGED_NODE_GROUP_ACTION,
    OTHER,
    STYLE_EKS,
    fault_class,
    is_eks_reason,
    our_reasons,
    reason_for,
)
from agent.core.remediation_types import (
    OUR_CONDITION_REASONS,
    OUR_REMEDIATION_REASONS,
    UNHEALTHY_REMEDIATION_REASONS,
    RemediationCondition,
    RemediationReason,
)
from agent.core.severity import Severity, Status
from agent.engine.recovery import Recovery
from agent.engine.remediation import remediation_marks
from tests import readme

ROOT = Path(__file__).parent.parent
AHR = "AcceleratedHardwareReady"
R = RemediationReason


def test_every_rule_of_every_check_has_a_fault_class() -> None:
    missing = sorted(rule for rule in RULES if fault_class(rule) == OTHER)
    assert missing == [], f"rules without a row in FAULT_CLASSES: {missing}"
    # Xid codes and DCGM incidents are rules named at run time, under a prefix with a row
    assert fault_class("xid.79") == "Xid" and fault_class("dcgm-health.nvlink.14") == "DCGMHealth"
    assert fault_class("no.such.check") == OTHER  # the fallback exists, and the test above would see it


def test_every_step_has_an_action_and_the_engines_get_one_they_know() -> None:
    assert set(ACTIONS) == set(Action)
    assert set(ACTIONS.values()) == {"ResetGPU", "Reboot", "Replace"}
    assert set(MANAGED_NODE_GROUP_ACTION.values()) <= {"Replace", "Reboot", "NoAction"}


@pytest.mark.parametrize(
    ("rule", "key", "action", "ours", "eks"),
    [
        ("xid.79", "xid/79/0000:97:00.0", Action.REBOOT, "GPUHealthcheckXidReboot", "NvidiaXID79Error"),
        ("xid.48", "xid/48/0000:97:00.0", Action.RESET_GPU, "GPUHealthcheckXidResetGPU", "NvidiaXID48Error"),
        # the service recommendation (e.g. "failed again after repair") is the replace reason
        ("xid.79", "xid/79/0000:97:00.0", Action.SERVICE, "GPUHealthcheckXidReplace", "NvidiaXID79Error"),
        (
            "xid.unknown-code",
            "xid/999/0000:97:00.0",
            Action.REBOOT,
            "GPUHealthcheckXidReboot",
            "NvidiaXID999Error",
        ),
        ("xid.sxid", "sxid/12028/0000:05:00.0", Action.REBOOT, "GPUHealthcheckFabricReboot", ""),
        (
            "gpu.ecc.dram-uncorrectable",
            "k",
            Action.RESET_GPU,
            "GPUHealthcheckMemoryResetGPU",
            "NvidiaDoubleBitError",
        ),
        ("gpu.ecc.sram-uncorrectable", "k", Action.REBOOT, "GPUHealthcheckMemoryReboot", ""),
        ("gpu.row-remap.failure", "k", Action.SERVICE, "GPUHealthcheckMemoryReplace", ""),
        (
            "gpu.count.mismatch",
            "k",
            Action.SERVICE,
            "GPUHealthcheckGPULostReplace",
            "NvidiaDeviceCountMismatch",
        ),
        ("gpu.responsive.timeout", "k", Action.REBOOT, "GPUHealthcheckGPULostReboot", ""),
        ("nvlink.no-active", "k", Action.REBOOT, "GPUHealthcheckNVLinkReboot", "NvidiaNVLinkError"),
        ("gpu.fabric.incomplete", "k", Action.REBOOT, "GPUHealthcheckFabricReboot", "NvidiaFabricError"),
        ("dcgm-diag.fail", "k", Action.SERVICE, "GPUHealthcheckDiagnosticReplace", "DCGMDiagnosticFailure"),
        ("connectx.port-down", "k", Action.RESET_GPU, "GPUHealthcheckNetworkResetGPU", ""),
    ],
)
def test_the_reason_names_the_fault_and_the_action(
    rule: str, key: str, action: Action, ours: str, eks: str
) -> None:
    assert reason_for(rule, key, action) == ours
    assert reason_for(rule, key, action, STYLE_EKS) == (eks or ours)  # no EKS name: ours
    assert (
        ours in OUR_REMEDIATION_REASONS
        and ours in UNHEALTHY_REMEDIATION_REASONS
        and ours in OUR_CONDITION_REASONS
    )
    if eks:
        assert is_eks_reason(eks)
        # never ours: the fence must not let us remove the EKS agent's own condition
        assert eks not in OUR_CONDITION_REASONS and not is_eks_reason(ours)


def test_the_eks_names_are_the_agents_own() -> None:
    """Only names of aws/eks-node-monitoring-agent pkg/reasons/reasons.yaml @029740fc
    (AcceleratedHardwareReady), templates as it spells them."""
    cited = {
        "DCGMDiagnosticFailure",
        "NvidiaDeviceCountMismatch",
        "NvidiaDoubleBitError",
        "NvidiaNVLinkError",
        "NvidiaPCIeError",
        "NvidiaPageRetirement",
        "NvidiaPowerError",
        "NvidiaThermalError",
        "NvidiaXID{code}Error",
        "NvidiaFabricError",
    }
    assert {row.eks for row in FAULT_CLASSES if row.eks} <= cited
    assert not is_eks_reason("NvidiaXIDError") and not is_eks_reason("KubeletNotReady")


def _verdict(rule: str, key: str, severity: Severity, action: Action | None = None) -> Verdict:
    finding = Finding("xid", rule, severity, f"{rule} on GPU 4", ("GPU 4",), key, action=action)
    return Verdict(Status.FAIL, severity, (CheckResult("xid", (finding,)),))


def test_the_engine_writes_the_worst_findings_reason_in_the_entrys_style() -> None:
    entries = (
        RemediationCondition(AHR, "False", Severity.RESET),
        RemediationCondition("Eks", "False", Severity.RESET, STYLE_EKS),
    )
    wanted = {e.type: Recovery(wanted=True) for e in entries}
    verdict = _verdict("xid.79", "xid/79/0000:97:00.0", Severity.REBOOT)
    assert verdict.worst is not None and verdict.worst.recommendation == recommend(Severity.REBOOT)
    got = {m.type: m for m in remediation_marks(entries, wanted, verdict, mode="taint", recover_after=3)}
    assert (got[AHR].unhealthy, got[AHR].reason) == (True, "GPUHealthcheckXidReboot")
    assert (got["Eks"].unhealthy, got["Eks"].reason) == (True, "NvidiaXID79Error")
    assert "→ reboot" in got[AHR].message and got[AHR].message == got["Eks"].message
    # the step the check names wins over the severity's: service -> the replace reason
    verdict = _verdict("xid.79", "xid/79/0000:97:00.0", Severity.REBOOT, Action.SERVICE)
    got = {m.type: m for m in remediation_marks(entries, wanted, verdict, mode="taint", recover_after=3)}
    assert got[AHR].reason == "GPUHealthcheckXidReplace" and got["Eks"].reason == "NvidiaXID79Error"
    # the healthy side keeps its reasons in either style
    healthy = Verdict(Status.PASS, Severity.NONE, (CheckResult("gpu.ecc"),))
    got = {m.type: m for m in remediation_marks(entries, {}, healthy, mode="taint", recover_after=3)}
    assert got[AHR].reason == got["Eks"].reason == R.PASSED


def test_reason_style_is_a_config_key_per_entry() -> None:
    cfg = parse_config(
        {"node": {"remediationConditions": [{"type": AHR, "reasonStyle": "eks"}, {"type": "X"}]}}
    )
    assert [c.reason_style for c in cfg.node.remediation_conditions] == ["eks", "gpu-healthcheck"]
    with pytest.raises(Exception, match="reasonStyle"):
        parse_config({"node": {"remediationConditions": [{"type": AHR, "reasonStyle": "gke"}]}})


def test_the_fence_lists_every_reason_of_ours() -> None:
    for path in (
        "manifests/30-admission-policy.yaml",
        "charts/gpu-healthcheck/templates/30-admission-policy.yaml",
    ):
        text = (ROOT / path).read_text()
        assert all(f"'{r}'" in text for r in our_reasons()), path
        assert "'NvidiaXID" not in text


# ------------------------------------------------------------------------------ the docs = the table

PAGE = readme.page("clusters/node-repair.md")


def _rows(marker: str) -> list[list[str]]:
    """The rows of the docs' table whose header line starts with *marker*, cells unquoted."""
    section = readme.section(PAGE, "The reason vocabulary")
    lines = section[section.index(marker) :].splitlines()[2:]
    out = []
    for line in lines:
        if not line.startswith("|"):
            break
        out.append([c.strip().strip("`") for c in line.strip().strip("|").split("|")])
    return out


def test_the_docs_render_the_fault_class_table() -> None:
    want = [[row.rule, row.fault, row.eks.replace("{code}", "<n>") or "–"] for row in FAULT_CLASSES]
    assert _rows("| Rule") == want


def test_the_docs_render_the_action_table() -> None:
    want = [[a.value, ACTIONS[a], MANAGED_NODE_GROUP_ACTION[ACTIONS[a]]] for a in Action]
    assert _rows("| Next step") == want


def test_the_docs_name_no_reason_of_ours_that_the_code_does_not_write() -> None:
    section = readme.section(PAGE, "Node repair")
    named = set(re.findall(r"`(GPUHealthcheck[A-Za-z]+)`", section))
    assert named <= set(OUR_REMEDIATION_REASONS), named - set(OUR_REMEDIATION_REASONS)
