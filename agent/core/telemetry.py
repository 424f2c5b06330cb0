"""What the engine and the probes report as they run. The reporters' Prometheus metrics implement it;
the layers below only call it, so they need no metrics library and no reporter import."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

from agent.core.findings import CheckResult
from agent.core.metric_labels import (
    ActiveCheckAbort,
    ActiveCheckState,
    ConfigReloadResult,
    DriverTaintEffect,
    DriverTaintKey,
    GpuSource,
    ToolOutcome,
)
from agent.core.repair_budget import HoldReason
from agent.core.severity import Status


class Telemetry(Protocol):
    def record_verdict(self, status: Status, results: Sequence[CheckResult]) -> None: ...
    def record_probe_error(self, input_name: str, kind: str) -> None: ...
    def record_tier_run(self, tier: str, seconds: float) -> None: ...
    def record_xid(self, code: str) -> None: ...
    def record_taint_wanted(self, wanted: bool) -> None: ...
    def record_config_reload(self, result: ConfigReloadResult) -> None: ...
    def record_config_rejected(self, rejected: bool) -> None: ...
    # The keys of the config in force that a newer release added and this agent left out (0: none).
    def record_config_ignored(self, keys: int) -> None: ...
    def record_brake_open(self, is_open: bool) -> None: ...
    def record_remediation_held(self, why: HoldReason | Literal[""], key: str) -> None: ...
    def record_diag_running(self, running: bool) -> None: ...
    # This node's active-check state, and a diag ended without a result by why.
    def record_active_check(self, state: ActiveCheckState) -> None: ...
    def record_active_check_abort(self, reason: ActiveCheckAbort) -> None: ...
    def record_kernel_log(self, records: int, lost: int, untallied: int) -> None: ...
    # One read of a node tool (tool: "nvml", "nvidia-smi -q -x"; outcome: ok, failed, timeout).
    def record_tool_read(self, tool: str, outcome: ToolOutcome, seconds: float) -> None: ...
    # A DCGM call that did not return within dcgm.callTimeout (op: its C function, dcgmHealthCheck).
    def record_dcgm_call_hang(self, op: str) -> None: ...
    # The validating taint: on the Node since *since* (wall seconds; None: not on it), waiting for *waiting*.
    def record_validating(self, since: float | None, waiting: Sequence[str]) -> None: ...
    # NVIDIA's DRA driver's own device taints on this node's GPUs: (GPU's device, key, effect).
    def record_driver_taints(
        self, taints: Sequence[tuple[str, DriverTaintKey, DriverTaintEffect]]
    ) -> None: ...
    # The GPUs one source counted on this node, as it was just read (None: it says nothing now).
    def record_gpus_seen(self, source: GpuSource, count: int | None) -> None: ...


class NoTelemetry:
    """Records nothing (one-shot commands, tests)."""

    def record_verdict(self, status: Status, results: Sequence[CheckResult]) -> None:
        pass

    def record_probe_error(self, input_name: str, kind: str) -> None:
        pass

    def record_tier_run(self, tier: str, seconds: float) -> None:
        pass

    def record_xid(self, code: str) -> None:
        pass

    def record_taint_wanted(self, wanted: bool) -> None:
        pass

    def record_config_reload(self, result: ConfigReloadResult) -> None:
        pass

    def record_config_rejected(self, rejected: bool) -> None:
        pass

    def record_config_ignored(self, keys: int) -> None:
        pass

    def record_brake_open(self, is_open: bool) -> None:
        pass

    def record_remediation_held(self, why: HoldReason | Literal[""], key: str) -> None:
        pass

    def record_diag_running(self, running: bool) -> None:
        pass

    def record_active_check(self, state: ActiveCheckState) -> None:
        pass

    def record_active_check_abort(self, reason: ActiveCheckAbort) -> None:
        pass

    def record_kernel_log(self, records: int, lost: int, untallied: int) -> None:
        pass

    def record_tool_read(self, tool: str, outcome: ToolOutcome, seconds: float) -> None:
        pass

    def record_dcgm_call_hang(self, op: str) -> None:
        pass

    def record_validating(self, since: float | None, waiting: Sequence[str]) -> None:
        pass

    def record_driver_taints(self, taints: Sequence[tuple[str, DriverTaintKey, DriverTaintEffect]]) -> None:
        pass

    def record_gpus_seen(self, source: GpuSource, count: int | None) -> None:
        pass
