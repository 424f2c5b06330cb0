"""The schema of config.yaml: every key with its type, default and range, and the strict validation
that turns a parsed document into a complete one (unknown keys, wrong types and out-of-range values
are errors that name the key), and the schema version that lets an agent take a newer release's
config: its unknown keys are that release's, not typos (schema_version below)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.core.device_scope import DEFAULT_ISOLATION, ISOLATIONS
from agent.core.gpu_nodes import DEFAULT_GPU_NODE_SELECTORS
from agent.core.gpu_stall import IDLE_POWER_W
from agent.core.node_keys import (
    DEFAULT_CONDITION_TYPE,
    DEFAULT_MODE,
    DEFAULT_PREFIX,
    DEFAULT_TAINT_EFFECT,
    DEVICE_EFFECT_DEFAULTS,
    DEVICE_TAINT_EFFECTS,
    MODES,
    TAINT_EFFECTS,
    TAINT_SEVERITIES,
)
from agent.core.remediation_reasons import REASON_STYLES, STYLE_OURS
from agent.core.severity import Severity


class ConfigError(ValueError):
    """An invalid config file; the message names the file and the key."""


@dataclass(frozen=True)
class Spec:
    """A leaf of the schema: type, default and range."""

    typ: type | tuple[type, ...]
    default: Any
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None


def _num(default: float, lo: float | None = None, hi: float | None = None) -> Spec:
    return Spec((int, float), default, lo, hi)


# The schema of config.yaml. Nested dicts are sections; Spec is a leaf; "*" maps free-form keys.
SCHEMA: dict[str, Any] = {
    "prefix": Spec(str, DEFAULT_PREFIX),
    "instanceType": Spec(str, ""),
    "intervals": {
        "gpu": _num(60, 1, 86400),
        "efa": _num(300, 1, 86400),
        "topology": _num(300, 1, 86400),
        "dcgmHealth": _num(60, 1, 86400),
        "dcgmDiag": _num(21600, 60, 7 * 86400),
        "sdcProbe": _num(604800, 3600, 30 * 86400),  # the SDC probe (docs/guides/odd-gpu-out.md)
    },
    "jitterFraction": _num(0.1, 0, 0.5),
    "timeouts": {
        "nvidiaSmi": _num(30, 1, 600),
        "nvml": _num(30, 1, 600),
        "check": _num(60, 1, 3600),
    },
    "checks": {"*": Spec(bool, True)},  # check name → on/off; every check is on unless switched off
    "severities": {"*": Spec(str, None, choices=tuple(s.label for s in Severity))},
    "thresholds": {
        "retiredPagesSingleBitMax": _num(60, 0, 10**6),
        # while the DCGM engine does not answer: a GPU's correctable ECC rate (NVML) naming it the suspect
        "dcgmWedgeEccPerSec": _num(10, 0, 10**9),
        "efaCounterRatePerSec": {
            "rx_drops": _num(10, 0),
            "retrans_timeout_events": _num(1, 0),
            "unresponsive_remote_events": _num(1, 0),
            "impaired_remote_conn_events": _num(1, 0),
        },
    },
    # Warnings before a fault (checks/trends.py): how reads are kept, and each rule's threshold.
    "trends": {
        "readSpacingSeconds": _num(900, 60, 86400),
        "keepReads": Spec(int, 12, 2, 24),
        "remapBanksLow": Spec(int, 1, 1, 10**6),
        "remapRowsGrowth": Spec(int, 1, 1, 10**6),
        "eccCorrectablePerHour": _num(100, 0, 10**9),
        "retiredPagesWarnAt": Spec(int, 48, 1, 10**6),
        "nvlinkGrowingReads": Spec(int, 8, 1, 23),
        "pcieGrowingReads": Spec(int, 8, 1, 23),
        "thermalMarginC": _num(5, 0, 100),
        "thermalReads": Spec(int, 3, 1, 24),
        "clockShortfallPercent": _num(10, 1, 100),
        "clockBusyPercent": _num(80, 1, 100),
        "clockReads": Spec(int, 3, 1, 24),
    },
    # A stalled GPU (core/gpu_stall.py): held by a pod, busy, at its idle power, for minutes.
    "stall": {
        "utilizationPercent": _num(95, 1, 100),
        "powerWithinPercent": _num(15, 0, 100),
        "minutes": _num(10, 1, 120),
        "idlePowerWatts": Spec(dict, dict(IDLE_POWER_W)),  # GPU model → W (settings.py checks it)
    },
    # The odd GPU out (core/peers.py): a GPU well below its siblings' median (docs/guides/odd-gpu-out.md)
    "peers": {
        "diagMarginPercent": _num(10, 1, 90),  # a DCGM diag figure below the median by more: warn
        "busyPercent": _num(80, 1, 100),  # under work: a GPU at least this busy
        "clockMarginPercent": _num(10, 1, 90),  # SM clock below its pod's GPUs' median by more ...
        "powerMarginPercent": _num(20, 1, 90),  # ... or the draw below it by more ...
        "behindReads": Spec(int, 3, 1, 60),  # ... in at least this many ...
        "windowReads": Spec(int, 5, 1, 60),  # ... of the last this many gpu-tier reads: warn
    },
    # The SDC probe (sdcprobe/, an optional DaemonSet): its node-local server; "" = not run
    "sdc": {
        "address": Spec(str, ""),  # e.g. http://127.0.0.1:7436
        "timeoutSeconds": _num(600, 30, 3600),  # a run past this is stopped: `unknown`
    },
    "node": {
        "mode": Spec(str, DEFAULT_MODE, choices=MODES),
        # node | gpu | auto: a fault confined to one GPU taints that DRA device, not the node
        "isolation": Spec(str, DEFAULT_ISOLATION, choices=ISOLATIONS),
        # With isolation gpu|auto: this many GPUs failing at once make it a node fault (the node
        # taint, the remediation conditions); fewer are isolated and the node reads degraded. 0: off
        "isolationNodeAtGpus": Spec(int, 2, 0, 64),
        # A DeviceTaintRule's effect per severity (a GPU that cannot serve: evict only its pods);
        # a severity not named here takes the node's (taintEffectBySeverity, then taintEffect)
        "deviceTaintEffectBySeverity": {
            s: Spec(str, DEVICE_EFFECT_DEFAULTS.get(s), choices=DEVICE_TAINT_EFFECTS)
            for s in TAINT_SEVERITIES
        },
        "recoverAfter": _num(3, 1, 1000),
        "confirmAfter": Spec(int, 2, 1, 100),  # consecutive failing runs before a confirm rule fails
        "escalateAfterReboots": Spec(int, 2, 0, 10),
        "taintMinSeverity": Spec(str, TAINT_SEVERITIES[0], choices=TAINT_SEVERITIES),
        "taintEffect": Spec(str, DEFAULT_TAINT_EFFECT, choices=TAINT_EFFECTS),
        # severity → effect over taintEffect; only severities that taint may be named
        "taintEffectBySeverity": {s: Spec(str, None, choices=TAINT_EFFECTS) for s in TAINT_SEVERITIES},
        "conditionType": Spec(str, DEFAULT_CONDITION_TYPE),
        # [{type, unhealthyStatus, minSeverity, reasonStyle}]: conditions remediation engines watch
        # (settings.py validates the entries: REMEDIATION_ENTRY)
        "remediationConditions": Spec(list, []),
        "maxTaintedFraction": _num(0.2, 0, 1),
        "maxTaintedNodes": _num(0, 0, 10**6),
        # New remediation marks per window (agent/core/repair_budget.py): apart from the brake.
        "repairBudget": {
            "maxNodes": Spec(int, 10, 0, 10**6),
            "maxFraction": _num(0.05, 0, 1),
            "windowMinutes": _num(60, 0.01, 7 * 1440),
            "perLabel": Spec(str, ""),
        },
        # A node failing again on the same key after `count` repairs within `windowDays`: replace
        # (agent/core/repair_escalation.py).
        "repairHistory": {"count": Spec(int, 2, 0, 5), "windowDays": _num(7, 0.01, 90)},
        # The risk label (agent/core/node_risk.py): episodes or repairs within windowDays; 0 = off.
        "risk": {
            "failures": Spec(int, 3, 0, 1000),
            "repairs": Spec(int, 2, 0, 1000),
            "windowDays": Spec(int, 30, 1, 90),
            "gpus": Spec(int, 2, 0, 1000),  # high-risk GPUs (per-GPU isolation) that make the node high
        },
        "waveHold": {
            "minNodes": Spec(int, 5, 0, 10**6),
            "minFraction": _num(0.02, 0, 1),
            "windowMinutes": _num(15, 0.01, 1440),
        },
        "gpuNodeSelector": Spec((str, list), list(DEFAULT_GPU_NODE_SELECTORS)),  # any one matches
        # Active checks (agent/core/active_checks.py): the fleet-wide bound on DCGM diags at once (a
        # count, or "N%" of the GPU nodes, at least 1), and how often a postponed diag asks again.
        "activeChecks": {
            "maxConcurrent": Spec((int, str), "5%"),  # settings.py checks it
            "retrySeconds": _num(300, 1, 86400),
        },
        # Validate before service (engine/validation.py): the agent adds the validating taint itself,
        # and the DCGM diag level the complete pass that lifts it needs. On a DRA-only node the pass
        # waits for NVIDIA's DRA driver to publish the GPUs (engine/driver_wait.py): where (auto:
        # no nvidia.com/gpu and the DeviceClass gpu.nvidia.com exists), for how long before the
        # reason is said (the taint stays), and whether every GPU must be published. Live.
        "validate": {
            "addTaint": Spec(bool, False),
            "diagLevel": Spec(int, 2, 1, 4),
            "waitForDriver": Spec(str, "auto", choices=("auto", "always", "never")),
            "driverTimeoutSeconds": _num(600, 1, 86400),
            "requireAllPublished": Spec(bool, True),
        },
    },
    "metrics": {"port": _num(9402, 0, 65535)},
    "configPollSeconds": _num(2, 0.1, 300),
    "dcgm": {
        "address": Spec(str, "nvidia-dcgm.gpu-healthcheck.svc:5555"),
        "connectTimeout": _num(5, 0.1, 300),
        "graceSeconds": _num(120, 0, 86400),
        "diagLevel": Spec(int, 2, 1, 4),
        "diagTimeout": _num(900, 30, 86400),
        "heartbeatSeconds": _num(60, 1, 600),
        "callTimeout": _num(10, 0.1, 300),  # a DCGM call past it: "engine not answering" (unknown)
        "incidentOverrides": {"*": Spec(str, None, choices=tuple(s.label for s in Severity))},
    },
    "xid": {
        "overrides": {"*": Spec(str, None, choices=tuple(s.label for s in Severity))},
        "nvlinkSeverity": Spec(str, "reset", choices=("monitor", "reset", "reboot", "isolate")),
    },
}


# One entry of node.remediationConditions. `type` has no default: an entry must name its condition.
REMEDIATION_ENTRY: dict[str, Any] = {
    "type": Spec(str, None),
    "unhealthyStatus": Spec(str, "False", choices=("True", "False")),
    "minSeverity": Spec(str, TAINT_SEVERITIES[0], choices=TAINT_SEVERITIES),
    # The unhealthy reason's names (core/remediation_reasons.py): ours, or the EKS agent's
    "reasonStyle": Spec(str, STYLE_OURS, choices=REASON_STYLES),
}


# Keys a running agent cannot take on: a new prefix would orphan every key written under the old one
# (and needs the admission policy changed with it); the metrics port is bound once. A reload that
# changes one keeps the old value, says so (Event ConfigRestartRequired) and applies the rest.
RESTART_ONLY = ("prefix", "metrics.port")


# config.yaml's top-level `schemaVersion`: the version of this schema the file was written for. Bump
# SCHEMA_VERSION in a release that adds a key (and write it into config/config.yaml). Not in SCHEMA:
# it is about the file, not a setting (nothing reloads it). Version 1 is 0.1.0's schema, which had no
# such key; 2 is the first that writes it.
SCHEMA_VERSION_KEY = "schemaVersion"
SCHEMA_VERSION = 3


def schema_version(doc: Any) -> int | None:
    """The schemaVersion a config.yaml document names (None: it names none, so it is read as written
    for this agent's own schema: strict). Raises ConfigError for anything but a positive integer."""
    if not isinstance(doc, Mapping) or doc.get(SCHEMA_VERSION_KEY) is None:
        return None
    value = doc[SCHEMA_VERSION_KEY]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{SCHEMA_VERSION_KEY}: {value!r} is not a schema version (an integer, 1 or more)")
    return value


def validate(
    doc: Any, schema: Mapping[str, Any], where: str, *, ignored: list[str] | None = None
) -> dict[str, Any]:
    """*doc* complete and checked against *schema* (raises ConfigError). With *ignored* (a config
    written for a newer schema) an unknown key is appended there, dotted, and left out instead of
    refused: a key that release added, which this agent cannot act on."""
    if doc is None:
        doc = {}
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(doc).__name__}")
    out: dict[str, Any] = {}
    free = schema.get("*")
    for key in doc:
        if key not in schema and free is None:
            if ignored is not None:
                ignored.append(f"{where}{key}")
                continue
            raise ConfigError(
                f"{where}{key}: unknown key (allowed: {', '.join(k for k in schema if k != '*')})"
            )
    for key, spec in schema.items():
        if key == "*":
            continue
        value = doc.get(key)
        out[key] = _leaf_or_section(value, spec, f"{where}{key}", ignored)
    if free is not None:
        for key in doc:
            if key not in schema:
                out[str(key)] = _leaf_or_section(doc[key], free, f"{where}{key}", ignored)
    return out


def _leaf_or_section(value: Any, spec: Any, path: str, ignored: list[str] | None = None) -> Any:
    if isinstance(spec, Mapping):
        return validate(value, spec, path + ".", ignored=ignored)
    assert isinstance(spec, Spec)
    if value is None:
        return spec.default
    typ = spec.typ
    if (
        isinstance(value, bool)
        and typ is not bool
        and bool not in (typ if isinstance(typ, tuple) else (typ,))
    ):
        raise ConfigError(f"{path}: expected a number, got {value!r}")
    if not isinstance(value, typ):
        name = "number" if typ == (int, float) else getattr(typ, "__name__", str(typ))
        raise ConfigError(f"{path}: expected {name}, got {value!r}")
    number = value if isinstance(value, (int, float)) else None
    if spec.minimum is not None and number is not None and number < spec.minimum:
        raise ConfigError(f"{path}: {value} is below the minimum {spec.minimum}")
    if spec.maximum is not None and number is not None and number > spec.maximum:
        raise ConfigError(f"{path}: {value} is above the maximum {spec.maximum}")
    if spec.choices is not None and value not in spec.choices:
        raise ConfigError(f"{path}: {value!r} is not one of {', '.join(spec.choices)}")
    return value
