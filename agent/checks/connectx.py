"""The ConnectX check: InfiniBand and RoCE fabrics (DGX, Azure ND, GKE A3 Ultra, on-prem).

Read from /sys/class/infiniband like EFA (agent.probes.rdma). A node may carry more ConnectX ports
than its GPU fabric (storage, management, unused Ethernet ports left Disabled), so the profile
says how many fabric ports must be ACTIVE at which rate (connectxCount, connectxRateGbps) and the
rest are listed, not judged. When the fabric is short, the ports that explain it are reported:
ports down (of the fabric's link layer), ports active below the rate, or too few ports at all.

A port that just went down since the previous read is left to the flap rule until it has been
down for DOWN_FOR_S; without a previous read (one-shot `check`) a down port is judged as it is.
Counters (IB PMA counters in ports/N/counters) are judged on their growth between two reads.
"""

from __future__ import annotations

import re
from collections import Counter

from agent.checks import CheckSpec, rule_finding, typed_input
from agent.config import Config
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Finding
from agent.core.pci import MELLANOX_VENDOR
from agent.core.rdma import RdmaDevice, RdmaPort, RdmaSample
from agent.core.rules import Rule
from agent.core.severity import Severity

NAME = "connectx"
DOWN_FOR_S = 60.0  # a fabric port down at two reads at least this far apart is down, not flapping
FLAP_DOWNS = 2  # link_downed growth between two reads that makes a port flapping
# ibqueryerrors' default threshold per counter, applied to the growth between two reads.
ERROR_GROWTH = 10
ERROR_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "port_rcv_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")

COUNT = Rule("connectx.count", Severity.ISOLATE, "fewer ConnectX ports than the profile's fabric")
PORT_DOWN = Rule("connectx.port-down", Severity.REBOOT, "a ConnectX fabric port is not ACTIVE")
RATE = Rule("connectx.rate", Severity.MONITOR, "a ConnectX fabric port runs below the profile's rate")
FLAP = Rule("connectx.flap", Severity.ISOLATE, "a ConnectX port went down repeatedly between two reads")
ERRORS = Rule("connectx.errors", Severity.MONITOR, "ConnectX link error counters grew")


def rate_gbps(port: RdmaPort) -> float | None:
    """ "400 Gb/sec (4X NDR)" → 400.0."""
    m = _RATE.match(port.rate or "")
    return float(m.group(1)) if m else None


def is_connectx(dev: RdmaDevice) -> bool:
    if dev.is_efa:
        return False
    mlx = (dev.driver or "").startswith("mlx") or dev.name.startswith("mlx")
    return (dev.vendor or "") == MELLANOX_VENDOR or mlx


def _active(port: RdmaPort) -> bool:
    return "ACTIVE" in (port.state or "").upper()


def _desc(dev: RdmaDevice, port: RdmaPort) -> str:
    return f"{dev.name} port {port.number}"


def _finding(cfg: Config, rule: Rule, msg: str, dev: RdmaDevice, port: RdmaPort, key: str = "") -> Finding:
    suffix = f"/{key}" if key else ""
    return rule_finding(cfg, NAME, rule, msg, (dev.name,), f"{dev.name}/{port.number}{suffix}")


def _down_long_enough(dev: RdmaDevice, port: RdmaPort, facts: NodeFacts, now: float) -> bool:
    prev = facts.rdma_previous
    if prev is None:
        return True
    for old in prev.devices:
        if old.name == dev.name:
            for p in old.ports:
                if p.number == port.number:
                    return not _active(p) and now - prev.taken_at >= DOWN_FOR_S
    return True  # not there before: the device appeared already down


def _fabric_findings(
    cfg: Config, facts: NodeFacts, ports: list[tuple[RdmaDevice, RdmaPort]], want: int, rate: float | None
) -> tuple[list[Finding], list[str]]:
    sample = facts.rdma
    assert isinstance(sample, RdmaSample)
    at_rate = [(d, p) for d, p in ports if _active(p) and (rate is None or (rate_gbps(p) or 0) >= rate)]
    where = f" at {rate:g} Gb/s" if rate else ""
    notes = [f"{len(at_rate)} of {want} fabric port(s) ACTIVE{where}"]
    if len(at_rate) >= want:
        extra = [f"{_desc(d, p)} {p.state or 'unknown'}" for d, p in ports if (d, p) not in at_rate]
        if extra:
            notes.append(f"other ConnectX ports (not judged): {', '.join(extra[:6])}")
        return [], notes
    layers = Counter(p.link_layer for _, p in at_rate)
    layer = layers.most_common(1)[0][0] if layers else None
    out: list[Finding] = []
    for dev, port in ports:
        if (dev, port) in at_rate:
            continue
        if not _active(port):
            if layer is not None and port.link_layer != layer:
                continue  # an Ethernet port beside an InfiniBand fabric (or the reverse)
            if not _down_long_enough(dev, port, facts, sample.taken_at):
                notes.append(f"{_desc(dev, port)} down since the last read: judged after {DOWN_FOR_S:g} s")
                continue
            phys = f", physical {port.phys_state}" if port.phys_state else ""
            msg = f"ConnectX {_desc(dev, port)} is {port.state or 'unreadable'}{phys}"
            out.append(_finding(cfg, PORT_DOWN, msg, dev, port))
        elif rate is not None and (layer is None or port.link_layer == layer):
            got = port.rate or "an unreadable rate"
            msg = f"ConnectX {_desc(dev, port)} is ACTIVE at {got}, expected {rate:g} Gb/s"
            out.append(_finding(cfg, RATE, msg, dev, port))
    if len(ports) < want:
        prof = facts.profile
        what = prof.instance_type if prof is not None else "the profile"
        msg = f"{len(ports)} ConnectX port(s) found, {what} has {want}"
        out.append(rule_finding(cfg, NAME, COUNT, msg, (), "count"))
    return out, notes


def _counter_findings(
    cfg: Config, facts: NodeFacts, ports: list[tuple[RdmaDevice, RdmaPort]]
) -> list[Finding]:
    prev = facts.rdma_previous
    sample = facts.rdma
    assert isinstance(sample, RdmaSample)
    if prev is None or sample.taken_at <= prev.taken_at:
        return []
    dt = sample.taken_at - prev.taken_at
    before = {(d.name, p.number): p.counters for d in prev.devices for p in d.ports}
    out: list[Finding] = []
    for dev, port in ports:
        old = before.get((dev.name, port.number))
        if old is None:
            continue
        downs = port.counters.get("link_downed", 0) - old.get("link_downed", 0)
        if downs >= FLAP_DOWNS:
            msg = f"ConnectX {_desc(dev, port)} went down {downs} times in {dt:.0f} s (link_downed)"
            out.append(_finding(cfg, FLAP, msg, dev, port))
        grown = {
            c: port.counters[c] - old[c]
            for c in ERROR_COUNTERS
            if c in port.counters and c in old and port.counters[c] - old[c] >= ERROR_GROWTH
        }
        if grown:
            detail = ", ".join(f"{c} +{n}" for c, n in grown.items())
            msg = f"ConnectX {_desc(dev, port)}: {detail} in {dt:.0f} s"
            out.append(_finding(cfg, ERRORS, msg, dev, port, "errors"))
    return out


def check_connectx(facts: NodeFacts, cfg: Config) -> CheckResult:
    prof = facts.profile
    want = prof.connectx_count if prof is not None else 0
    if want == 0 and not isinstance(facts.rdma, RdmaSample):
        return CheckResult(NAME, skipped="no ConnectX fabric in the profile")
    sample = typed_input(NAME, facts.rdma, RdmaSample)
    if isinstance(sample, CheckResult):
        return sample
    ports = [(d, p) for d in sample.devices if is_connectx(d) for p in d.ports]
    if not ports and want == 0:
        return CheckResult(NAME, skipped="no ConnectX RDMA device")
    findings: list[Finding] = []
    notes = [f"{len(ports)} ConnectX port(s)"]
    if want > 0:
        assert prof is not None
        fabric, fabric_notes = _fabric_findings(cfg, facts, ports, want, prof.connectx_rate_gbps)
        findings += fabric
        notes += fabric_notes
    else:
        down = [_desc(d, p) for d, p in ports if not _active(p)]
        notes.append("no ConnectX fabric in the profile: port states not judged")
        if down:
            notes.append(f"not ACTIVE: {', '.join(down[:6])}")
    findings += _counter_findings(cfg, facts, ports)
    if facts.rdma_previous is None:
        notes.append("no previous sample: flaps and error counters not evaluated")
    unreadable = [_desc(d, p) for d, p in ports if p.state is None]
    unknown = f"could not read the state of {', '.join(unreadable[:5])}" if unreadable and want > 0 else None
    return CheckResult(NAME, findings=tuple(findings), unknown=unknown, note="; ".join(notes))


CHECKS = (CheckSpec(NAME, check_connectx, (Input.RDMA,), "efa", (COUNT, PORT_DOWN, RATE, FLAP, ERRORS)),)
