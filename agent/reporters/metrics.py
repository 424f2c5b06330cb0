"""Prometheus metrics of the agent, on their own registry (tests create many agents in one process)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from agent.core.findings import CheckResult
from agent.core.severity import Severity, Status

NS = "gpu_healthcheck"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.check_status = Gauge(
            f"{NS}_check_status", "1 for the current status of each check", ["check", "status"], registry=r
        )
        self.check_duration = Histogram(
            f"{NS}_check_duration_seconds",
            "time spent in one check",
            ["check"],
            registry=r,
            buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
        )
        self.findings = Gauge(f"{NS}_findings", "active findings by severity", ["severity"], registry=r)
        self.node_status = Gauge(
            f"{NS}_node_status", "1 for the node's current status", ["status"], registry=r
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
        self.brake_open = Gauge(
            f"{NS}_brake_open", "1 while the cluster-wide taint brake holds a taint back", registry=r
        )
        self.tier_last_run = Gauge(
            f"{NS}_tier_last_run_timestamp_seconds", "when each tier last ran", ["tier"], registry=r
        )
        self.tier_runs = Counter(f"{NS}_tier_runs_total", "tier runs", ["tier"], registry=r)
        self.probe_errors = Counter(
            f"{NS}_probe_errors_total", "inputs that could not be read", ["input", "kind"], registry=r
        )
        self.dcgm_diag_running = Gauge(
            f"{NS}_dcgm_diag_running", "1 while a DCGM diagnostic runs", registry=r
        )
        self.tainted = Gauge(
            f"{NS}_node_tainted", "1 while this agent's taint is wanted on its Node", registry=r
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

    def record_results(self, results: Sequence[CheckResult]) -> None:
        for res in results:
            for st in (Status.PASS, Status.WARN, Status.FAIL, Status.UNKNOWN, Status.SKIPPED):
                self.check_status.labels(res.name, st.value).set(1 if res.status is st else 0)
            self.check_duration.labels(res.name).observe(res.duration_ms / 1000.0)

    def record_verdict(self, status: Status, results: Sequence[CheckResult]) -> None:
        for st in (Status.PASS, Status.WARN, Status.FAIL, Status.UNKNOWN):
            self.node_status.labels(st.value).set(1 if status is st else 0)
        for sev in (Severity.MONITOR, Severity.RESET, Severity.REBOOT, Severity.ISOLATE):
            count = sum(1 for r in results for f in r.findings if f.severity is sev)
            self.findings.labels(sev.label).set(count)

    def record_probe_error(self, input_name: str, kind: str) -> None:
        self.probe_errors.labels(input_name, kind).inc()

    def record_tier_run(self, tier: str) -> None:
        self.tier_last_run.labels(tier).set(time.time())
        self.tier_runs.labels(tier).inc()

    def record_xid(self, code: str) -> None:
        self.xid_total.labels(code).inc()

    def record_taint_wanted(self, wanted: bool) -> None:
        self.tainted.set(1 if wanted else 0)

    def record_config_reload(self, result: str) -> None:
        self.config_reloads.labels(result).inc()

    def record_config_rejected(self, rejected: bool) -> None:
        self.config_rejected.set(1 if rejected else 0)

    def record_brake_open(self, is_open: bool) -> None:
        self.brake_open.set(1 if is_open else 0)

    def record_gpu_nodes(self, total: int, this_node_selected: bool) -> None:
        self.gpu_nodes.set(total)
        self.gpu_node_selected.set(1 if this_node_selected else 0)

    def record_fence(self, result: str) -> None:
        for r in ("fenced", "unfenced", "unknown"):
            self.fence.labels(r).set(1 if r == result else 0)

    def record_kernel_log(self, records: int, lost: int, untallied: int) -> None:
        self.kernel_records.set(records)
        self.kernel_lost.set(lost)
        self.kernel_untallied.set(untallied)

    def record_diag_running(self, running: bool) -> None:
        self.dcgm_diag_running.set(1 if running else 0)
