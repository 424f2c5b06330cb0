"""Prometheus metrics of the agent, on their own registry (tests create many agents in one process).

Sized for 2,000 nodes: a healthy agent exports about 50 series (bench/metrics_size.py), not one per
check and status. Per-check series exist only for checks that fail, warn or could not look; tier
durations are histograms per tier (their _count is the tier's runs); warnings before a fault are
counted in GPUs per trend rule, never a series per GPU (the DRA driver's device taints are, only
while it taints one); no `_created` series.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from agent.core.findings import CheckResult
from agent.core.metric_labels import (
    ActiveCheckAbort,
    ActiveCheckState,
    ConfigReloadResult,
    ToolOutcome,
)
from agent.core.repair_budget import HoldReason
from agent.core.severity import Severity, Status
from agent.core.trend_history import CHECK_PREFIX
from agent.reporters.metrics_devices import NS, DeviceMetrics
from agent.reporters.metrics_devices import only as _only
from agent.reporters.node_story import NodeState

# Tool reads: a healthy GPU inventory read (NVML about 0.1 s, nvidia-smi about 1 s) up to the 30 s
# default timeout, so that a read slowing from 5 to 25 s shows before it fails a node; six buckets
# (9 series a tool) to keep an agent within its 60 series (bench/metrics_size.py).
TOOL_BUCKETS = (0.1, 1, 5, 10, 20, 30)
# A tier (its reads and checks, bounded by timeouts.check): fast; slow; past 30 s, at a tool's
# timeout (the default). Two buckets, as before; the tool histogram shows where the time went.
TIER_BUCKETS = (1, 30)


class Metrics(DeviceMetrics):
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._shown: dict[int, set[tuple[str, ...]]] = {}  # per gauge: the label sets it exports
        self.checks = Gauge(f"{NS}_checks", "checks by their current status", ["status"], registry=r)
        self.check_status = Gauge(
            f"{NS}_check_status",
            "1 for each check that fails, warns or could not look, with that status (no series otherwise)",
            ["check", "status"],
            registry=r,
        )
        self.tier_duration = Histogram(
            f"{NS}_tier_duration_seconds",
            "one run of a tier (its probes and checks); _count is the tier's runs",
            ["tier"],
            registry=r,
            buckets=TIER_BUCKETS,
        )
        self.findings = Gauge(
            f"{NS}_findings", "active findings by severity (no series at zero)", ["severity"], registry=r
        )
        self.gpu_warnings = Gauge(
            f"{NS}_gpu_warnings",
            "GPUs with a warning before a fault, by trend rule (one series per rule, none at zero; "
            "never one per GPU)",
            ["rule"],
            registry=r,
        )
        self.node_status = Gauge(
            f"{NS}_node_status", "1, labelled with the node's current status", ["status"], registry=r
        )
        self.xid_total = Counter(f"{NS}_xid_total", "Xid events first seen, by code", ["code"], registry=r)
        self.node_writes = Counter(
            f"{NS}_node_writes_total", "API writes by kind and outcome", ["kind", "outcome"], registry=r
        )
        self.config_reloads = Counter(
            f"{NS}_config_reloads_total", "config reloads by result", ["result"], registry=r
        )
        self.config_rejected = Gauge(
            f"{NS}_config_rejected",
            "1 while the mounted config is invalid and the agent runs on its last good or the shipped one",
            registry=r,
        )
        self.config_ignored_keys = Gauge(
            f"{NS}_config_ignored_keys",
            "keys of the config in force that a newer release added (its schemaVersion is above this "
            "agent's): left out, with a warning, instead of rejecting the config",
            registry=r,
        )
        self.brake_open = Gauge(
            f"{NS}_brake_open", "1 while the cluster-wide taint brake holds a taint back", registry=r
        )
        self.brake_counted = Gauge(
            f"{NS}_brake_counted_nodes",
            "GPU nodes counted against the brake's cap (tainted, or holding a slot they claim) at this "
            "agent's last count of nodes (only asked when slot numbers alone cannot settle a taint)",
            registry=r,
        )
        self.brake_cap = Gauge(
            f"{NS}_brake_cap", "the brake's cap at this agent's last count of nodes", registry=r
        )
        self.brake_over_cap = Gauge(
            f"{NS}_brake_over_cap",
            "1 when this agent's last count of nodes found more nodes counted than the cap allows "
            "(nodes tainted without a slot: an older version's, or by hand)",
            registry=r,
        )
        self.probe_errors = Counter(
            f"{NS}_probe_errors_total", "inputs that could not be read", ["input", "kind"], registry=r
        )
        self.dcgm_diag_running = Gauge(
            f"{NS}_dcgm_diag_running", "1 while a DCGM diagnostic runs", registry=r
        )
        # Active checks (core/active_checks.py): no series on a node that runs none (no live DCGM
        # with an API server); the counter has no series before the first.
        self.active_check_state = Gauge(
            f"{NS}_active_check_state",
            "1 for this node's active-check (DCGM diag) state: idle, waiting (due, no idle window), "
            "no-slot (due, no fleet slot free), holding (a slot taken, the testing taint going on), "
            "running",
            ["state"],
            registry=r,
        )
        self.active_check_aborts = Counter(
            f"{NS}_active_check_aborts_total",
            "DCGM diags that ended without a result, by reason (pod-arrived, gpu-held, "
            "kubelet-unreadable: aborted for work; unfinished: past its timeout or the engine lost)",
            ["reason"],
            registry=r,
        )
        self.tainted = Gauge(
            f"{NS}_node_tainted",
            "1 while this agent's taint is on its Node (the Node as last read or written)",
            registry=r,
        )
        self.taint_wanted = Gauge(
            f"{NS}_taint_wanted", "1 while the verdict wants this agent's taint (mode taint)", registry=r
        )
        self.taint_held = Gauge(
            f"{NS}_taint_held",
            "1 while the taint is wanted but the cluster-wide brake holds it back (no taint on the Node)",
            registry=r,
        )
        self.remediation_marked = Gauge(
            f"{NS}_remediation_marked",
            "1 while the Node's node.remediationConditions condition of this type is at its unhealthy "
            "status (marked for a remediation engine), 0 otherwise; a series per configured type",
            ["type"],
            registry=r,
        )
        self.write_refusals = Counter(
            f"{NS}_node_write_refusals_total",
            "Node writes the API server refused (admission fence, RBAC, validation), by kind and HTTP code",
            ["kind", "code"],
            registry=r,
        )
        self.kernel_records = Gauge(
            f"{NS}_kernel_log_records", "kernel log records read this boot (each once)", registry=r
        )
        self.kernel_lost = Gauge(
            f"{NS}_kernel_log_lost_records",
            "kernel log records the ring overwrote before the agent read them (EPIPE on /dev/kmsg)",
            registry=r,
        )
        self.kernel_untallied = Gauge(
            f"{NS}_kernel_log_untallied_lines",
            "Xid lines of distinct (kind, code, device) keys past the ledger's bound: counted, not kept",
            registry=r,
        )
        self.gpu_nodes = Gauge(
            f"{NS}_gpu_nodes", "GPU nodes the brake counts (node.gpuNodeSelector)", registry=r
        )
        self.gpu_node_selected = Gauge(
            f"{NS}_gpu_node_selected",
            "1 while node.gpuNodeSelector matches this agent's Node (0: the brake's total is wrong)",
            registry=r,
        )
        self.fence = Gauge(
            f"{NS}_fence",
            "1 for the result of the start-up proof that the admission fence refuses the agent's "
            "writes outside its own Node and keys (fenced, unfenced, unknown)",
            ["result"],
            registry=r,
        )
        self.remediation_held = Gauge(
            f"{NS}_remediation_held",
            "1 while a new remediation mark of this node is held (reason: budget or wave; key: finding)",
            ["reason", "key"],
            registry=r,
        )

        # ---- node tool latency (one slow read is not a broken GPU: a slowing tool shows first)
        self.tool_seconds = Histogram(
            f"{NS}_tool_seconds",
            "one read of a node tool (nvml, nvml nvlink, nvidia-smi -q -x, nvidia-smi topo -m, ...) by "
            "outcome (ok, failed: it answered with an error, timeout: killed or abandoned at its limit)",
            ["tool", "outcome"],
            registry=r,
            buckets=TOOL_BUCKETS,
        )
        # ---- end node tool latency
        self.dcgm_call_hangs = Counter(
            f"{NS}_dcgm_call_hangs_total",
            "DCGM calls that did not return within dcgm.callTimeout, by operation (its C function); "
            "no series before the first",
            ["op"],
            registry=r,
        )
        # The validating taint (engine/validation.py): how long this Node has carried it without a
        # pass, and what the pass waits for (alert GPUHealthcheckValidationStuck). Computed at each
        # scrape from the time it went on, so it grows between the agent's checks.
        self._validating_since: float | None = None
        self.validating_seconds = Gauge(
            f"{NS}_validating_seconds",
            "seconds this Node has carried the validating taint without passing (0: not validating)",
            registry=r,
        )
        self.validating_seconds.set_function(self._validating_for)
        self.validating_waiting = Gauge(
            f"{NS}_validating_waiting_for",
            "1 for each thing the validating taint's pass waits for (a tier, dcgm-diag, or pass: a "
            "passing verdict); no series once validated",
            ["what"],
            registry=r,
        )
        self.device_metrics(r)

    def record_verdict(self, status: Status, results: Sequence[CheckResult]) -> None:
        """The node's status, its checks by status, and the checks and findings that are not fine."""
        _only(self.node_status, {(status.value,): 1}, self._shown)
        for st in (s for s in Status if s is not Status.DEGRADED):  # a node's only, never a check's
            self.checks.labels(st.value).set(sum(1 for r in results if r.status is st))
        bad: dict[tuple[str, ...], int] = {
            (r.name, r.status.value): 1
            for r in results
            if r.status in (Status.FAIL, Status.WARN, Status.UNKNOWN)
        }
        _only(self.check_status, bad, self._shown)
        sevs = (Severity.MONITOR, Severity.RESET, Severity.REBOOT, Severity.ISOLATE)
        found: dict[tuple[str, ...], int] = {
            (sev.label,): sum(1 for r in results for f in r.findings if f.severity is sev) for sev in sevs
        }
        _only(self.findings, {k: v for k, v in found.items() if v}, self._shown)
        warned: dict[str, set[str]] = {}
        for r in results:
            if r.name.startswith(CHECK_PREFIX):
                for f in r.findings:
                    if f.severity > Severity.NONE:
                        warned.setdefault(f.rule, set()).update(f.entities or (f.key,))
        _only(self.gpu_warnings, {(rule,): len(gpus) for rule, gpus in warned.items()}, self._shown)

    def record_probe_error(self, input_name: str, kind: str) -> None:
        self.probe_errors.labels(input_name, kind).inc()

    def record_tier_run(self, tier: str, seconds: float) -> None:
        self.tier_duration.labels(tier).observe(seconds)

    def record_xid(self, code: str) -> None:
        self.xid_total.labels(code).inc()

    def record_taint_wanted(self, wanted: bool) -> None:
        self.taint_wanted.set(1 if wanted else 0)

    def record_node_state(self, state: NodeState) -> None:
        """What the Node shows (the writer's on_state): the taint on it, held, the remediation marks."""
        self.tainted.set(1 if state.tainted else 0)
        self.taint_held.set(1 if state.taint_held else 0)
        _only(self.remediation_marked, {(t,): int(on) for t, on in state.marked.items()}, self._shown)

    def record_write_refused(self, kind: str, code: int) -> None:
        self.write_refusals.labels(kind, str(code)).inc()

    def record_config_reload(self, result: ConfigReloadResult) -> None:
        self.config_reloads.labels(result).inc()

    def record_config_rejected(self, rejected: bool) -> None:
        self.config_rejected.set(1 if rejected else 0)

    def record_config_ignored(self, keys: int) -> None:
        self.config_ignored_keys.set(keys)

    def record_brake_open(self, is_open: bool) -> None:
        self.brake_open.set(1 if is_open else 0)

    def record_brake_count(self, counted: int, cap: int) -> None:
        self.brake_counted.set(counted)
        self.brake_cap.set(cap)
        self.brake_over_cap.set(1 if counted > cap else 0)

    def record_gpu_nodes(self, total: int, this_node_selected: bool) -> None:
        self.gpu_nodes.set(total)
        self.gpu_node_selected.set(1 if this_node_selected else 0)

    def record_fence(self, result: str) -> None:
        _only(self.fence, {(result,): 1}, self._shown)

    def record_kernel_log(self, records: int, lost: int, untallied: int) -> None:
        self.kernel_records.set(records)
        self.kernel_lost.set(lost)
        self.kernel_untallied.set(untallied)

    def record_diag_running(self, running: bool) -> None:
        self.dcgm_diag_running.set(1 if running else 0)

    def record_active_check(self, state: ActiveCheckState) -> None:
        _only(self.active_check_state, {(state,): 1}, self._shown)

    def record_active_check_abort(self, reason: ActiveCheckAbort) -> None:
        self.active_check_aborts.labels(reason).inc()

    def record_tool_read(self, tool: str, outcome: ToolOutcome, seconds: float) -> None:
        """A read of nvidia-smi or NVML, so that one slowing down shows before it times out."""
        self.tool_seconds.labels(tool, outcome).observe(seconds)

    def record_dcgm_call_hang(self, op: str) -> None:
        """A DCGM call past its deadline: the engine did not answer (dcgm-health is unknown)."""
        self.dcgm_call_hangs.labels(op).inc()

    def _validating_for(self) -> float:
        since = self._validating_since
        return 0.0 if since is None else max(0.0, time.time() - since)

    def record_validating(self, since: float | None, waiting: Sequence[str]) -> None:
        """The validating taint on the Node since *since* (wall seconds; None: not on it), waiting
        for *waiting*."""
        self._validating_since = since
        _only(self.validating_waiting, {(w,): 1 for w in waiting} if since is not None else {}, self._shown)

    def record_remediation_held(self, why: HoldReason | Literal[""], key: str) -> None:
        """1 while the repair budget ("budget") or a wave hold ("wave") keeps this node's new
        remediation mark back, labelled with the finding key; no series otherwise."""
        _only(self.remediation_held, {(why, key): 1} if why else {}, self._shown)


disable_created_metrics()  # type: ignore[no-untyped-call]  # `_created` doubles every counter and histogram for nothing we use
