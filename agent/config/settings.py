"""Typed views of config.yaml's sections: the agent reads `cfg.node.recover_after`, not
`cfg.raw["node"]["recoverAfter"]` cast at each call site. Built from the validated document, so
every value is there and of its type."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.config.schema import REMEDIATION_ENTRY, ConfigError, validate
from agent.core.active_checks import ActivePolicy, parse_max_concurrent
from agent.core.gpu_nodes import parse_selector
from agent.core.gpu_stall import StallPolicy
from agent.core.node_keys import CONDITION_TYPE_MAX, CONDITION_TYPE_PATTERN, KUBELET_CONDITION_TYPES
from agent.core.node_risk import RiskPolicy
from agent.core.peers import PeerPolicy
from agent.core.remediation_types import RemediationCondition
from agent.core.repair_budget import BudgetPolicy, WavePolicy
from agent.core.repair_escalation import DAY_S, RepairPolicy
from agent.core.severity import Severity


@dataclass(frozen=True)
class Intervals:
    """Seconds between runs of each tier."""

    gpu: float
    efa: float
    topology: float
    dcgm_health: float
    dcgm_diag: float
    sdc_probe: float = 604800.0


@dataclass(frozen=True)
class Timeouts:
    nvidia_smi: float
    nvml: float
    check: float


@dataclass(frozen=True)
class Thresholds:
    retired_pages_single_bit_max: float
    efa_counter_rate_per_sec: Mapping[str, float]
    dcgm_wedge_ecc_per_sec: float = 10.0


@dataclass(frozen=True)
class TrendSettings:
    """How trend reads are kept and the trend rules' thresholds (docs/checks.md "Warnings before a fault")."""

    read_spacing_s: float
    keep_reads: int
    remap_banks_low: int
    remap_rows_growth: int
    ecc_correctable_per_hour: float
    retired_pages_warn_at: int
    nvlink_growing_reads: int
    pcie_growing_reads: int
    thermal_margin_c: float
    thermal_reads: int
    clock_shortfall_percent: float
    clock_busy_percent: float
    clock_reads: int


@dataclass(frozen=True)
class ValidateSettings:
    """node.validate: the validating taint (engine/validation.py)."""

    add_taint: bool = False  # the agent puts it on at start (not validated this boot) and on a clear
    diag_level: int = 2  # the DCGM diag level a complete pass needs, where an engine runs
    # NVIDIA's DRA driver publishes the GPUs before the lift (engine/driver_wait.py)
    wait_for_driver: str = "auto"  # auto | always | never
    driver_timeout_seconds: float = 600.0  # then the reason is said (Event, annotation); the taint stays
    require_all_published: bool = True  # every GPU seen, not just one


@dataclass(frozen=True)
class NodeSettings:
    """How the agent marks its Node, and the brake."""

    mode: str  # observe | label | taint
    isolation: str  # node | gpu | auto: per-GPU DRA device taints (core/device_scope)
    recover_after: int
    confirm_after: int  # consecutive failing runs of its check before a rule marked `confirm` fails
    escalate_after_reboots: int  # a failing finding back on the same GPU after N reboots: isolate (0 off)
    taint_min_severity: Severity
    taint_effect: str
    taint_effect_by_severity: Mapping[Severity, str]
    condition_type: str
    remediation_conditions: tuple[RemediationCondition, ...]  # conditions remediation engines watch
    max_tainted_fraction: float
    max_tainted_nodes: int
    repair_budget: BudgetPolicy  # node.repairBudget: new remediation marks per window
    wave_hold: WavePolicy  # node.waveHold: new marks held while one finding key fails in a wave
    repair_history: RepairPolicy  # node.repairHistory: failed again after N repairs: replace
    gpu_node_selectors: tuple[str, ...]  # as configured; Config.gpu_node_selection adds the profiles
    validate: ValidateSettings = field(default_factory=lambda: ValidateSettings())
    risk: RiskPolicy = field(default_factory=lambda: RiskPolicy())  # node.risk: the risk label
    active_checks: ActivePolicy = field(default_factory=lambda: ActivePolicy())  # node.activeChecks
    isolation_node_at: int = 2  # node.isolationNodeAtGpus: GPUs failing at once that make a node fault
    device_effect_by_severity: Mapping[Severity, str] = field(default_factory=dict)

    def effect_for(self, severity: Severity) -> str:
        """The taint's effect for a failing severity: taintEffectBySeverity, else taintEffect."""
        return self.taint_effect_by_severity.get(severity, self.taint_effect)

    def device_effect_for(self, severity: Severity) -> str:
        """A DeviceTaintRule's effect: deviceTaintEffectBySeverity, else the node's (PreferNoSchedule,
        which a device taint has not, as NoSchedule)."""
        effect = self.device_effect_by_severity.get(severity) or self.effect_for(severity)
        return "NoExecute" if effect == "NoExecute" else "NoSchedule"


@dataclass(frozen=True)
class DcgmSettings:
    address: str
    connect_timeout: float
    grace_seconds: float
    diag_level: int
    diag_timeout: float
    heartbeat_seconds: float
    call_timeout: float = 10.0


def intervals(raw: Mapping[str, Any]) -> Intervals:
    s = raw["intervals"]
    return Intervals(
        float(s["gpu"]),
        float(s["efa"]),
        float(s["topology"]),
        float(s["dcgmHealth"]),
        float(s["dcgmDiag"]),
        float(s["sdcProbe"]),
    )


def timeouts(raw: Mapping[str, Any]) -> Timeouts:
    s = raw["timeouts"]
    return Timeouts(float(s["nvidiaSmi"]), float(s["nvml"]), float(s["check"]))


def thresholds(raw: Mapping[str, Any]) -> Thresholds:
    s = raw["thresholds"]
    rates = {str(k): float(v) for k, v in s["efaCounterRatePerSec"].items()}
    return Thresholds(float(s["retiredPagesSingleBitMax"]), rates, float(s["dcgmWedgeEccPerSec"]))


def trend_settings(raw: Mapping[str, Any]) -> TrendSettings:
    """Raises ConfigError when a rule asks for more reads than are kept (it could never warn)."""
    s = raw["trends"]
    out = TrendSettings(
        read_spacing_s=float(s["readSpacingSeconds"]),
        keep_reads=int(s["keepReads"]),
        remap_banks_low=int(s["remapBanksLow"]),
        remap_rows_growth=int(s["remapRowsGrowth"]),
        ecc_correctable_per_hour=float(s["eccCorrectablePerHour"]),
        retired_pages_warn_at=int(s["retiredPagesWarnAt"]),
        nvlink_growing_reads=int(s["nvlinkGrowingReads"]),
        pcie_growing_reads=int(s["pcieGrowingReads"]),
        thermal_margin_c=float(s["thermalMarginC"]),
        thermal_reads=int(s["thermalReads"]),
        clock_shortfall_percent=float(s["clockShortfallPercent"]),
        clock_busy_percent=float(s["clockBusyPercent"]),
        clock_reads=int(s["clockReads"]),
    )
    # N growing reads are N intervals: N + 1 reads.
    for key, reads in (
        ("nvlinkGrowingReads", out.nvlink_growing_reads + 1),
        ("pcieGrowingReads", out.pcie_growing_reads + 1),
        ("thermalReads", out.thermal_reads),
        ("clockReads", out.clock_reads),
    ):
        if reads > out.keep_reads:
            raise ConfigError(
                f"trends.{key}: needs {reads} kept reads but trends.keepReads is {out.keep_reads}"
            )
    return out


def node_settings(raw: Mapping[str, Any]) -> NodeSettings:
    s = raw["node"]
    return NodeSettings(
        mode=str(s["mode"]),
        isolation=str(s["isolation"]),
        recover_after=int(s["recoverAfter"]),
        confirm_after=int(s["confirmAfter"]),
        escalate_after_reboots=int(s["escalateAfterReboots"]),
        taint_min_severity=Severity.parse(str(s["taintMinSeverity"])),
        taint_effect=str(s["taintEffect"]),
        taint_effect_by_severity={
            Severity.parse(k): str(v) for k, v in s["taintEffectBySeverity"].items() if v is not None
        },
        condition_type=condition_type(s["conditionType"]),
        remediation_conditions=remediation_conditions(
            s["remediationConditions"], str(s["conditionType"]), Severity.parse(str(s["taintMinSeverity"]))
        ),
        max_tainted_fraction=float(s["maxTaintedFraction"]),
        max_tainted_nodes=int(s["maxTaintedNodes"]),
        repair_budget=repair_budget(s["repairBudget"]),
        wave_hold=WavePolicy(
            int(s["waveHold"]["minNodes"]),
            float(s["waveHold"]["minFraction"]),
            float(s["waveHold"]["windowMinutes"]) * 60,
        ),
        repair_history=RepairPolicy(
            int(s["repairHistory"]["count"]), float(s["repairHistory"]["windowDays"]) * DAY_S
        ),
        gpu_node_selectors=gpu_node_selectors(s["gpuNodeSelector"]),
        validate=validate_settings(s["validate"]),
        risk=RiskPolicy(*(int(s["risk"][k]) for k in ("failures", "repairs", "windowDays", "gpus"))),
        active_checks=active_policy(s["activeChecks"]),
        isolation_node_at=int(s["isolationNodeAtGpus"]),
        device_effect_by_severity={
            Severity.parse(k): str(v) for k, v in s["deviceTaintEffectBySeverity"].items() if v is not None
        },
    )


def validate_settings(s: Mapping[str, Any]) -> ValidateSettings:
    """node.validate (the schema checked each value)."""
    return ValidateSettings(
        bool(s["addTaint"]),
        int(s["diagLevel"]),
        str(s["waitForDriver"]),
        float(s["driverTimeoutSeconds"]),
        bool(s["requireAllPublished"]),
    )


def active_policy(s: Mapping[str, Any]) -> ActivePolicy:
    """node.activeChecks; maxConcurrent is a count (>= 1) or a percentage of the GPU nodes."""
    try:
        limit = parse_max_concurrent(s["maxConcurrent"])
    except ValueError as exc:
        raise ConfigError(f"node.activeChecks.maxConcurrent: {exc}") from exc
    return ActivePolicy(limit, float(s["retrySeconds"]))


LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"


def repair_budget(s: Mapping[str, Any]) -> BudgetPolicy:
    """node.repairBudget; perLabel must be a label key (it names the Nodes' label the budget is
    counted per value of)."""
    per_label = str(s["perLabel"]).strip()
    if per_label and not re.match(LABEL_KEY, per_label):
        raise ConfigError(f"node.repairBudget.perLabel: {per_label!r} is not a label key")
    return BudgetPolicy(
        int(s["maxNodes"]), float(s["maxFraction"]), float(s["windowMinutes"]) * 60, per_label
    )


def condition_type(value: str, where: str = "node.conditionType") -> str:
    """A NodeCondition type we may write: a qualified name (the admission fence lists it as a CEL
    string), never one of the kubelet's."""
    if len(value) > CONDITION_TYPE_MAX or not re.match(CONDITION_TYPE_PATTERN, value):
        raise ConfigError(
            f"{where}: {value!r} is not a condition type (a name such as AcceleratedHardwareReady, "
            "optionally with a DNS prefix: example.com/GPUReady)"
        )
    if value in KUBELET_CONDITION_TYPES:
        raise ConfigError(f"{where}: {value} is the kubelet's condition; the agent never writes it")
    return value


def remediation_conditions(
    value: list[object], own_type: str, taint_min: Severity
) -> tuple[RemediationCondition, ...]:
    """`node.remediationConditions`: each entry {type, unhealthyStatus, minSeverity, reasonStyle}
    (unknown keys are errors). An engine acts only on a node we taint (the brake caps those), so an
    entry's minSeverity may not lie below node.taintMinSeverity: it would promise a remediation that
    never comes."""
    out: list[RemediationCondition] = []
    for i, entry in enumerate(value):
        where = f"node.remediationConditions[{i}]"
        if not isinstance(entry, Mapping):
            keys = "{type, unhealthyStatus, minSeverity, reasonStyle}"
            raise ConfigError(f"{where}: expected a mapping {keys}, got {entry!r}")
        if entry.get("minSeverity") == "monitor":
            raise ConfigError(
                f"{where}.minSeverity: monitor never fails a node; an engine acts only on a node we taint "
                "(reset, reboot or isolate)"
            )
        if isinstance(entry.get("unhealthyStatus"), bool):
            raise ConfigError(
                f'{where}.unhealthyStatus: quote it ("True" or "False"): YAML reads it as a boolean'
            )
        doc = validate(entry, REMEDIATION_ENTRY, f"{where}.")
        if doc["type"] is None:
            raise ConfigError(f"{where}.type: missing (the NodeCondition type an engine watches)")
        kind = condition_type(doc["type"], f"{where}.type")
        if kind == own_type:
            raise ConfigError(f"{where}.type: {kind} is node.conditionType (the agent's own condition)")
        if kind in (c.type for c in out):
            raise ConfigError(f"{where}.type: {kind} is listed twice")
        severity = Severity.parse(doc["minSeverity"])
        if severity < taint_min:
            raise ConfigError(
                f"{where}.minSeverity: {severity.label} is below node.taintMinSeverity "
                f"({taint_min.label}): an engine acts only on a node we taint"
            )
        out.append(RemediationCondition(kind, doc["unhealthyStatus"], severity, doc["reasonStyle"]))
    return tuple(out)


def gpu_node_selectors(value: str | list[object]) -> tuple[str, ...]:
    """`node.gpuNodeSelector`: one label selector or a list of them (any one matches); each is
    parsed as the API server would, so a typo is a rejected config, not a brake that counts nothing."""
    selectors = (value,) if isinstance(value, str) else tuple(value)
    if not selectors:
        raise ConfigError("node.gpuNodeSelector: an empty list selects no GPU node")
    for s in selectors:
        if not isinstance(s, str):
            raise ConfigError(f"node.gpuNodeSelector: {s!r} is not a label selector string")
        try:
            parse_selector(s)
        except ValueError as exc:
            raise ConfigError(f"node.gpuNodeSelector: {exc}") from exc
    return tuple(str(s) for s in selectors)


def dcgm_settings(raw: Mapping[str, Any]) -> DcgmSettings:
    s = raw["dcgm"]
    return DcgmSettings(
        address=str(s["address"]),
        connect_timeout=float(s["connectTimeout"]),
        grace_seconds=float(s["graceSeconds"]),
        diag_level=int(s["diagLevel"]),
        diag_timeout=float(s["diagTimeout"]),
        heartbeat_seconds=float(s["heartbeatSeconds"]),
        call_timeout=float(s["callTimeout"]),
    )


def stall_policy(raw: Mapping[str, Any]) -> StallPolicy:
    """`stall:`; idlePowerWatts maps a GPU model (words of its name) to its idle power in watts."""
    s = raw["stall"]
    table: dict[str, float] = {}
    for model, watts in s["idlePowerWatts"].items():
        if not isinstance(model, str) or not model.strip():
            raise ConfigError(f"stall.idlePowerWatts: {model!r} is not a GPU model name")
        if isinstance(watts, bool) or not isinstance(watts, (int, float)) or not 0 < watts <= 5000:
            raise ConfigError(f"stall.idlePowerWatts.{model}: {watts!r} is not a power in watts (0-5000)")
        table[model.strip()] = float(watts)
    return StallPolicy(
        float(s["utilizationPercent"]), float(s["powerWithinPercent"]), float(s["minutes"]), table
    )


@dataclass(frozen=True)
class SdcSettings:
    """`sdc:` (docs/guides/odd-gpu-out.md): the node's SDC probe server; address "" = not run."""

    address: str
    timeout_s: float


def sdc_settings(raw: Mapping[str, Any]) -> SdcSettings:
    s = raw["sdc"]
    return SdcSettings(str(s["address"]).rstrip("/"), float(s["timeoutSeconds"]))


def peer_policy(raw: Mapping[str, Any]) -> PeerPolicy:
    """`peers:`; raises ConfigError when behindReads exceeds windowReads (it could never warn)."""
    s = raw["peers"]
    out = PeerPolicy(
        float(s["diagMarginPercent"]),
        float(s["busyPercent"]),
        float(s["clockMarginPercent"]),
        float(s["powerMarginPercent"]),
        int(s["behindReads"]),
        int(s["windowReads"]),
    )
    if out.behind_reads > out.window_reads:
        raise ConfigError(
            f"peers.behindReads: {out.behind_reads} reads of a window of peers.windowReads "
            f"{out.window_reads} can never be"
        )
    return out
