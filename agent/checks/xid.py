"""The `xid` check: every Xid/SXid (and PCIe AER fatal error) of the current boot, one latched
finding per (device, code) with how many lines and the recent rate.

Severity comes from the Xid catalog (config/xid-catalog.yaml, overridable per code). Xid 154 also
escalates by the recovery action its line names; the GPU's latest 154 counts, since a later
"... to 0x0 (None)" means the action was taken. SXids (NVSwitch) use the rule `xid.sxid`; codes the
catalog does not list use `xid.unknown-code`.

Application faults (Xid 13, 31, 43, 45: NVIDIA says restart the application) are severity `none` one
by one: a job's bad pointer is not a bad GPU. A GPU that logs one at `stormPerMinute` or more (a storm:
it faults for every job) takes the catalog's `storm` severity, `monitor`: worth a look, not a taint,
since the same storm is also what a broken job in a restart loop prints.

Decoding NVIDIA gives us: an NVLink5 Xid (144-150) the driver marks Fatal or Link Fatal is its own
finding at `xid.nvlinkSeverity` (42 of the 44 Fatal rows of NVIDIA's decode sheet are RESET_GPU); a
Nonfatal one stays at its catalog severity. Xid 48 together with Xid 64 on the same GPU in the same
burst (Xids of a GPU until 3 minutes of silence) is a DBE whose page retirement failed: isolate.

A PCIe AER uncorrected fatal error ("Uncorrected (Fatal)", "can't recover", "device recovery failed")
on a GPU's or an RDMA adapter's PCI address is a finding (`xid.pcie-aer`) even without any Xid; a
device the nvidia driver prints lines about is a GPU even without an inventory.

A consequence names its cause ("45, ..., Ch 00000001 caused by previous Xid 149"): the cause is judged
on that GPU (from its own lines when the log has them, else from the consequence line at the cause's
catalog severity), and the consequences are counted there, never as application faults.
"""

from __future__ import annotations

from dataclasses import replace

from agent.checks import CheckSpec, rule_finding, typed_input
from agent.config import Config
from agent.config.xid_catalog import Nvlink5Row
from agent.core.actions import from_nvidia_bucket
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Finding
from agent.core.gpu import GpuInventory
from agent.core.kernel import KernelXids, LinePos, XidTally
from agent.core.pci import normalize_pci, short_pci
from agent.core.rdma import RdmaSample
from agent.core.rules import Rule
from agent.core.severity import Severity
from agent.core.text import shorten

SXID = Rule("xid.sxid", Severity.MONITOR, "NVSwitch SXid in the kernel log")
UNKNOWN_CODE = Rule("xid.unknown-code", Severity.MONITOR, "an Xid code not in the catalog")
PCIE_AER = Rule("xid.pcie-aer", Severity.RESET, "PCIe AER uncorrected fatal error on a GPU or RDMA adapter")


NAME = "xid"
MAX_TEXT = 160
# Every wording of the driver's Xid 154 action (R565+; Blackwell adds "Drain and Reset", R570+ "PF FLR")
# and of nvidia-smi's "GPU Recovery Action" (Reset, Reboot, ...).
_REBOOT_ACTIONS = ("node reboot required", "system reboot", "reboot")
_RESET_ACTIONS = (
    "gpu reset required",
    "drain and reset",
    "drain p2p",
    "pf flr",
    "flr",
    "reset",
    "recover imex",
)


def recovery_severity(action: str | None) -> Severity:
    """Severity an Xid 154 recovery-action text asks for: NONE for "None" (the action was taken) or
    no text, MONITOR for a wording we do not know (never guessed from the number alone)."""
    text = (action or "").strip().lower()
    if not text or text == "none":
        return Severity.NONE
    if any(a in text for a in _REBOOT_ACTIONS):
        return Severity.REBOOT
    if any(a in text for a in _RESET_ACTIONS):
        return Severity.RESET
    return Severity.MONITOR


def newest(*positions: LinePos | None) -> LinePos | None:
    """The newest of some lines' positions (one log, one kind; the last given when kinds differ)."""
    out: LinePos | None = None
    for pos in positions:
        if pos is not None and (out is None or pos.kind != out.kind or pos.n > out.n):
            out = pos
    return out


def _trim(text: str) -> str:
    text = " ".join(text.split())
    return shorten(text, MAX_TEXT)


def _gpu_labels(facts: NodeFacts) -> dict[str, str]:
    if not isinstance(facts.gpus, GpuInventory):
        return {}
    return {normalize_pci(g.pci_bus_id): g.label for g in facts.gpus.gpus}


def _nic_names(facts: NodeFacts) -> dict[str, str]:
    """RDMA adapters by PCI address, as the efa tier last read them (none when not read)."""
    if not isinstance(facts.rdma, RdmaSample):
        return {}
    return {d.pci: d.name for d in facts.rdma.devices if d.pci}


def _count(tally: XidTally) -> str:
    rate = f", {tally.per_minute:g}/min" if tally.count > 1 and tally.per_minute > 1 else ""
    return f"×{tally.count}{rate}"


def _aer_finding(
    tally: XidTally, labels: dict[str, str], nics: dict[str, str], cfg: Config, xids: KernelXids
) -> Finding | None:
    pci = tally.first.pci or ""
    nvidia = pci in xids.nvidia_devices  # the nvidia driver printed lines about it: a GPU
    entity = labels.get(pci) or nics.get(pci) or (short_pci(pci) if pci and nvidia else None)
    if entity is None:
        return None  # a bridge, a disk, a device that is not ours to judge
    short = short_pci(pci)
    if pci in labels:
        where = f"{labels[pci] if labels[pci].startswith('GPU ') else f'GPU {labels[pci]}'} ({short})"
    elif pci in nics:
        where = f"RDMA adapter {nics[pci]} ({short})"
    else:
        where = f"GPU {short} (a device of the nvidia driver)"
    found = rule_finding(
        cfg,
        NAME,
        PCIE_AER,
        f"PCIe AER fatal error on {where} {_count(tally)}: {_trim(tally.latest.message)}",
        (entity,),
        latched=True,
        whole_key=f"aer/{short}",
    )
    return replace(found, last_line=tally.last)


def _nvlink_severity(cfg: Config) -> Severity:
    return Severity.parse(str(cfg.raw["xid"]["nvlinkSeverity"]))


def _retirement_failed(tally: XidTally, xids: KernelXids) -> bool:
    """Xid 48 (DBE) with Xid 64 (page retirement/row remap failed) on the same GPU in the same burst
    (a line the driver says an Xid 64 caused is evidence of that 64)."""
    return any(
        64 in (t.first.code, t.first.cause)
        and not t.first.sxid
        and t.first.pci == tally.first.pci
        and t.burst == tally.burst
        for t in xids.tallies
    )


def _driver_major(facts: NodeFacts) -> int | None:
    version = facts.gpus.driver_version if isinstance(facts.gpus, GpuInventory) else None
    head = (version or "").split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _decode(tally: XidTally, cfg: Config, driver: int | None) -> Nvlink5Row | None:
    ev = tally.first
    if not 144 <= ev.code <= 150 or ev.subcode is None or ev.sxid:
        return None
    return cfg.xid_catalog.decode_nvlink5(ev.code, ev.subcode[0], ev.subcode[1], driver)


def _merge_nvlink5(
    xids: KernelXids, cfg: Config, driver: int | None
) -> list[tuple[XidTally, Nvlink5Row | None]]:
    """NVLink5 lines of one GPU and code that decode to the same sub-code are one finding."""
    merged: dict[tuple[object, ...], tuple[XidTally, Nvlink5Row | None]] = {}
    for tally in xids.tallies:
        if tally.first.cause is not None:
            continue  # a consequence: judged with its cause (_consequences)
        row = _decode(tally, cfg, driver)
        ev = tally.first
        key: tuple[object, ...] = (
            (ev.code, ev.pci, row.mnemonic, row.bucket) if row is not None else (id(tally),)
        )
        seen = merged.get(key)
        if seen is None:
            merged[key] = (tally, row)
        else:
            t = seen[0]
            merged[key] = (
                replace(
                    t,
                    latest=tally.latest,
                    count=t.count + tally.count,
                    per_minute=t.per_minute + tally.per_minute,
                    last=newest(t.last, tally.last),
                ),
                row,
            )
    return list(merged.values())


def _finding(
    tally: XidTally,
    labels: dict[str, str],
    cfg: Config,
    xids: KernelXids,
    row: Nvlink5Row | None = None,
    named_by: str | None = None,
) -> Finding:
    """One (GPU, Xid) finding; named_by: the cause is known only from lines it caused (their count
    replaces the cause's own), and `tally.first` holds the first of them as the evidence."""
    ev = tally.first
    pci = short_pci(ev.pci) if ev.pci else "unknown PCI"
    count = named_by or _count(tally)
    text = _trim(ev.message)
    if ev.sxid:
        found = rule_finding(
            cfg,
            NAME,
            SXID,
            f"SXid {ev.code} on NVSwitch {pci} {count}: {text}",
            (pci,),
            latched=True,
            whole_key=f"sxid/{ev.code}/{pci}",
        )
        return replace(found, last_line=tally.last)
    known = ev.code in cfg.xid_catalog.entries or cfg.xid_overridden(ev.code)
    if known:
        rule = f"xid.{ev.code}"
        severity = cfg.xid_severity(ev.code)
    else:
        rule = UNKNOWN_CODE.name
        severity = cfg.severity(UNKNOWN_CODE)
    storm = cfg.xid_catalog.storm(ev.code)
    stormy = storm is not None and tally.per_minute >= cfg.xid_catalog.storm_per_minute
    if stormy and storm is not None and not cfg.xid_overridden(ev.code):
        severity = max(severity, storm)
    if ev.code == 154:
        severity = max(severity, recovery_severity(tally.latest.recovery_action))
    note, suffix = (" (storm)" if stormy else ""), ""
    if row is not None:  # decoded by NVIDIA's sheet: RESET_GPU takes the NVLink default
        if row.bucket == "RESET_GPU":
            severity = max(severity, _nvlink_severity(cfg))
        note, suffix = (
            f"{note} ({row.mnemonic}, {row.nvidia_severity}: {row.bucket})",
            f"/{row.mnemonic}/{row.bucket.lower()}",
        )
    elif ev.variant == "fatal":  # not in the sheet, but the driver says Fatal: the NVLink default
        severity, note, suffix = max(severity, _nvlink_severity(cfg)), f"{note} (Fatal)", "/fatal"
    elif named_by is not None and 144 <= ev.code <= 150:  # no sub-code, no Fatal word: the catalog
        note = f"{note} (sub-code unknown)"
    if ev.code == 48 and _retirement_failed(tally, xids):
        severity, note = max(severity, Severity.ISOLATE), f"{note} (with Xid 64: page retirement failed)"
    label = labels.get(ev.pci or "") or pci
    where = label if label.startswith("GPU ") else f"GPU {label}"
    name = cfg.xid_catalog.name(ev.code)
    entry = cfg.xid_catalog.entries.get(ev.code)
    # NVIDIA's bucket says what fixes it (a decoded NVLink5 sub-code: its own bucket); Xid 154 carries
    # the driver's own recovery action instead
    bucket = row.bucket if row is not None else entry.nvidia_action if entry else ""
    action = None if ev.code == 154 else from_nvidia_bucket(bucket)
    return Finding(  # xid.<code>: a catalog row, its severity worked out above, not a Rule
        check=NAME,
        rule=rule,
        severity=severity,
        message=f"Xid {ev.code} ({name}) on {where} {count}{note}: {text}",
        entities=(label,),
        key=f"xid/{ev.code}/{pci}{suffix}",
        latched=True,
        action=action,
        evidence_key=f"{count}{note}: {text}",  # not the GPU's label, which comes and goes with nvidia-smi
        last_line=tally.last,
    )


def _without_addressless_79(findings: list[Finding], xids: KernelXids) -> list[Finding]:
    """A number-less "fallen off the bus" line whose GPU address did not reach it (the driver's
    three-line record with its first line lost or far away) is the same report as a numbered or
    addressed Xid 79 of this boot: folded into the first of them, never a second fault."""
    addressless = [
        t
        for t in xids.tallies
        if t.first.code == 79
        and t.first.pci is None
        and not t.first.sxid
        and not t.first.message.startswith("Xid")
    ]
    addressed = [
        i for i, f in enumerate(findings) if f.key.startswith("xid/79/") and f.key != "xid/79/unknown PCI"
    ]
    if not addressless or not addressed:
        return findings
    lines = sum(t.count for t in addressless)
    keep = findings[addressed[0]].key
    out = [f for f in findings if f.key != "xid/79/unknown PCI"]
    i = next(j for j, f in enumerate(out) if f.key == keep)
    out[i] = replace(
        out[i], message=f"{out[i].message} (+{lines} 'fallen off the bus' line(s) naming no GPU)"
    )
    return out


def _consequences(xids: KernelXids) -> dict[tuple[int, str | None], list[XidTally]]:
    """The lines the driver says another Xid caused ("45, ... caused by previous Xid 149"), by the
    cause and GPU they name, in log order."""
    out: dict[tuple[int, str | None], list[XidTally]] = {}
    for tally in xids.tallies:
        if tally.first.cause is not None and not tally.first.sxid and not tally.first.aer:
            out.setdefault((tally.first.cause, tally.first.pci), []).append(tally)
    return out


def _consequence_text(tallies: list[XidTally]) -> str:
    """ "3 Xid 45 lines" (per consequential code)."""
    per_code: dict[int, int] = {}
    for t in tallies:
        per_code[t.first.code] = per_code.get(t.first.code, 0) + t.count
    return ", ".join(f"{n} Xid {code} line{'s' if n != 1 else ''}" for code, n in per_code.items())


def _with_causes(
    findings: list[Finding], xids: KernelXids, labels: dict[str, str], cfg: Config
) -> list[Finding]:
    """Each cause a consequence names, on its GPU: the cause's own finding (its most severe one)
    counts the consequences; a cause whose own lines are not in the log (outside an excerpt, or
    overwritten in the ring) is reported from the consequence line itself, at the cause's catalog
    severity. Consequences are never application faults of their own."""
    out = list(findings)
    for (cause, pci), tallies in _consequences(xids).items():
        caused = _consequence_text(tallies)
        prefix = f"xid/{cause}/{short_pci(pci) if pci else 'unknown PCI'}"
        own = [i for i, f in enumerate(out) if f.key == prefix or f.key.startswith(prefix + "/")]
        if own:
            i = max(own, key=lambda j: int(out[j].severity))
            out[i] = replace(out[i], message=f"{out[i].message} (+{caused} caused by it)")
            continue
        first = tallies[0]
        evidence = first.first._replace(
            code=cause, cause=None, variant="", subcode=None, recovery_action=None
        )
        # its count is the consequences' lines: the newest of them is its evidence's newest line
        named = replace(
            first,
            first=evidence,
            latest=evidence,
            per_minute=0.0,
            last=newest(*(t.last for t in tallies)),
        )
        out.append(
            _finding(
                named, labels, cfg, xids, named_by=f"(named by {caused}: 'caused by previous Xid {cause}')"
            )
        )
    return out


def check_xid(facts: NodeFacts, cfg: Config) -> CheckResult:
    """Judge every Xid of the current boot (facts.kernel folds only this boot's records)."""
    xids = typed_input(NAME, facts.kernel, KernelXids)
    if isinstance(xids, CheckResult):
        return xids
    labels = _gpu_labels(facts)
    nics = _nic_names(facts)
    findings: list[Finding] = []
    for tally, row in _merge_nvlink5(xids, cfg, _driver_major(facts)):
        found = (
            _aer_finding(tally, labels, nics, cfg, xids)
            if tally.first.aer
            else _finding(tally, labels, cfg, xids, row)
        )
        if found is not None:
            findings.append(found)
    findings = _with_causes(_without_addressless_79(findings, xids), xids, labels, cfg)
    findings.sort(key=lambda f: -int(f.severity))  # stable: equal severities keep log order
    return CheckResult(
        NAME,
        findings=tuple(findings),
        note="no Xid in this boot's kernel log",  # no record count: the annotation must stay stable
    )


CHECKS = (CheckSpec("xid", check_xid, (Input.KERNEL, Input.GPUS), "xid", (SXID, UNKNOWN_CODE, PCIE_AER)),)
