"""The Node contract (DESIGN.md §4): every key, value, taint, condition and Event reason this agent
writes on its own Node, the `results` annotation's schema, and the Marks the engine hands the
writer. Nobody else spells a key or a reason: writer, brake, status table, engine and tests import
them from here."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from agent import __version__
from agent.core.findings import CheckResult, Verdict
from agent.core.severity import Severity, Status
from agent.core.text import shorten
from agent.core.trends import TRENDS_FIELD, drop_oldest_read

DEFAULT_PREFIX = "gpu-healthcheck"
DEFAULT_CONDITION_TYPE = "GPUHealthy"
DEFAULT_TAINT_EFFECT = "NoSchedule"
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
VALIDATING_EFFECT = "NoSchedule"  # the validating taint's effect (Keys.validating)
TAINT_SEVERITIES = ("reset", "reboot", "isolate")  # the severities that fail a node, mildest first
# node.mode: observe = labels, annotation, condition and Events, never a taint; label = observe plus
# the label <prefix>/unhealthy=<severity> where the taint would be; taint = the taint itself.
MODE_OBSERVE, MODE_LABEL, MODE_TAINT = "observe", "label", "taint"
MODES = (MODE_OBSERVE, MODE_LABEL, MODE_TAINT)
DEFAULT_MODE = MODE_TAINT
COMPONENT = "gpu-healthcheck"  # Events' source and the field manager of our writes
EVENT_NAMESPACE = "default"  # where the API server keeps Events about Nodes

# Keys of others that the agent reads (never writes).
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"

TRUE = "true"  # <prefix>/tainted while our taint is on
DISABLED = "disabled"  # <prefix>/taint=disabled: an operator's "do not taint this node"
CANARY = "canary"  # <prefix>/config=canary: an operator's "run the canary ConfigMap on this node"
CLEAR_ALL = "all"  # <prefix>/clear-latched=all
# Condition types others own: the kubelet's. node.conditionType and node.remediationConditions may not
# name one (the agent would fight the kubelet over the Node's readiness).
KUBELET_CONDITION_TYPES = ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable")
# A condition type we may be configured to write: a qualified name, as metav1.Condition's type (it is
# written into the admission fence as a CEL string: no quote can be in it).
CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
CONDITION_TYPE_MAX = 316


@dataclass(frozen=True)
class Keys:
    """Our keys under one configurable prefix (config `prefix`)."""

    prefix: str = DEFAULT_PREFIX

    @property
    def status(self) -> str:
        """Label: pass | warn | fail | unknown."""
        return f"{self.prefix}/status"

    @property
    def severity(self) -> str:
        """Label: none | monitor | reset | reboot | isolate."""
        return f"{self.prefix}/severity"

    @property
    def tainted(self) -> str:
        """Label `true` exactly while our taint is on (lets the brake count tainted nodes)."""
        return f"{self.prefix}/tainted"

    @property
    def taint(self) -> str:
        """The taint's key (value: the severity); also the operator's opt-out label (`=disabled`)."""
        return f"{self.prefix}/unhealthy"

    @property
    def validating(self) -> str:
        """The startup taint (effect NoSchedule) a node carries until it has passed every check: the
        kubelet's --register-with-taints, Karpenter's startupTaints or the agent (node.validate)
        puts it on; only the agent lifts it, after a complete pass (engine/validation.py)."""
        return f"{self.prefix}/validating"

    @property
    def unhealthy(self) -> str:
        """Label (mode `label`): the taint's key and value, where the taint would be."""
        return self.taint

    @property
    def taint_opt_out(self) -> str:
        return f"{self.prefix}/taint"

    @property
    def config_channel(self) -> str:
        """Label an operator sets (`=canary`) for the agent to run the canary ConfigMap; the agent
        only reads it (config/canary.py)."""
        return f"{self.prefix}/config"

    @property
    def results(self) -> str:
        """Annotation: the results JSON (results_document)."""
        return f"{self.prefix}/results"

    @property
    def clear_latched(self) -> str:
        """Annotation an operator sets ("all" or comma-separated latch keys); the agent removes it."""
        return f"{self.prefix}/clear-latched"

    @property
    def clear_latched_by(self) -> str:
        """Annotation `gpu-healthcheck clear` sets beside clear-latched: who asked and why (JSON
        ClearRequest); the agent names them in its LatchesCleared Event, keeps them in the results
        annotation's `lastClear` and removes this one with clear-latched."""
        return f"{self.prefix}/clear-latched-by"

    def ours(self, key: str) -> bool:
        return key.startswith(f"{self.prefix}/")

    @staticmethod
    def selector(base: str, own: str) -> str:
        """Both label selectors (AND); either may be empty."""
        return ",".join(s for s in (base, own) if s)

    def tainted_selector(self, base: str) -> str:
        """GPU nodes (base selector) that carry our taint."""
        return self.selector(base, f"{self.tainted}={TRUE}")

    def contenders_selector(self, base: str, min_severity: str = TAINT_SEVERITIES[0]) -> str:
        """Failing GPU nodes that want our taint (at node.taintMinSeverity or above) and do not have
        it (nor refuse it). A node failing below that severity is no contender: it never taints."""
        worthy = ",".join(TAINT_SEVERITIES[TAINT_SEVERITIES.index(min_severity) :])
        own = (
            f"{self.status}={Status.FAIL.value},{self.severity} in ({worthy}),"
            f"{self.tainted}!={TRUE},{self.taint_opt_out}!={DISABLED}"
        )
        return self.selector(base, own)


@dataclass(frozen=True)
class Condition:
    status: str  # "True" | "False" | "Unknown"
    reason: str  # CamelCase, as `kubectl describe node` shows it


CONDITIONS: dict[Status, Condition] = {
    Status.PASS: Condition("True", "AllChecksPassed"),
    Status.WARN: Condition("True", "ChecksWarn"),
    Status.FAIL: Condition("False", "ChecksFailed"),
    Status.UNKNOWN: Condition("Unknown", "CouldNotCheck"),
}


class Reason:
    """The Events the agent posts on its Node."""

    GPU_HEALTH_CHANGED = "GPUHealthChanged"
    LATCHED_FINDING = "LatchedFinding"
    LATCHES_CLEARED = "LatchesCleared"
    TAINT_ADDED = "TaintAdded"
    TAINT_REMOVED = "TaintRemoved"
    TAINT_RESTORED = "TaintRestored"
    TAINT_DISABLED = "TaintDisabled"
    BRAKE_OPEN = "BrakeOpen"
    BRAKE_CLOSED = "BrakeClosed"
    CONFIG_RELOADED = "ConfigReloaded"
    CONFIG_REJECTED = "ConfigRejected"
    CONFIG_RESTART_REQUIRED = "ConfigRestartRequired"
    NODE_WRITE_REFUSED = "NodeWriteRefused"  # the API server refused a write (reporters/refusals.py)
    REMEDIATION_HELD = "RemediationHeld"  # the repair budget or a wave hold keeps a new mark back
    VALIDATION_STARTED = "ValidationStarted"  # the agent put the validating taint on (node.validate)
    VALIDATION_PASSED = "ValidationPassed"  # a complete pass: the validating taint is lifted


CONFIG_REJECTED_REASON = Reason.CONFIG_REJECTED  # the condition's reason too, while it lasts


# ----------------------------------------------------------------------------- remediation conditions

TRUE_FALSE = ("True", "False")


@dataclass(frozen=True)
class RemediationCondition:
    """One entry of `node.remediationConditions`: a NodeCondition type a remediation engine watches
    (Karpenter/EKS node repair, a Cluster API MachineHealthCheck, a medik8s NodeHealthCheck), written
    at `unhealthy_status` while the node carries our taint for a failure at `min_severity` or above
    (after hysteresis), and at the other of True/False otherwise."""

    type: str
    unhealthy_status: str = "False"  # "True" | "False"
    min_severity: Severity = Severity.RESET

    @property
    def healthy_status(self) -> str:
        return TRUE_FALSE[1] if self.unhealthy_status == TRUE_FALSE[0] else TRUE_FALSE[0]


class RemediationReason:
    """The reasons of the remediation conditions: distinct from every other component's, so that the
    agent (and the admission fence) can tell a condition it wrote from one it must never touch."""

    FAILED = "GPUHealthcheckFailed"  # unhealthy: fail at minSeverity or above, the node tainted
    RECOVERING = "GPUHealthcheckRecovering"  # unhealthy still: recovering, or paused by an unknown cycle
    PASSED = "GPUHealthcheckPassed"  # healthy: pass or warn
    BELOW_MIN_SEVERITY = "GPUHealthcheckBelowMinSeverity"  # healthy: a failure below this minSeverity
    COULD_NOT_CHECK = "GPUHealthcheckCouldNotCheck"  # healthy: unknown never marks a node unhealthy
    BRAKE_HELD = "GPUHealthcheckBrakeHeld"  # healthy: the brake holds this node back
    TAINT_DISABLED = "GPUHealthcheckTaintDisabled"  # healthy: <prefix>/taint=disabled on the Node
    NOT_ENFORCED = "GPUHealthcheckNotEnforced"  # healthy: node.mode observe or label, or no taint
    BUDGET_HELD = "GPUHealthcheckBudgetHeld"  # healthy: node.repairBudget is spent for this window
    WAVE_HELD = "GPUHealthcheckWaveHeld"  # healthy: a correlated wave on this finding key (node.waveHold)

    ALL = (
        FAILED,
        RECOVERING,
        PASSED,
        BELOW_MIN_SEVERITY,
        COULD_NOT_CHECK,
        BRAKE_HELD,
        TAINT_DISABLED,
        NOT_ENFORCED,
        BUDGET_HELD,
        WAVE_HELD,
    )


# Every reason a condition of ours can carry: the admission fence lets the agent delete a condition of
# a type no longer configured only when it carries one of these (it was ours).
OUR_CONDITION_REASONS: tuple[str, ...] = (
    *dict.fromkeys(c.reason for c in CONDITIONS.values()),
    CONFIG_REJECTED_REASON,
    *RemediationReason.ALL,
)


@dataclass(frozen=True)
class RemediationMark:
    """What the engine wants one remediation condition to say. `unhealthy` is the engine's wish (mode
    `taint`, a failure at minSeverity or above, hysteresis); the writer writes the unhealthy status
    only where our taint is on after the brake, and says why not otherwise."""

    type: str
    unhealthy_status: str
    unhealthy: bool
    reason: str  # while the wish stands (FAILED/RECOVERING), or why the node is not unhealthy
    message: str
    key: str = ""  # the finding key a new mark is counted under (core/repair_budget.finding_key)

    @property
    def healthy_status(self) -> str:
        return RemediationCondition(self.type, self.unhealthy_status).healthy_status


NORMAL, WARNING = "Normal", "Warning"
EVENT_MESSAGE_MAX = 1024
CONDITION_MESSAGE_MAX = 1024


@dataclass(frozen=True)
class NodeEvent:
    """An Event on the Node (reason from Reason)."""

    reason: str
    message: str
    type: str = NORMAL  # or WARNING


@dataclass(frozen=True)
class Marks:
    """The desired state of this agent's keys on its own Node.

    `taint` is the engine's wish (status fail at taintMinSeverity or above, after hysteresis, mode
    `taint`); the writer still honours the `<prefix>/taint=disabled` label and the cluster-wide brake
    before adding a taint.
    """

    status: Status
    severity: Severity
    results_json: str  # the compact `<prefix>/results` annotation value
    taint: bool
    condition_message: str
    events: tuple[NodeEvent, ...] = field(default=())
    drop_annotations: tuple[str, ...] = field(default=())  # our annotations to remove (consumed requests)
    # The taint's value: the last failing severity, kept while a tainted node recovers or is unknown
    # (None: the verdict's severity).
    taint_severity: Severity | None = None
    taint_effect: str = DEFAULT_TAINT_EFFECT  # node.taintEffect or node.taintEffectBySeverity
    unhealthy_label: bool = False  # mode `label`: the label <prefix>/unhealthy instead of the taint
    config_rejected: bool = False  # the mounted config is invalid: the condition's reason says so
    # What of the annotation's trend reads makes a write necessary (core/trends.counters_digest).
    trends_digest: str = ""
    remediation: tuple[RemediationMark, ...] = field(default=())  # node.remediationConditions
    # The validating taint (Keys.validating): True = put it on, False = lift it where it is (a
    # complete pass), None = leave it as it is (engine/validation.py).
    validating: bool | None = None

    @property
    def taint_value(self) -> str:
        return (self.taint_severity or self.severity).label

    @property
    def condition_status(self) -> str:
        """The condition follows the status, so that no writer or test can pair them otherwise."""
        return CONDITIONS[self.status].status

    @property
    def condition_reason(self) -> str:
        """The status's reason, or ConfigRejected while the agent runs on a config it fell back to
        (the status still tells health; the message says which config is in force and why)."""
        return CONFIG_REJECTED_REASON if self.config_rejected else CONDITIONS[self.status].reason


@dataclass(frozen=True)
class ClearRequest:
    """Who asked to clear latched findings and why: the `<prefix>/clear-latched-by` annotation that
    `gpu-healthcheck clear` writes beside `<prefix>/clear-latched` (JSON)."""

    by: str  # the requester's Kubernetes identity (SelfSubjectReview), else the kubeconfig user
    reason: str
    at: str = ""  # RFC 3339, when it was asked
    force: bool = False  # asked although a current check still failed
    failing: tuple[str, ...] = ()  # with force: the checks that still failed then

    def encode(self) -> str:
        doc: dict[str, Any] = {"by": self.by, "reason": self.reason, "at": self.at}
        if self.force:
            doc["force"] = True
            doc["failing"] = list(self.failing)
        return encode(doc)

    @classmethod
    def decode(cls, raw: str | None) -> ClearRequest | None:
        """The request, or None when absent or unreadable (an Event then says by whom is unknown)."""
        doc = decode_results(raw)
        if doc is None or not isinstance(doc.get("by"), str) or not isinstance(doc.get("reason"), str):
            return None
        failing = doc.get("failing")
        return cls(
            by=doc["by"],
            reason=doc["reason"],
            at=str(doc.get("at") or ""),
            force=doc.get("force") is True,
            failing=tuple(str(x) for x in failing) if isinstance(failing, list) else (),
        )


# ----------------------------------------------------------------------------- the results annotation

RESULTS_VERSION = 1
MAX_RESULTS_BYTES = 16 * 1024
TAINT_FIELD = "taint"  # {"severity", "passes"} while the taint is wanted; absent otherwise
GPUS_FIELD = "gpus"  # one verdict per GPU (engine/gpu_verdicts.py)
HISTORY_FIELD = "history"  # failing findings per GPU and the boots they were seen in (engine/history.py)
# TRENDS_FIELD ("trends", core/trends.py): the kept reads the trend warnings judge
STALE_AFTER_FIELD = "staleAfterSeconds"  # the agent is unready (and unlive) past this without a check
REMEDIATION_FIELD = "remediation"  # {type: {"severity", "passes", "cause"}} while an entry is unhealthy
LAST_CLEAR_FIELD = "lastClear"  # the last clear-latched request the agent acted on (ClearRequest + at)
CONFIG_FIELD = "config"  # {"source", "digest", "mode"}: the config in force (engine/rollout.py)
WOULD_FIELD = "would"  # {"taint", "mark"}: what mode taint does, in any mode (engine/rollout.py)
VALIDATED_FIELD = "validated"  # {"bootId", "at"}: the last complete pass (engine/validation.py)


def stale_after_s(gpu_interval_s: float) -> int:
    """How long the agent may go without a check before /healthz and /readyz fail: its readiness
    then means "checked within this", which `status` turns into the age of the last check."""
    return int(max(60.0, 3 * gpu_interval_s))


def now_iso() -> str:
    """RFC 3339 UTC, seconds: every time the agent writes (results, conditions, Events)."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def results_document(
    verdict: Verdict,
    *,
    checked_at: str,
    boot_id: str | None,
    instance_type: str | None,
    latched: Sequence[dict[str, Any]] | None = None,
    check_times: dict[str, str] | None = None,
    taint: dict[str, Any] | None = None,
    stale_after: int | None = None,
    gpus: Sequence[dict[str, Any]] | None = None,
    history: Sequence[dict[str, Any]] | None = None,
    trends: dict[str, Any] | None = None,
    remediation: dict[str, Any] | None = None,
    last_clear: dict[str, Any] | None = None,
    rollout: dict[str, Any] | None = None,
    validated: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `<prefix>/results` JSON object. `latched` defaults to this run's latched findings."""
    checks = [
        {
            "name": r.name,
            "status": r.status.value,
            "severity": r.severity.label,
            "message": r.message,
            "at": (check_times or {}).get(r.name, checked_at),
            "durationMs": round(r.duration_ms, 2),
            "entities": list(r.all_entities()),
            **_next_step(r),
        }
        for r in verdict.results
    ]
    if latched is None:
        latched = [
            {
                "check": f.check,
                "key": f.key,
                "severity": f.severity.label,
                "since": checked_at,
                "message": f.message,
                **f.recommendation.as_dict(),
            }
            for r in verdict.results
            for f in r.findings
            if f.latched
        ]
    doc: dict[str, Any] = {
        "version": RESULTS_VERSION,
        "status": verdict.status.value,
        "severity": verdict.severity.label,
        "checkedAt": checked_at,
        "bootId": boot_id,
        "instanceType": instance_type,
        "agentVersion": __version__,
        "checks": checks,
        "latched": list(latched),
    }
    if taint is not None:
        doc[TAINT_FIELD] = taint
    if stale_after is not None:
        doc[STALE_AFTER_FIELD] = stale_after
    if gpus is not None:
        doc[GPUS_FIELD] = list(gpus)
    if history:
        doc[HISTORY_FIELD] = list(history)
    if trends:
        doc[TRENDS_FIELD] = trends
    if remediation:
        doc[REMEDIATION_FIELD] = remediation
    if last_clear:
        doc[LAST_CLEAR_FIELD] = last_clear
    doc.update(rollout or {})  # CONFIG_FIELD, WOULD_FIELD
    if validated:
        doc[VALIDATED_FIELD] = validated
    return fit(doc)


def _next_step(result: CheckResult) -> dict[str, Any]:
    """{"action", "escalation"} of a check's worst finding (core/actions.py); {} without one."""
    worst = max(result.findings, key=lambda f: f.severity, default=None)
    if worst is None or worst.severity <= Severity.NONE:
        return {}
    return worst.recommendation.as_dict()


def encode(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def decode_results(raw: str | None) -> dict[str, Any] | None:
    """The parsed results annotation; None when absent or not a JSON object."""
    if not raw:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def fit(doc: dict[str, Any], limit: int = MAX_RESULTS_BYTES) -> dict[str, Any]:
    """Keep the annotation under its size limit: shorten messages, then entities, never drop a check."""
    for msg_len, ent_len in ((400, 32), (200, 8), (100, 2), (60, 0)):
        if len(encode(doc).encode()) <= limit:
            return doc
        for item in (*doc["checks"], *doc["latched"]):
            item["message"] = shorten(item["message"], msg_len)
            if "entities" in item and len(item["entities"]) > ent_len:
                item["entities"] = [*item["entities"][:ent_len], f"+{len(item['entities']) - ent_len} more"]
    for entry in doc.get(GPUS_FIELD) or ():  # pods are a courtesy: they go before any latch
        if len(encode(doc).encode()) <= limit:
            break
        entry.pop("pods", None)
    while len(encode(doc).encode()) > limit and TRENDS_FIELD in doc:
        # The oldest trend reads go next (warnings already judged stay in their checks), then all.
        if not drop_oldest_read(doc[TRENDS_FIELD]):
            del doc[TRENDS_FIELD]
    while len(encode(doc).encode()) > limit and len(doc["latched"]) > 1:
        # Latched findings are ordered oldest first; keep the most severe when something must go.
        doc["latched"].sort(key=lambda x: Severity.parse(x["severity"]))
        doc["latched"].pop(0)
    return doc
