"""The `xid` check: every Xid/SXid of the current boot, one latched finding per (device, code).

Severity comes from the Xid catalog (config/xid-catalog.yaml, overridable per code). Xid 154 also
escalates by the recovery action its line names; the GPU's latest 154 counts, since a later
"... to 0x0 (None)" means the action was taken. SXids (NVSwitch) use the rule `xid.sxid`; codes the
catalog does not list use `xid.unknown-code`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.checks import CheckSpec, input_gap
from agent.config import Config
from agent.core.actions import from_nvidia_bucket
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Finding
from agent.core.model import GpuInventory, KernelLog, XidEvent, normalize_pci, short_pci
from agent.core.rules import Rule
from agent.core.severity import Severity
from agent.core.text import shorten
from agent.probes.xid_events import extract_xids

SXID = Rule("xid.sxid", Severity.MONITOR, "NVSwitch SXid in the kernel log")
UNKNOWN_CODE = Rule("xid.unknown-code", Severity.MONITOR, "an Xid code not in the catalog")


NAME = "xid"
MAX_TEXT = 160
_REBOOT_ACTIONS = ("node reboot required", "system reboot")
_RESET_ACTIONS = ("gpu reset required", "drain and reset", "drain p2p", "bus reset")


@dataclass
class _Group:
    first: XidEvent
    events: list[XidEvent] = field(default_factory=list)

    @property
    def count(self) -> int:
        """Lines that carry an Xid number; the number-less "fallen off the bus" companion line of an
        Xid 79 is the same event printed twice, so it counts only when no numbered line exists."""
        numbered = sum(1 for e in self.events if e.sxid or "Xid" in e.message)
        return numbered or len(self.events)

    @property
    def text(self) -> str:
        numbered = [e for e in self.events if e.sxid or "Xid" in e.message]
        return (numbered or self.events)[0].message


def recovery_severity(action: str | None) -> Severity:
    """Severity an Xid 154 recovery-action text asks for (NONE for "None" or unknown text)."""
    text = (action or "").strip().lower()
    if any(a in text for a in _REBOOT_ACTIONS):
        return Severity.REBOOT
    if any(a in text for a in _RESET_ACTIONS):
        return Severity.RESET
    return Severity.NONE


def _trim(text: str) -> str:
    text = " ".join(text.split())
    return shorten(text, MAX_TEXT)


def _gpu_labels(facts: NodeFacts) -> dict[str, str]:
    if not isinstance(facts.gpus, GpuInventory):
        return {}
    return {normalize_pci(g.pci_bus_id): g.label for g in facts.gpus.gpus}


def _finding(group: _Group, facts_labels: dict[str, str], cfg: Config) -> Finding:
    ev = group.first
    pci = short_pci(ev.pci) if ev.pci else "unknown PCI"
    count = f"×{group.count}"
    text = _trim(group.text)
    if ev.sxid:
        return Finding(
            check=NAME,
            rule=SXID.name,
            severity=cfg.severity(SXID),
            message=f"SXid {ev.code} on NVSwitch {pci} {count}: {text}",
            entities=(pci,),
            key=f"sxid/{ev.code}/{pci}",
            latched=True,
        )
    known = ev.code in cfg.xid_catalog.entries or cfg.xid_overridden(ev.code)
    if known:
        rule = f"xid.{ev.code}"
        severity = cfg.xid_severity(ev.code)
    else:
        rule = UNKNOWN_CODE.name
        severity = cfg.severity(UNKNOWN_CODE)
    if ev.code == 154:
        severity = max(severity, recovery_severity(group.events[-1].recovery_action))
    label = facts_labels.get(ev.pci or "") or pci
    where = label if label.startswith("GPU ") else f"GPU {label}"
    name = cfg.xid_catalog.name(ev.code)
    entry = cfg.xid_catalog.entries.get(ev.code)
    # NVIDIA's bucket says what fixes it; Xid 154 carries the driver's own recovery action instead
    action = None if ev.code == 154 else from_nvidia_bucket(entry.nvidia_action if entry else "")
    return Finding(
        check=NAME,
        rule=rule,
        severity=severity,
        message=f"Xid {ev.code} ({name}) on {where} {count}: {text}",
        entities=(label,),
        key=f"xid/{ev.code}/{pci}",
        latched=True,
        action=action,
    )


def check_xid(facts: NodeFacts, cfg: Config) -> CheckResult:
    """Judge every Xid of the current boot (facts.kernel holds only this boot's records)."""
    gap = input_gap(NAME, facts.kernel)
    if gap is not None:
        return gap
    log = facts.kernel
    assert isinstance(log, KernelLog)
    groups: dict[tuple[bool, int, str | None], _Group] = {}
    for ev in extract_xids(log):
        group = groups.setdefault((ev.sxid, ev.code, ev.pci), _Group(first=ev))
        group.events.append(ev)
    labels = _gpu_labels(facts)
    findings = [_finding(g, labels, cfg) for g in groups.values()]
    findings.sort(key=lambda f: -int(f.severity))  # stable: equal severities keep log order
    return CheckResult(
        NAME,
        findings=tuple(findings),
        note="no Xid in this boot's kernel log",  # no record count: the annotation must stay stable
    )


CHECKS = (CheckSpec("xid", check_xid, (Input.KERNEL, Input.GPUS), "xid", (SXID, UNKNOWN_CODE)),)
