"""dcgmi diag -j parsing (3.x and 4.x shapes) and the dcgm-diag / dcgm-health checks on snapshots."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.checks.dcgm import check_dcgm_diag, check_dcgm_health
from agent.config import load_config_dir
from agent.core.dcgm_report import DiagReport, DiagStatus, HealthIncident, HealthReport, kept_after_abort
from agent.core.facts import NodeFacts
from agent.core.probed import NotCaptured, ParseError, ProbeError, ProbeErrorKind
from agent.core.severity import Severity, Status
from agent.probes.dcgm.diag_json import parse_dcgm_diag_json
from agent.probes.snapshot import SnapshotSource
from agent.probes.source import gather_facts
from tests.conftest import cfg

FIX = Path(__file__).parent / "fixtures" / "dcgm"
CFG = cfg()  # the shipped config and tables
V31 = "dcgm-repo-8gpu-dcgmi-diag-j-3.1.0-real-output-with-warning-prefix.json"
V3_R1, V3_R3 = "dcgmi_diag_v3_r1_pass.json", "dcgmi_diag_v3_r3_pass_T4.json"
MALFORMED = "dcgmi_diag_v3_fail_cuda_lib_MALFORMED_fixture.json"
FRAGMENT = "dcgmi_diag_r4_json_v4_FRAGMENT_issue215.txt"
V4_PASS = "dcgmi_diag_r4_json_v4-DERIVED-wrapped-pass.json"
V4_FAIL = "dcgmi_diag_r4_json_v4-DERIVED-gpu3-fail-isolate.json"
V4_NODE = "dcgmi_diag_r4_json_v4-DERIVED-pcie-node-error-software-warn.json"


def parse(name: str) -> DiagReport:
    return parse_dcgm_diag_json((FIX / name).read_text(encoding="utf-8"))


def statuses(report: DiagReport) -> dict[tuple[str, str], DiagStatus]:
    return {(r.test, r.gpu): r.status for r in report.results}


def test_31_real_output_with_prefix_line_is_all_pass_per_gpu() -> None:
    rep = parse(V31)
    assert rep.version == "3.1.0" and "3.x" in rep.source
    st_ = statuses(rep)
    assert set(st_.values()) == {DiagStatus.PASS}
    assert all(("Denylist", str(g)) in st_ for g in range(8))  # "0,1,...,7" expanded
    assert all(("software", str(g)) in st_ for g in range(8))  # int gpu_ids
    assert rep.gpus() == tuple(str(g) for g in range(8))
    assert any("non-JSON prefix" in n for n in rep.notes)


def test_3x_r1_results_without_gpu_ids_cover_all_gpus() -> None:
    rep = parse(V3_R1)
    assert len(rep.results) == 9
    assert {r.gpu for r in rep.results} == {"all"}
    assert {r.status for r in rep.results} == {DiagStatus.PASS}


def test_3x_r3_t4_pass_and_eud_skip() -> None:
    st_ = statuses(parse(V3_R3))
    assert st_[("GPU Memory", "0")] is DiagStatus.PASS
    assert st_[("PCIe", "0")] is DiagStatus.PASS
    assert st_[("EUD Test", "0")] is DiagStatus.SKIP
    assert st_[("Targeted Power", "0")] is DiagStatus.PASS


def test_malformed_3x_document_is_a_parse_error() -> None:
    # its source note: "DCGM GPU Diagnostic" maps straight to an array (test_categories level missing)
    with pytest.raises(ParseError, match="not an object"):
        parse(MALFORMED)


def test_bare_4x_fragment_is_not_a_document() -> None:
    with pytest.raises(ParseError):
        parse(FRAGMENT)


def test_health_json_is_not_diag_output() -> None:
    with pytest.raises(ParseError, match="not dcgmi diag"):
        parse("dcgmi_health_check_healthy.json")


def test_4x_wrapped_fragment_passes_on_eight_gpus() -> None:
    rep = parse(V4_PASS)
    assert rep.version == "4.1.1" and "4.x" in rep.source
    assert statuses(rep) == {("diagnostic", str(g)): DiagStatus.PASS for g in range(8)}
    assert rep.results[0].info[0].startswith("Allocated space for 138 output")


def test_4x_gpu3_fail_keeps_error_severity() -> None:
    rep = parse(V4_FAIL)
    st_ = statuses(rep)
    assert st_[("diagnostic", "3")] is DiagStatus.FAIL
    assert sum(s is DiagStatus.PASS for s in st_.values()) == 7
    err = next(r for r in rep.results if r.gpu == "3").errors[0]
    assert (err.code, err.category, err.severity) == (51, 6, 2)


def test_a_diag_aborted_for_work_keeps_the_last_completed_verdict_pass_or_fail() -> None:
    """Not run, not "could not look" (probes/dcgm/window.py): a failing report keeps its findings
    (the same latch keys), a passing one its pass; with none completed, skipped; an engine failure
    stays unknown."""
    why = "a level 2 diag aborted: pod a/b arrived asking for nvidia.com/gpu, at T; it runs again ..."
    failed = parse(V4_FAIL)
    before, after = (
        check_dcgm_diag(NodeFacts(dcgm_diag=r), CFG) for r in (failed, kept_after_abort(failed, why))
    )
    assert after.status is Status.FAIL and after.findings == before.findings
    passed = kept_after_abort(parse(V4_PASS), why)
    res = check_dcgm_diag(NodeFacts(dcgm_diag=passed), CFG)
    assert res.status is Status.PASS and res.message.endswith(f"; since then {why}")
    for never in (NotCaptured("dcgm diag (not run yet)"), kept_after_abort(NotCaptured("x"), "earlier")):
        res = check_dcgm_diag(NodeFacts(dcgm_diag=kept_after_abort(never, why)), CFG)
        assert res.status is Status.SKIPPED and res.message == f"DCGM diag not run yet: {why}"
    lost = ProbeError("dcgm diag", ProbeErrorKind.UNAVAILABLE, "the DCGM host engine connection was lost")
    assert kept_after_abort(lost, why) is lost
    assert check_dcgm_diag(NodeFacts(dcgm_diag=lost), CFG).status is Status.UNKNOWN


def test_4x_fail_with_config_severity_is_downgraded_to_warn_and_node_errors_kept() -> None:
    rep = parse(V4_NODE)
    st_ = statuses(rep)
    assert st_[("software", "0")] is DiagStatus.WARN
    sw = next(r for r in rep.results if r.test == "software")
    assert sw.reported == "Fail"
    assert st_[("pcie", "node")] is DiagStatus.FAIL
    assert st_[("pcie", "0")] is DiagStatus.PASS
    assert any("read as warn" in n for n in rep.notes)


def test_runtime_error_without_tests() -> None:
    rep = parse_dcgm_diag_json('{"DCGM Diagnostic": {"runtime_error": "Cannot run diag: GPU in use"}}')
    assert rep.runtime_error == "Cannot run diag: GPU in use" and rep.results == ()
    res = check_dcgm_diag(NodeFacts(dcgm_diag=rep), CFG)
    assert res.status is Status.UNKNOWN and "GPU in use" in res.message


# ---- 4.6 edge shapes (dcgmi/Diag.cpp): built here from the derived 4.x documents above


def doc_of(name: str) -> dict:  # type: ignore[type-arg]
    text = (FIX / name).read_text(encoding="utf-8")
    return json.loads(text[text.find("{") :])  # type: ignore[no-any-return]


def test_runtime_error_document_carries_its_version() -> None:
    text = '{"DCGM Diagnostic": {"version": "4.6.0", "runtime_error": "Cannot run diag: GPU in use"}}'
    rep = parse_dcgm_diag_json(text)
    assert rep.version == "4.6.0" and rep.runtime_error == "Cannot run diag: GPU in use"
    assert check_dcgm_diag(NodeFacts(dcgm_diag=rep), CFG).status is Status.UNKNOWN


def test_iterations_keep_the_worst_result_of_each_test_and_gpu() -> None:
    doc = {"iterations": [doc_of(V4_PASS), doc_of(V4_FAIL)], "Overall Result": "Pass"}
    rep = parse_dcgm_diag_json("Successfully ran diagnostic for group.\n" + json.dumps(doc))
    st_ = statuses(rep)
    assert st_[("diagnostic", "3")] is DiagStatus.FAIL and st_[("diagnostic", "0")] is DiagStatus.PASS
    assert rep.runtime_error is None and any("2 iteration(s)" in n for n in rep.notes)
    res = check_dcgm_diag(NodeFacts(dcgm_diag=rep), CFG)
    assert res.status is Status.FAIL and res.findings[0].rule == "dcgm-diag.fail-isolate"
    passing = {"iterations": [doc_of(V4_PASS), doc_of(V4_PASS)], "Overall Result": "Pass"}
    assert check_dcgm_diag(NodeFacts(dcgm_diag=parse_dcgm_diag_json(json.dumps(passing))), CFG).status is (
        Status.PASS
    )


def test_iterations_stopped_by_a_dcgm_error_are_unknown_not_pass() -> None:
    doc = {"iterations": [doc_of(V4_PASS), None], "Overall Result": "Fail", "warning": "Host engine timeout"}
    rep = parse_dcgm_diag_json(json.dumps(doc))
    assert "Host engine timeout" in (rep.runtime_error or "")
    assert any("iteration 2 printed no" in n for n in rep.notes)
    assert check_dcgm_diag(NodeFacts(dcgm_diag=rep), CFG).status is Status.UNKNOWN
    with pytest.raises(ParseError, match="iterations"):
        parse_dcgm_diag_json('{"iterations": 3, "Overall Result": "Pass"}')


def test_empty_status_is_unknown_unless_its_errors_state_a_fault() -> None:
    doc = doc_of(V4_PASS)
    results = doc["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["results"]
    results[1]["status"] = ""  # a result code dcgmi 4.6 cannot name prints ""
    rep = parse_dcgm_diag_json(json.dumps(doc))
    unknown = [r for r in rep.results if r.status is DiagStatus.UNKNOWN]
    assert len(unknown) == 1 and len(rep.results) > 1  # the rest of the document still counts
    res = check_dcgm_diag(NodeFacts(dcgm_diag=rep), CFG)
    assert res.status is Status.UNKNOWN and "without a status" in (res.unknown or "") and not res.findings
    results[1]["warnings"] = [
        {"warning": "GPU has a row remap failure", "error_id": 80, "error_category": 4, "error_severity": 2}
    ]
    res = check_dcgm_diag(NodeFacts(dcgm_diag=parse_dcgm_diag_json(json.dumps(doc))), CFG)
    assert res.status is Status.FAIL and res.findings[0].rule == "dcgm-diag.fail-isolate"


def test_pass_with_an_error_is_read_as_warn() -> None:
    doc = {
        "DCGM Diagnostic": {
            "test_categories": [
                {
                    "category": "Hardware",
                    "tests": [
                        {
                            "name": "memory",
                            "results": [
                                {
                                    "entity_group": "GPU",
                                    "entity_group_id": 1,
                                    "entity_id": 0,
                                    "status": "Pass",
                                    "warnings": [
                                        {
                                            "warning": "alloc",
                                            "error_id": 56,
                                            "error_category": 10,
                                            "error_severity": 4,
                                        }
                                    ],
                                }
                            ],
                            "test_summary": {"status": "Pass"},
                        }
                    ],
                }
            ]
        }
    }
    assert statuses(parse_dcgm_diag_json(json.dumps(doc)))[("memory", "0")] is DiagStatus.WARN


@pytest.mark.parametrize("name", [V31, V3_R1, V3_R3, V4_PASS, V4_FAIL, V4_NODE])
def test_truncated_documents_never_raise_anything_but_parse_error(name: str) -> None:
    text = (FIX / name).read_text(encoding="utf-8")
    whole = parse_dcgm_diag_json(text)
    for cut in range(0, len(text), max(1, len(text) // 40)):
        part = text[:cut]
        if part.strip() == text.strip():  # only whitespace was cut: the same report
            assert parse_dcgm_diag_json(part) == whole
            continue
        with pytest.raises(ParseError):  # a document cut short is never read as a report
            parse_dcgm_diag_json(part)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_random_text_is_a_report_or_parse_error(text: str) -> None:
    with contextlib.suppress(ParseError):
        assert isinstance(parse_dcgm_diag_json(text), DiagReport)


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda c: (
            st.lists(c, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "DCGM Diagnostic",
                        "DCGM GPU Diagnostic",
                        "test_categories",
                        "tests",
                        "name",
                        "results",
                        "status",
                        "gpu_ids",
                        "entity_id",
                        "warnings",
                        "test_summary",
                        "runtime_error",
                        "info",
                    ]
                ),
                c,
                max_size=4,
            )
        ),
        max_leaves=20,
    )
)
def test_random_json_shapes_are_a_report_or_parse_error(doc: object) -> None:
    try:
        report = parse_dcgm_diag_json(json.dumps(doc))
    except ParseError:
        return
    assert isinstance(report, DiagReport)
    assert all(isinstance(status, DiagStatus) for status in statuses(report).values())


# --------------------------------------------------------------------------- the dcgm-diag check


def diag_check(name: str):  # type: ignore[no-untyped-def]
    return check_dcgm_diag(NodeFacts(dcgm_diag=parse(name)), CFG)


@pytest.mark.parametrize("name", [V31, V3_R3, V4_PASS])
def test_diag_check_passes_on_real_passing_runs(name: str) -> None:
    res = diag_check(name)
    assert res.status is Status.PASS and not res.findings, res.message
    assert "passed" in res.note


def test_diag_check_fails_gpu3_with_isolate() -> None:
    res = diag_check(V4_FAIL)
    assert res.status is Status.FAIL
    (f,) = res.findings
    assert f.rule == "dcgm-diag.fail-isolate" and f.severity is Severity.ISOLATE
    assert f.latched and f.key == "dcgm-diag/diagnostic/3"
    assert "GPU 3" in f.message and "cudaMalloc" in f.message and f.entities == ("GPU 3",)


def test_diag_check_warn_for_config_severity_and_unknown_for_node_level_failure() -> None:
    res = diag_check(V4_NODE)
    (f,) = res.findings
    assert f.rule == "dcgm-diag.warn" and f.severity is Severity.MONITOR and "GPU 0" in f.message
    assert res.status is Status.UNKNOWN  # unknown beats warn: the pcie run must be retried
    assert "not tied to a GPU" in (res.unknown or "")


def test_diag_severity_is_overridable() -> None:
    lowered = cfg({"severities": {"dcgm-diag.fail-isolate": "reset"}})
    (f,) = check_dcgm_diag(NodeFacts(dcgm_diag=parse(V4_FAIL)), lowered).findings
    assert f.severity is Severity.RESET


def test_diag_check_skipped_when_not_captured_and_unknown_when_unreadable(tmp_path: Path) -> None:
    assert check_dcgm_diag(NodeFacts(), CFG).status is Status.SKIPPED
    (tmp_path / "dcgm-diag.json").write_bytes((FIX / MALFORMED).read_bytes())
    facts = gather_facts(SnapshotSource(tmp_path), CFG)
    assert isinstance(facts.dcgm_diag, ProbeError)
    res = check_dcgm_diag(facts, CFG)
    assert res.status is Status.UNKNOWN and "dcgm-diag.json" in res.message


def test_snapshot_source_reads_dcgm_diag_json(tmp_path: Path) -> None:
    (tmp_path / "dcgm-diag.json").write_bytes((FIX / V4_FAIL).read_bytes())
    facts = gather_facts(SnapshotSource(tmp_path), CFG)
    assert isinstance(facts.dcgm_diag, DiagReport)
    assert check_dcgm_diag(facts, CFG).status is Status.FAIL
    only = gather_facts(SnapshotSource(tmp_path), CFG, only=lambda i: i != "dcgm_diag")
    assert isinstance(only.dcgm_diag, NotCaptured)


# --------------------------------------------------------------------------- the dcgm-health check


def health(*incidents: HealthIncident, nvswitch: bool = False) -> HealthReport:
    return HealthReport(
        overall=max((i.health for i in incidents), default=0),
        incidents=incidents,
        single_node_nvswitch=nvswitch,
    )


def test_health_pass_without_incidents() -> None:
    res = check_dcgm_health(NodeFacts(dcgm_health=health()), CFG)
    assert res.status is Status.PASS and not res.findings


def test_health_volatile_dbe_is_reset_and_nvlink_down_is_reset_and_replay_is_monitor() -> None:
    rep = health(
        HealthIncident(0x10, 20, 4, "Detected 2 volatile double-bit ECC error(s) in GPU 2.", 1, 2),
        HealthIncident(0x2, 20, 14, "GPU 5's NvLink link 3 is currently down", 1, 5),
        HealthIncident(0x1, 10, 3, "Detected more than 8 PCIe replays per minute for GPU 0 : 99", 1, 0),
    )
    res = check_dcgm_health(NodeFacts(dcgm_health=rep), CFG)
    by = {f.key: f for f in res.findings}
    dbe = by["dcgm-health/mem/4/1-2"]
    assert dbe.severity is Severity.RESET and "GPU 2" in dbe.message and dbe.entities == ("GPU 2",)
    assert by["dcgm-health/nvlink/14/1-5"].severity is Severity.RESET
    assert by["dcgm-health/pcie/3/1-0"].severity is Severity.MONITOR
    assert res.status is Status.FAIL


def test_health_imex_ignored_on_single_node_nvswitch_only() -> None:
    imex = HealthIncident(0x2, 20, 122, "IMEX daemon status is -3 (not READY)", 1, 0)
    assert check_dcgm_health(NodeFacts(dcgm_health=health(imex, nvswitch=True)), CFG).status is Status.PASS
    res = check_dcgm_health(NodeFacts(dcgm_health=health(imex)), CFG)
    assert res.status is Status.WARN and "IMEX" in res.message


def test_health_duplicate_incidents_become_one_finding_and_unlisted_codes_use_rules() -> None:
    inc = HealthIncident(0x10, 20, 4, "Detected 1 volatile double-bit ECC error(s) in GPU 1.", 1, 1)
    odd = HealthIncident(0x200, 20, 150, "GPU 1 needs a reset", 1, 1)
    res = check_dcgm_health(NodeFacts(dcgm_health=health(inc, inc, odd)), CFG)
    assert len(res.findings) == 2
    unl = next(f for f in res.findings if f.rule == "dcgm-health.unlisted-fail")
    assert unl.severity is Severity.RESET and "driver" in unl.message


def test_health_table_override_in_config() -> None:
    ignoring = cfg({"dcgm": {"incidentOverrides": {"pcie/3": "none"}}})
    inc = HealthIncident(0x1, 10, 3, "replays", 1, 0)
    res = check_dcgm_health(NodeFacts(dcgm_health=health(inc)), ignoring)
    assert res.status is Status.PASS and "ignored" in res.note


def test_health_reads_the_incident_table_of_the_loaded_config_directory(tmp_path: Path) -> None:
    """An edited dcgm-incidents.yaml in the ConfigMap is the table the check judges with."""
    (tmp_path / "dcgm-incidents.yaml").write_text(
        "incidents:\n  - {system: pcie, code: 3, name: DCGM_FR_PCI_REPLAY_RATE, severity: reboot}\n"
    )
    cfg = load_config_dir(tmp_path)
    res = check_dcgm_health(NodeFacts(dcgm_health=health(HealthIncident(0x1, 10, 3, "replays", 1, 0))), cfg)
    assert [f.severity for f in res.findings] == [Severity.REBOOT]
