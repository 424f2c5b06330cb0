"""The Node contract's names (DESIGN.md §4): every key, value, taint, condition and Event reason this agent
writes on its own Node, and the keys of others it reads. Nobody else spells a key or a reason: writer,
brake, status table, engine and tests import them from here."""

from __future__ import annotations

from dataclasses import dataclass
from enum import unique

from agent.core.severity import Status
from agent.core.vocabulary import Vocabulary

DEFAULT_PREFIX = "gpu-healthcheck"
DEFAULT_CONDITION_TYPE = "GPUHealthy"
DEFAULT_TAINT_EFFECT = "NoSchedule"
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
VALIDATING_EFFECT = "NoSchedule"  # the validating taint's effect (Keys.validating)
TESTING_EFFECT = "NoSchedule"  # the testing taint's effect (Keys.testing)
TAINT_SEVERITIES = ("reset", "reboot", "isolate")  # the severities that fail a node, mildest first
# A DeviceTaintRule's effects (no PreferNoSchedule there), and the default per severity: a GPU that
# needs a reboot or a replacement cannot serve, so only the pods holding it are evicted (DESIGN.md §3.7).
DEVICE_TAINT_EFFECTS = ("NoSchedule", "NoExecute")
DEVICE_EFFECT_DEFAULTS = {"reboot": "NoExecute", "isolate": "NoExecute"}
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
# The image canary (docs/guides/upgrade.md): an operator's label, read by the DaemonSets' node
# affinity only (the main agent DaemonSet leaves these nodes to gpu-healthcheck-agent-canary) and by
# `status`, from the agent pods' labels. The install's key, not under `prefix`; the agent never writes it.
TRACK_LABEL = "gpu-healthcheck/track"
CLEAR_ALL = "all"  # <prefix>/clear-latched=all
# The outcome of the last diag an operator asked for (`gpu-healthcheck diag NODE`), as the results
# annotation's `lastDiag` records it: started, then completed (the diag gave a result: the dcgm-diag
# check judges it) or aborted (a pod came for the GPUs, or the diag ended without a result).
DIAG_STARTED, DIAG_COMPLETED, DIAG_ABORTED = "started", "completed", "aborted"
DIAG_OUTCOMES = (DIAG_STARTED, DIAG_COMPLETED, DIAG_ABORTED)
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
        """Label: pass | warn | fail | unknown | degraded (every failing finding on isolated GPUs)."""
        return f"{self.prefix}/status"

    @property
    def severity(self) -> str:
        """Label: none | monitor | reset | reboot | isolate."""
        return f"{self.prefix}/severity"

    @property
    def gpus_in_service(self) -> str:
        """Label `7-of-8` while the node is degraded (GPUs isolated by our DeviceTaintRules; the rest
        serve); absent otherwise."""
        return f"{self.prefix}/gpus-in-service"

    @property
    def tainted(self) -> str:
        """Label `true` exactly while our taint is on (lets the brake count tainted nodes)."""
        return f"{self.prefix}/tainted"

    @property
    def brake_slot(self) -> str:
        """Label: the brake slot this node holds (its name less `<prefix>-taint-`), written in the
        PATCH that adds our taint and removed with it; a slot its holder's Node does not claim counts
        for nothing once past its grace (core/brake_count.py)."""
        return f"{self.prefix}/brake-slot"

    @property
    def taint(self) -> str:
        """The taint's key (value: the severity); the opt-out label is taint_opt_out's."""
        return f"{self.prefix}/unhealthy"

    @property
    def validating(self) -> str:
        """The startup taint (effect NoSchedule) a node carries until it has passed every check: the
        kubelet's --register-with-taints, Karpenter's startupTaints or the agent (node.validate)
        puts it on; only the agent lifts it, after a complete pass (engine/validation.py)."""
        return f"{self.prefix}/validating"

    @property
    def risk(self) -> str:
        """Label `high` | `normal`: failure episodes and repairs in the last days, from the history
        annotation's per-day counts (core/node_risk.py)."""
        return f"{self.prefix}/risk"

    @property
    def testing(self) -> str:
        """The taint (effect NoSchedule) the node carries while an active check (the DCGM diag)
        runs: the agent puts it on before and lifts it after (core/active_checks.py). Counted by
        nothing else: not the brake, not the remediation conditions."""
        return f"{self.prefix}/testing"

    @property
    def diag_requested(self) -> str:
        """Annotation `gpu-healthcheck diag NODE` sets: a DCGM diag at the next idle window, who
        asked and why (JSON DiagRequest); the agent removes it when the diag starts."""
        return f"{self.prefix}/diag-requested"

    @property
    def unhealthy(self) -> str:
        """Label (mode `label`): the taint's key and value, where the taint would be."""
        return self.taint

    @property
    def taint_opt_out(self) -> str:
        """Label an operator sets (`=disabled`) to keep our taint off this node; the agent only reads it."""
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
    def history(self) -> str:
        """Annotation: the Node's last transitions, what was done and by whom (core/history_annotation.py);
        apart from `results`, whose size it never crowds."""
        return f"{self.prefix}/history"

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

    @property
    def holding_status(self) -> str:
        """Label selector: a Node whose status says its isolated GPUs may hold a brake slot with no
        taint of ours: degraded, or failing (an older agent's isolated node)."""
        return f"{self.status} in ({Status.FAIL.value},{Status.DEGRADED.value})"

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


@unique
class ConditionReason(Vocabulary):
    """The reasons of the node.conditionType condition (GPUHealthy), one per status, and the fallback
    config's (CamelCase, as `kubectl describe node` shows them)."""

    ALL_CHECKS_PASSED = "AllChecksPassed"
    CHECKS_WARN = "ChecksWarn"
    CHECKS_FAILED = "ChecksFailed"
    CHECKS_UNKNOWN = "CouldNotCheck"
    GPUS_ISOLATED = "GPUsIsolated"  # degraded: the node serves its other GPUs
    CONFIG_REJECTED = "ConfigRejected"  # the mounted config is invalid; the same word as its Event's


@dataclass(frozen=True)
class Condition:
    status: str  # "True" | "False" | "Unknown"
    reason: ConditionReason


CONDITIONS: dict[Status, Condition] = {
    Status.PASS: Condition("True", ConditionReason.ALL_CHECKS_PASSED),
    Status.WARN: Condition("True", ConditionReason.CHECKS_WARN),
    Status.FAIL: Condition("False", ConditionReason.CHECKS_FAILED),
    Status.UNKNOWN: Condition("Unknown", ConditionReason.CHECKS_UNKNOWN),
    # The node serves its other GPUs: as a node it is healthy; the isolated GPUs are out by their
    # DeviceTaintRules, and repair engines watch node.remediationConditions, not this (DESIGN.md §3.7).
    Status.DEGRADED: Condition("True", ConditionReason.GPUS_ISOLATED),
}


@unique
class EventReason(Vocabulary):
    """The reasons of the Events the agent posts on its Node."""

    GPU_HEALTH_CHANGED = "GPUHealthChanged"  # the node's status changed: the worst finding, the step
    LATCHED_FINDING = "LatchedFinding"  # a finding that stays until cleared (an Xid): what, the step
    LATCHES_CLEARED = "LatchesCleared"  # an operator's clear taken: which latches, who and why
    TAINT_ADDED = "TaintAdded"  # our taint put on, with why
    TAINT_REMOVED = "TaintRemoved"  # our taint taken off: the node recovered or was cleared
    TAINT_RESTORED = "TaintRestored"  # our taint removed by hand while the node fails: put back
    TAINT_OPTED_OUT = "TaintDisabled"  # the label <prefix>/taint=disabled keeps our taint off
    BRAKE_OPEN = "BrakeOpen"  # not tainting although the node fails: the brake holds it back
    BRAKE_CLOSED = "BrakeClosed"  # below the brake's limit again (tainting), or no taint needed
    CONFIG_RELOADED = "ConfigReloaded"  # a changed ConfigMap taken: what was applied
    CONFIG_REJECTED = "ConfigRejected"  # the condition's reason too, while it lasts
    CONFIG_RESTART_REQUIRED = "ConfigRestartRequired"  # a restart-only key changed: old value kept
    NODE_WRITE_REFUSED = "NodeWriteRefused"  # the API server refused a write (reporters/refusals.py)
    REMEDIATION_HELD = "RemediationHeld"  # the repair budget or a wave hold keeps a new mark back
    VALIDATION_STARTED = "ValidationStarted"  # the agent put the validating taint on (node.validate)
    VALIDATION_PASSED = "ValidationPassed"  # a complete pass: the validating taint is lifted
    VALIDATION_DRIVER_TIMEOUT = "ValidationDriverTimeout"  # the DRA driver has not published the GPUs
    ACTIVE_CHECK_STARTED = "ActiveCheckStarted"  # a diag an operator asked for started (who, why)
    ACTIVE_CHECK_ABORTED = "ActiveCheckAborted"  # a pod arrived during a diag: aborted, not run, retried
    GPU_STALLED = "GPUStalled"  # a GPU held by a pod, busy at its idle power (checks/gpu_stall.py)
    DEVICE_TAINTS_UNAVAILABLE = "DeviceTaintsUnavailable"  # no DeviceTaintRule API: the node taint
    GPU_ISOLATED = "GPUIsolated"  # a DeviceTaintRule of ours took one GPU out; the node still serves
    GPU_RETURNED = "GPUReturned"  # that rule is gone: the GPU serves again


NORMAL, WARNING = "Normal", "Warning"
EVENT_MESSAGE_MAX = 1024
CONDITION_MESSAGE_MAX = 1024
