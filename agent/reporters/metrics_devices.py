"""The agent's metrics of its GPUs as other sources see them and of per-GPU isolation: the GPUs each
source counts, the DRA driver's own device taints, the DeviceTaintRule API, the GPUs our rules
isolate and the node taint standing in for a rule. A part of reporters/metrics.Metrics, kept apart
so that each module stays small; `only` is the one way a labelled gauge is set there."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge

from agent.core.metric_labels import DeviceTaintFallback, DriverTaintEffect, DriverTaintKey, GpuSource
from agent.core.severity import Status

NS = "gpu_healthcheck"


def only(gauge: Gauge, values: dict[tuple[str, ...], int], shown: dict[int, set[tuple[str, ...]]]) -> None:
    """Set *values* on a labelled gauge and remove every other label set it exported before, so that
    a series exists only while it says something."""
    before = shown.setdefault(id(gauge), set())
    for labels in before - set(values):
        gauge.remove(*labels)
    for labels, value in values.items():
        gauge.labels(*labels).set(value)
    shown[id(gauge)] = set(values)


class DeviceMetrics:
    """Mixed into Metrics: its registry, its `_shown` and its node_status gauge are Metrics'."""

    _shown: dict[int, set[tuple[str, ...]]]
    node_status: Gauge

    def device_metrics(self, r: CollectorRegistry) -> None:
        self._gpus_seen: dict[GpuSource, int] = {}
        self.driver_taints = Gauge(
            f"{NS}_driver_device_taints",
            "1 for each taint NVIDIA's DRA driver put on a GPU's device in its ResourceSlice, by the GPU's "
            "device (gpu-2), key (gpu.nvidia.com/xid, gpu-lost, unmonitored; other) and effect (None, "
            "NoSchedule, NoExecute; other); no series without one",
            ["gpu", "key", "effect"],
            registry=r,
        )
        self.gpus_seen = Gauge(
            f"{NS}_gpus_seen",
            "the GPUs each source counts on this node as last read: nvml or nvidia-smi (listed), dcgm "
            "(the engine's health watches), dra (NVIDIA's DRA driver publishes), allocatable (the "
            "device plugin's nvidia.com/gpu)",
            ["source"],
            registry=r,
        )
        # ---- per-GPU isolation: the DeviceTaintRule API, and the node taint standing in for a rule
        self.device_taint_api = Gauge(
            f"{NS}_device_taint_api",
            "1, labelled with the DeviceTaintRule version the API server serves (v1, v1beta2, v1alpha3; "
            "none: per-GPU isolation falls back to the node taint), as last discovered",
            ["version"],
            registry=r,
        )
        self.isolated_gpus = Gauge(
            f"{NS}_isolated_gpus",
            "GPUs of this node that our DeviceTaintRules take out of service while the node serves the "
            "others (status degraded); 0 otherwise",
            registry=r,
        )
        self.device_taint_fallbacks = Counter(
            f"{NS}_device_taint_fallbacks_total",
            "times the node taint stood in for a per-GPU DeviceTaintRule, by reason (unavailable: no "
            "version served; refused, failed, unanswered: the rule's write; not-counted: the brake "
            "does not count the rule)",
            ["reason"],
            registry=r,
        )

    def record_driver_taints(self, taints: Sequence[tuple[str, DriverTaintKey, DriverTaintEffect]]) -> None:
        """The driver's own device taints (checks/dra_taints.taint_series): a series per GPU only
        while the driver taints it, at most its GPUs × 3 keys."""
        only(self.driver_taints, {(gpu, key, effect): 1 for gpu, key, effect in taints}, self._shown)

    def record_gpus_seen(self, source: GpuSource, count: int | None) -> None:
        """One source's count; NVML and nvidia-smi are one inventory read two ways: one series."""
        shown = {k: v for k, v in self._gpus_seen.items() if k != source}
        if source in (GpuSource.NVML, GpuSource.NVIDIA_SMI):
            shown = {k: v for k, v in shown.items() if k not in (GpuSource.NVML, GpuSource.NVIDIA_SMI)}
        if count is not None:
            shown[source] = count
        self._gpus_seen = shown
        only(self.gpus_seen, {(k.value,): v for k, v in shown.items()}, self._shown)

    def record_device_taint_api(self, version: str) -> None:
        only(self.device_taint_api, {(version,): 1}, self._shown)

    def record_isolated_gpus(self, count: int, shown: Status) -> None:
        """The GPUs our DeviceTaintRules take out of service now, and the status the Node was written
        with where it is `degraded` (a recovering node keeps its rules for recoverAfter cycles while
        it reads `pass`: the engine's record_verdict says so, this must not say otherwise)."""
        self.isolated_gpus.set(count)
        if shown is Status.DEGRADED:
            only(self.node_status, {(Status.DEGRADED.value,): 1}, self._shown)

    def record_device_taint_fallback(self, reason: DeviceTaintFallback) -> None:
        self.device_taint_fallbacks.labels(reason).inc()


__all__ = ["NS", "DeviceMetrics", "only"]
