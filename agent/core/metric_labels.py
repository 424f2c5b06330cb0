"""The label values of the agent's metrics where they are a closed set (alerts and dashboards match
them): each its own vocabulary, so that a value of one cannot be recorded under another's label.
The hold's reason is core/repair_budget.py's HoldReason; a probe error's kind is ProbeErrorKind."""

from __future__ import annotations

from enum import unique

from agent.core.vocabulary import Vocabulary


@unique
class ConfigReloadResult(Vocabulary):
    """gpu_healthcheck_config_reloads_total{result}: what became of a changed mounted config."""

    APPLIED = "applied"
    RESTART_REQUIRED = "restart_required"  # a key that is not live changed
    REJECTED = "rejected"  # invalid: the agent runs on its last good or the shipped config


@unique
class ToolOutcome(Vocabulary):
    """gpu_healthcheck_tool_seconds{outcome}: how one read of a node tool ended."""

    READ_OK = "ok"
    READ_FAILED = "failed"  # it answered with an error
    READ_TIMEOUT = "timeout"  # killed or abandoned at its limit


@unique
class DeviceTaintFallback(Vocabulary):
    """gpu_healthcheck_device_taint_fallbacks_total{reason}: why the node taint stood in for a
    per-GPU DeviceTaintRule."""

    API_UNAVAILABLE = "unavailable"  # the API server serves no DeviceTaintRule version
    RULE_REFUSED = "refused"  # the rule's write: a 4xx
    RULE_FAILED = "failed"  # the rule's write: a 5xx
    RULE_UNANSWERED = "unanswered"  # the rule's write: no answer
    RULE_NOT_COUNTED = "not-counted"  # in place, but the brake does not count the rule


@unique
class DriverTaintKey(Vocabulary):
    """gpu_healthcheck_driver_device_taints{key}: the keys NVIDIA's DRA driver's health monitor
    puts on its own devices (cmd/gpu-kubelet-plugin/device_health.go); any other key is `other`."""

    DRIVER_XID = "gpu.nvidia.com/xid"  # value: the Xid NVML reported
    DRIVER_GPU_LOST = "gpu.nvidia.com/gpu-lost"
    DRIVER_UNMONITORED = "gpu.nvidia.com/unmonitored"  # the driver cannot health-check that GPU
    DRIVER_OTHER_KEY = "other"

    @classmethod
    def of(cls, key: str) -> DriverTaintKey:
        return next((k for k in cls if k.value == key), cls.DRIVER_OTHER_KEY)


@unique
class DriverTaintEffect(Vocabulary):
    """gpu_healthcheck_driver_device_taints{effect}: a device taint's effect (the driver writes None
    and NoSchedule; NoExecute is Kubernetes' third); anything else is `other`."""

    EFFECT_NONE = "None"
    EFFECT_NO_SCHEDULE = "NoSchedule"
    EFFECT_NO_EXECUTE = "NoExecute"
    EFFECT_OTHER = "other"

    @classmethod
    def of(cls, effect: str) -> DriverTaintEffect:
        return next((e for e in cls if e.value == effect), cls.EFFECT_OTHER)


@unique
class GpuSource(Vocabulary):
    """gpu_healthcheck_gpus_seen{source}: who counted the GPUs of this node."""

    NVML = "nvml"  # the gpu tier's inventory through NVML: the GPUs listed (answering, lost or hung)
    NVIDIA_SMI = "nvidia-smi"  # the same, read with nvidia-smi (no NVML)
    DCGM = "dcgm"  # the GPUs the DCGM engine's health watches cover
    DRA = "dra"  # the GPUs NVIDIA's DRA driver publishes for this node (its ResourceSlices)
    ALLOCATABLE = "allocatable"  # the device plugin's allocatable nvidia.com/gpu on the Node


@unique
class ActiveCheckState(Vocabulary):
    """gpu_healthcheck_active_check_state{state}: this node's active-check (DCGM diag) state
    (core/active_checks.py, probes/dcgm/window.py)."""

    IDLE = "idle"  # no diag due
    # due, waiting for an idle window: GPUs held, the testing taint not on in time, or an aborted
    # diag's retry not due yet
    WAITING = "waiting"
    NO_SLOT = "no-slot"  # due, waiting for a fleet slot: the bound reached, or the slots not counted
    HOLDING = "holding"  # a slot taken, the testing taint going on
    RUNNING = "running"  # the diag running


@unique
class ActiveCheckAbort(Vocabulary):
    """gpu_healthcheck_active_check_aborts_total{reason}: why a diag ended without a result."""

    POD_ARRIVED = "pod-arrived"  # the API server shows a pod arriving for the GPUs
    GPU_HELD = "gpu-held"  # the kubelet shows a pod holding an NVIDIA device
    KUBELET_UNREADABLE = "kubelet-unreadable"  # the kubelet could not say
    UNFINISHED = "unfinished"  # the diag itself ended without one (past its timeout, the engine lost)


__all__ = [
    "ActiveCheckAbort",
    "ActiveCheckState",
    "ConfigReloadResult",
    "DeviceTaintFallback",
    "DriverTaintEffect",
    "DriverTaintKey",
    "GpuSource",
    "ToolOutcome",
]
