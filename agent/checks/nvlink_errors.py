"""The NVLink error check: replay, recovery and CRC counters of every active link, as rates.

The counters (NVML, agent.probes.nvlink_errors) count since the driver loaded, and a healthy link
counts a few replays, so they are judged on their growth between two reads of the agent: a
link recovery (the link retrained) at any rate, replays and CRC errors faster than
ERRORS_PER_MINUTE. A one-shot `check` has one read: it notes the totals and judges nothing.
"""

from __future__ import annotations

from agent.checks import CheckSpec, rule_finding, typed_input
from agent.config import Config
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Finding
from agent.core.nvlink import NvlinkErrorSample
from agent.core.rules import Rule
from agent.core.severity import Severity

NAME = "nvlink-errors"
ERRORS_PER_MINUTE = 1.0  # replay / CRC growth above this per link is reported (ours; see docs/checks.md)

RECOVERY = Rule("nvlink-errors.recovery", Severity.MONITOR, "an NVLink went through link recovery")
REPLAY = Rule("nvlink-errors.replay", Severity.MONITOR, "NVLink replays grow faster than 1 a minute")
CRC = Rule("nvlink-errors.crc", Severity.MONITOR, "NVLink CRC errors grow faster than 1 a minute")
_RULE = {"recovery": RECOVERY, "replay": REPLAY, "crc_flit": CRC, "crc_data": CRC}


def check_nvlink_errors(facts: NodeFacts, cfg: Config) -> CheckResult:
    now = typed_input(NAME, facts.nvlink_errors, NvlinkErrorSample)
    if isinstance(now, CheckResult):
        return now
    links = sum(len(g.links) for g in now.gpus)
    if links == 0:
        return CheckResult(NAME, skipped="no active NVLink with error counters")
    prev = facts.nvlink_errors_previous
    if prev is None or now.taken_at <= prev.taken_at:
        totals = {c: sum(v.get(c, 0) for g in now.gpus for v in g.links.values()) for c in _RULE}
        shown = ", ".join(f"{c} {n}" for c, n in totals.items())
        return CheckResult(NAME, note=f"{links} link(s), totals since driver load: {shown}; no previous read")
    dt = now.taken_at - prev.taken_at
    before = {(g.pci_bus_id, n): c for g in prev.gpus for n, c in g.links.items()}
    findings: list[Finding] = []
    for gpu in now.gpus:
        for link, counters in sorted(gpu.links.items()):
            old = before.get((gpu.pci_bus_id, link))
            if old is None:
                continue
            for counter, value in counters.items():
                delta = value - old.get(counter, value)
                if delta <= 0 or counter not in _RULE:
                    continue  # unchanged, or reset by a driver reload
                if counter != "recovery" and delta / dt * 60 <= ERRORS_PER_MINUTE:
                    continue
                rule = _RULE[counter]
                msg = f"GPU {gpu.index} NVLink {link}: {counter} grew by {delta} in {dt:.0f} s"
                key = f"gpu{gpu.index}/{link}/{counter}"
                findings.append(rule_finding(cfg, NAME, rule, msg, (f"GPU {gpu.index}",), key))
    return CheckResult(NAME, findings=tuple(findings), note=f"{links} link(s): error counters quiet")


CHECKS = (CheckSpec(NAME, check_nvlink_errors, (Input.NVLINK_ERRORS,), "topology", (RECOVERY, REPLAY, CRC)),)
