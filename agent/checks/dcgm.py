"""The DCGM checks: `dcgm-diag` (the latest diagnostic run, latched) and `dcgm-health` (health watches).

dcgm-diag: FAIL maps to the error's DCGM severity (ISOLATE → dcgm-diag.fail-isolate, RESET →
dcgm-diag.fail-reset, anything else → dcgm-diag.fail), WARN → dcgm-diag.warn. A run that could not
run, a test that failed only with errors not tied to a GPU (an NVVS internal error), or a result with
no status word and no ISOLATE/RESET error, is `unknown`, never pass. A diag aborted for work (a pod
arrived: probes/dcgm/window.py) did not run: the last completed report is judged as before, its
message saying so; with none completed yet the check is skipped ("not run yet"), not `unknown`.
dcgm-health: incidents map through config/dcgm-incidents.yaml (+ dcgm.incidentOverrides).
Both are `unknown`, never pass, when the engine watches or a run tested fewer GPUs than NVML sees
(checks/dcgm_coverage.py); what they found on the GPUs they looked at is still reported.
"""

from __future__ import annotations

import re
from dataclasses import replace

from agent.checks import CheckSpec, rule_finding, typed_input
from agent.checks.dcgm_coverage import diag_coverage, health_coverage
from agent.config import Config
from agent.config.dcgm_incidents import SINGLE_NODE_NVSWITCH, system_name
from agent.core.dcgm_report import (
    DCGM_ERROR_ISOLATE,
    DCGM_ERROR_RESET,
    DiagReport,
    DiagResult,
    DiagStatus,
    HealthIncident,
    HealthReport,
)
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Finding
from agent.core.rules import Rule
from agent.core.severity import Severity
from agent.core.text import shorten

DCGM_DIAG_FAIL_ISOLATE = Rule(
    "dcgm-diag.fail-isolate",
    Severity.ISOLATE,
    "a DCGM diag test failed with an ISOLATE-severity error",
)
DCGM_DIAG_FAIL_RESET = Rule(
    "dcgm-diag.fail-reset",
    Severity.RESET,
    "a DCGM diag test failed with a RESET-severity error",
)
DCGM_DIAG_FAIL = Rule(
    "dcgm-diag.fail",
    Severity.ISOLATE,
    "a DCGM diag test failed, no reset/isolate severity (TRIAGE, UNKNOWN, 3.x)",
)
DCGM_DIAG_WARN = Rule(
    "dcgm-diag.warn",
    Severity.MONITOR,
    "a DCGM diag test warned (or failed only with monitor/config-severity errors)",
)
DCGM_HEALTH_UNLISTED_FAIL = Rule(
    "dcgm-health.unlisted-fail",
    Severity.RESET,
    "a DCGM health FAIL incident not in config/dcgm-incidents.yaml",
)
DCGM_HEALTH_UNLISTED_WARN = Rule(
    "dcgm-health.unlisted-warn",
    Severity.MONITOR,
    "a DCGM health WARN incident not in config/dcgm-incidents.yaml",
)


DCGM_HEALTH_SECOND_ENGINE = Rule(
    "dcgm-health.second-engine",
    Severity.MONITOR,
    "more than one DCGM host engine runs on this node (pods of the GPU Operator, an embedded exporter)",
)


DIAG, HEALTH = "dcgm-diag", "dcgm-health"
MAX_TEXT = 200
_ENTITY_GROUPS = {1: "GPU", 2: "VGPU", 3: "NVSwitch", 4: "GPU-I", 5: "GPU-CI", 6: "link", 7: "CPU"}


def _slug(test: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", test.lower()).strip("-") or "test"


def _entity(gpu: str) -> str:
    if gpu == "all":
        return "all GPUs"
    return f"GPU {gpu}" if gpu.isdigit() else gpu


def _diag_rule(r: DiagResult) -> Rule:
    sevs = {e.severity for e in r.errors}
    if DCGM_ERROR_ISOLATE in sevs:
        return DCGM_DIAG_FAIL_ISOLATE
    if DCGM_ERROR_RESET in sevs:
        return DCGM_DIAG_FAIL_RESET
    return DCGM_DIAG_FAIL


def _why(r: DiagResult) -> str:
    text = "; ".join(e.message for e in r.errors if e.message) or f"status {r.reported or r.status.value}"
    return shorten(text, MAX_TEXT)


def check_dcgm_diag(facts: NodeFacts, cfg: Config) -> CheckResult:
    report = typed_input(DIAG, facts.dcgm_diag, DiagReport)
    if isinstance(report, CheckResult):
        return report
    if not report.completed:
        return CheckResult(DIAG, skipped=shorten(f"DCGM diag not run yet: {report.aborted}", MAX_TEXT * 2))
    findings: list[Finding] = []
    infra: list[str] = []
    unnamed: list[str] = []
    for r in report.results:
        if r.status in (DiagStatus.PASS, DiagStatus.SKIP, DiagStatus.NOT_RUN):
            continue
        hardware = any(e.severity in (DCGM_ERROR_ISOLATE, DCGM_ERROR_RESET) for e in r.errors)
        if r.status is DiagStatus.UNKNOWN and not hardware:  # no result word, no fault stated
            unnamed.append(f"{r.test} on {_entity(r.gpu)}")
            continue
        if r.gpu == "node" and not hardware:
            infra.append(f"{r.test}: {_why(r)}")
            continue
        if r.status is DiagStatus.WARN:
            rule, verb = DCGM_DIAG_WARN, "warned"
        else:
            rule, verb = _diag_rule(r), "failed"
        where = _entity(r.gpu)
        findings.append(
            rule_finding(
                cfg,
                DIAG,
                rule,
                f"DCGM diag {r.test} {verb} on {where}: {_why(r)}",
                (where,),
                latched=True,
                whole_key=f"dcgm-diag/{_slug(r.test)}/{r.gpu}",  # a test's latch, whichever rule
            )
        )
    findings = [f for f in findings if f.severity > Severity.NONE]
    unknown = None
    if report.runtime_error:
        unknown = f"DCGM diag could not run: {report.runtime_error[:MAX_TEXT]}"
    elif infra:
        unknown = "DCGM diag failed with errors not tied to a GPU (retry): " + "; ".join(infra)[:MAX_TEXT]
    elif unnamed:
        unknown = "DCGM diag result without a status (unknown result code): " + ", ".join(unnamed)[:MAX_TEXT]
    elif not report.results:
        unknown = "DCGM diag report holds no test results"
    elif all(r.status in (DiagStatus.SKIP, DiagStatus.NOT_RUN) for r in report.results):
        unknown = "DCGM diag ran no test (every result skipped or not run)"
    else:
        unknown = diag_coverage(report, facts)
    tested = report.gpus()
    ran = {r.test for r in report.results if r.status not in (DiagStatus.SKIP, DiagStatus.NOT_RUN)}
    version = f" {report.version}" if report.version else ""
    note = f"{len(ran)} test(s) on {len(tested) or 'all'} GPU(s) passed ({report.source}{version})"
    if report.aborted:
        note = shorten(f"{note}; since then {report.aborted}", MAX_TEXT * 2)
    return CheckResult(DIAG, findings=tuple(findings), unknown=unknown, note=note)


def _health_entity(i: HealthIncident) -> str:
    return f"{_ENTITY_GROUPS.get(i.entity_group, f'entity-group {i.entity_group}')} {i.entity_id}"


def check_dcgm_health(facts: NodeFacts, cfg: Config) -> CheckResult:
    report = typed_input(HEALTH, facts.dcgm_health, HealthReport)
    if isinstance(report, CheckResult):
        return report
    table = cfg.dcgm_incidents
    merged: dict[str, Finding] = {}
    ignored = 0
    for inc in report.incidents:
        row = table.lookup(inc.system, inc.code)
        if row is not None and SINGLE_NODE_NVSWITCH in row.ignore_on and report.single_node_nvswitch:
            ignored += 1
            continue
        if row is not None:
            rule, sev, name = f"dcgm-health.{row.system}.{row.code}", row.severity, row.name
        else:
            unlisted = DCGM_HEALTH_UNLISTED_FAIL if inc.health >= 20 else DCGM_HEALTH_UNLISTED_WARN
            rule, sev, name = unlisted.name, cfg.severity(unlisted), f"DCGM_FR code {inc.code}"
        if sev <= Severity.NONE:
            ignored += 1
            continue
        where = _health_entity(inc)
        key = f"dcgm-health/{system_name(inc.system)}/{inc.code}/{inc.entity_group}-{inc.entity_id}"
        msg = (inc.message or name).strip()
        msg = shorten(msg, MAX_TEXT)
        if key in merged:  # several incidents of one kind on one entity: one finding
            old = merged[key]
            if msg not in old.message:
                merged[key] = replace(old, message=f"{old.message}; {msg}")
            continue
        merged[key] = Finding(  # a row of dcgm-incidents.yaml is a rule of its own, not a Rule
            HEALTH,
            rule,
            sev,
            f"DCGM health {system_name(inc.system)} on {where}: {name}: {msg}",
            (where,),
            key,
        )
    engines = report.engines_on_node or ()
    if len(engines) > 1:
        merged["dcgm-health/second-engine"] = rule_finding(
            cfg,
            HEALTH,
            DCGM_HEALTH_SECOND_ENGINE,
            shorten(
                f"{len(engines)} DCGM host engines on this node: {', '.join(engines)}; two engines give "
                "contradictory views and break each other's modules "
                "(docs/install.md: With the NVIDIA GPU Operator)",
                MAX_TEXT * 2,
            ),
            ("node",),
            whole_key="dcgm-health/second-engine",  # beside the incidents' dcgm-health/<system>/... keys
        )
        merged = {k: f for k, f in merged.items() if f.severity > Severity.NONE}
    note = "DCGM health watches report no incident"
    if report.gpus_watched is not None:
        note = f"DCGM health watches on {len(report.gpus_watched)} GPU(s) report no incident"
    if ignored:
        note += f" ({ignored} ignored by the incident table)"
    unknown = health_coverage(report, facts)  # incidents on the GPUs it watches are reported still
    return CheckResult(HEALTH, findings=tuple(merged.values()), unknown=unknown, note=note)


CHECKS = (
    CheckSpec(
        "dcgm-health",
        check_dcgm_health,
        (Input.DCGM_HEALTH, Input.GPUS),
        "dcgm-health",
        (DCGM_HEALTH_UNLISTED_FAIL, DCGM_HEALTH_UNLISTED_WARN, DCGM_HEALTH_SECOND_ENGINE),
    ),
    CheckSpec(
        "dcgm-diag",
        check_dcgm_diag,
        (Input.DCGM_DIAG, Input.GPUS),
        "dcgm-diag",
        (DCGM_DIAG_FAIL_ISOLATE, DCGM_DIAG_FAIL_RESET, DCGM_DIAG_FAIL, DCGM_DIAG_WARN),
    ),
)
