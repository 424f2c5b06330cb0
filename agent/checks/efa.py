"""The EFA check: AWS Elastic Fabric Adapters present, ports ACTIVE, error counters quiet.

Counts come from /sys/class/infiniband (devices with PCI vendor 0x1d0f or the efa driver), not
lspci: a device the efa driver did not bind is as useless to NCCL as a missing one. Counter rates
need two samples; the agent passes its previous read in facts.rdma_previous.
"""

from __future__ import annotations

from collections.abc import Mapping

from agent.checks import CheckSpec, rule_finding, typed_input
from agent.config import Config
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Finding
from agent.core.pci import short_pci
from agent.core.rdma import RdmaDevice, RdmaPort, RdmaSample
from agent.core.rules import Rule
from agent.core.severity import Severity

NAME = "efa"
RATE_COUNTERS = (
    "rx_drops",
    "retrans_timeout_events",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
)


COUNT = Rule("efa.count", Severity.ISOLATE, "EFA device count differs from the profile")
# A port read once while its link retrains is not a dead adapter (confirmed over node.confirmAfter).
PORT_DOWN = Rule("efa.port-down", Severity.REBOOT, "an EFA port is not ACTIVE", confirm=True)
COUNTER_RATE = Rule("efa.counter-rate", Severity.MONITOR, "an EFA error counter grows faster than its limit")


def _entities(dev: RdmaDevice) -> tuple[str, ...]:
    return (dev.name, short_pci(dev.pci)) if dev.pci else (dev.name,)


def _finding(cfg: Config, rule: Rule, message: str, entities: tuple[str, ...], key: str) -> Finding:
    return rule_finding(cfg, NAME, rule, message, entities, key)


def _port_ok(port: RdmaPort) -> bool:
    return "ACTIVE" in (port.state or "").upper()


def _port_findings(cfg: Config, efa: list[RdmaDevice]) -> tuple[list[Finding], list[str]]:
    """Ports not ACTIVE → findings; ports whose state could not be read → reasons (unknown)."""
    findings: list[Finding] = []
    unreadable: list[str] = []
    for dev in efa:
        if not dev.ports:
            unreadable.append(f"{dev.name}: no port listed")
        for port in dev.ports:
            if port.state is None:
                unreadable.append(f"{dev.name} port {port.number}: state unreadable")
            elif not _port_ok(port):
                phys = f", physical {port.phys_state}" if port.phys_state else ""
                findings.append(
                    _finding(
                        cfg,
                        PORT_DOWN,
                        f"EFA {dev.name} port {port.number} is {port.state}{phys}",
                        _entities(dev),
                        f"{dev.name}/{port.number}",
                    )
                )
    return findings, unreadable


def _rate_findings(
    cfg: Config, cur: RdmaSample, prev: RdmaSample, limits: Mapping[str, float]
) -> tuple[list[Finding], str]:
    dt = cur.taken_at - prev.taken_at
    if dt <= 0:
        return [], "samples not in time order: counter rates not evaluated"
    before = {(d.name, p.number): p.counters for d in prev.devices for p in d.ports}
    out: list[Finding] = []
    for dev in cur.devices:
        if not dev.is_efa:
            continue
        for port in dev.ports:
            old = before.get((dev.name, port.number))
            if old is None:
                continue
            for counter in RATE_COUNTERS:
                if counter not in port.counters or counter not in old or counter not in limits:
                    continue
                delta = port.counters[counter] - old[counter]
                if delta <= 0:
                    continue  # unchanged, or reset by a driver reload
                rate = delta / dt
                limit = float(limits[counter])
                if rate > limit:
                    out.append(
                        _finding(
                            cfg,
                            COUNTER_RATE,
                            f"EFA {dev.name} port {port.number}: {counter} grew by {delta} in {dt:.0f} s "
                            f"({rate:.2f}/s, limit {limit:g}/s)",
                            _entities(dev),
                            f"{dev.name}/{port.number}/{counter}",
                        )
                    )
    return out, "counter rates within limits"  # no interval in the text: the annotation must stay stable


def _others_note(others: list[RdmaDevice]) -> str:
    """Mellanox and other RDMA devices: port states for information only (EFA is what we judge)."""
    if not others:
        return ""
    down = [
        f"{d.name} port {p.number} {p.state or 'unknown'}" for d in others for p in d.ports if not _port_ok(p)
    ]
    if down:
        return f"other RDMA devices (not judged): {', '.join(down)}"
    return f"{len(others)} other RDMA device(s) (not judged): all ports ACTIVE"


def check_efa(facts: NodeFacts, cfg: Config) -> CheckResult:
    prof = facts.profile
    expected = prof.efa_count if prof is not None else 0
    what = prof.instance_type if prof is not None else "an unknown instance type"
    if expected == 0 and not isinstance(facts.rdma, RdmaSample):
        return CheckResult(NAME, skipped=f"no EFA expected for {what}")
    sample = typed_input(NAME, facts.rdma, RdmaSample)
    if isinstance(sample, CheckResult):
        return sample
    efa = [d for d in sample.devices if d.is_efa]
    others = [d for d in sample.devices if not d.is_efa]
    if expected == 0 and not efa:
        extra = _others_note(others)
        return CheckResult(NAME, skipped=f"no EFA expected for {what}" + (f"; {extra}" if extra else ""))

    findings: list[Finding] = []
    notes = [f"{len(efa)} EFA device(s)"]
    if expected > 0 and len(efa) != expected:
        findings.append(
            _finding(
                cfg,
                COUNT,
                f"{len(efa)} EFA device(s) found, {what} has {expected}",
                (),
                "count",
            )
        )
    elif expected == 0:
        notes.append(f"count not checked (no EFA expected for {what})")
    port_findings, unreadable = _port_findings(cfg, efa)
    findings += port_findings
    if not port_findings and not unreadable:
        notes.append("all ports ACTIVE")
    if facts.rdma_previous is None:
        notes.append("no previous sample: counter rates not evaluated")
    else:
        limits = cfg.thresholds.efa_counter_rate_per_sec
        rate_findings, rate_note = _rate_findings(cfg, sample, facts.rdma_previous, limits)
        findings += rate_findings
        notes.append(rate_note)
    other = _others_note(others)
    if other:
        notes.append(other)
    unknown = f"could not read EFA port state: {'; '.join(unreadable[:5])}" if unreadable else None
    return CheckResult(NAME, findings=tuple(findings), unknown=unknown, note="; ".join(notes))


CHECKS = (CheckSpec("efa", check_efa, (Input.RDMA,), "efa", (COUNT, PORT_DOWN, COUNTER_RATE)),)
