"""The checks' shared prelude (agent/checks/__init__.py): an input is judged as its type, or the
check is skipped (not captured) or unknown (unreadable); findings are built from their Rule."""

from __future__ import annotations

import pytest

from agent.checks import partial_input, rule_finding, typed_input
from agent.checks.dcgm import DCGM_DIAG_WARN
from agent.core.findings import CheckResult
from agent.core.host import HostInfo
from agent.core.probed import NotCaptured, ProbeError, ProbeErrorKind
from agent.core.rules import Rule
from agent.core.severity import Severity
from agent.core.topo import TopoMatrix
from tests.conftest import cfg

HOST = HostInfo(cpus_online=(0, 1), cpus_present=(0, 1))
CUT = ProbeError("nvidia-smi topo -m", ProbeErrorKind.UNREADABLE, "row GPU3 cut", TopoMatrix(("GPU0",), {}))


def test_typed_input_is_the_input_or_the_result_of_its_gap() -> None:
    assert typed_input("host.cpus", HOST, HostInfo) is HOST
    skipped = typed_input("host.cpus", NotCaptured("sysfs cpu/node"), HostInfo)
    assert isinstance(skipped, CheckResult)
    assert skipped.name == "host.cpus" and skipped.skipped == "sysfs cpu/node not captured"
    unknown = typed_input("host.cpus", ProbeError("sysfs", ProbeErrorKind.UNAVAILABLE, "gone"), HostInfo)
    assert isinstance(unknown, CheckResult) and unknown.unknown == "could not read sysfs: gone"
    # A damaged capture's intact part is not the input: judged whole or not at all.
    whole_only = typed_input("topology", CUT, TopoMatrix)
    assert isinstance(whole_only, CheckResult) and whole_only.unknown == (
        "could not read nvidia-smi topo -m: row GPU3 cut"
    )


def test_partial_input_judges_a_damaged_captures_intact_part_and_says_why() -> None:
    assert partial_input("host.cpus", HOST, HostInfo) == (HOST, None)
    part = partial_input("topology", CUT, TopoMatrix)
    assert part == (CUT.partial, "could not read all of nvidia-smi topo -m: row GPU3 cut")
    gap = partial_input("topology", NotCaptured("topo.txt"), TopoMatrix)
    assert isinstance(gap, CheckResult) and gap.skipped == "topo.txt not captured"


def test_an_input_of_another_type_is_our_bug_and_raises() -> None:
    """Not a gap to report as the machine's: the registry turns the exception into `unknown`."""
    with pytest.raises(TypeError, match=r"host\.cpus: a TopoMatrix where HostInfo was read"):
        typed_input("host.cpus", CUT.partial, HostInfo)
    with pytest.raises(TypeError, match="topology: a HostInfo where TopoMatrix was read"):
        partial_input("topology", HOST, TopoMatrix)


def test_rule_finding_keys_by_rule_or_whole_key_and_latches_on_request() -> None:
    c = cfg({"severities": {DCGM_DIAG_WARN.name: "isolate"}})
    level = rule_finding(c, "dcgm-diag", DCGM_DIAG_WARN, "m", ("GPU 0",), "0000:53:00.0")
    assert level.key == "dcgm-diag.warn/0000:53:00.0" and not level.latched
    assert level.severity is Severity.ISOLATE  # the configured severity, not the rule's default
    latched = rule_finding(c, "dcgm-diag", DCGM_DIAG_WARN, "m", latched=True, whole_key="dcgm-diag/pcie/0")
    assert latched.key == "dcgm-diag/pcie/0" and latched.latched and latched.rule == "dcgm-diag.warn"
    assert rule_finding(c, "x", Rule("x.r", Severity.MONITOR, "t"), "m").key == "x.r"
