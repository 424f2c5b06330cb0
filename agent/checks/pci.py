"""The PCI bus checks: what is on the bus against what the drivers and the profile see, the PCIe
links of GPUs, NVSwitches and RDMA NICs, and the AER error counters on their way to the CPU.

Read from /sys/bus/pci/devices (agent.probes.pci), so a GPU that failed so hard that the driver no
longer lists it still shows, with its PCI address.

Power saving: an idle NVIDIA GPU lowers its PCIe generation (P8 runs Gen1) and raises it under
load; its width never changes. So the width of every judged link is judged always, against the
narrower of its two ends (the device's and its upstream port's maximum; for GPUs also the profile's
pcieWidth). A GPU's speed is judged only when the driver reports it in performance state P0 (the
state in which the link runs at its top speed); in any other state, or with no state known, the
speed is noted, not judged. ConnectX, EFA and NVSwitch links do not change speed to save power:
their speed is judged always, against the slower end.
"""

from __future__ import annotations

from agent.checks import CheckSpec, rule_finding, typed_input
from agent.config import Config
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Finding
from agent.core.gpu import GpuInventory
from agent.core.pci import PciDevice, PciSample, short_pci
from agent.core.rdma import RdmaSample
from agent.core.rules import Rule
from agent.core.severity import Severity

INVENTORY, LINK, AER = "pci.inventory", "pci.link", "pci.aer"
JUDGED = ("gpu", "nvswitch", "efa", "connectx")
# Correctable AER errors per second above which a link is reported: DCGM's PCIe health watch
# reports more than 8 replays a minute; a correctable error (RxErr, BadTLP, BadDLLP, replay
# rollover/timeout) is what makes a replay.
CORRECTABLE_PER_SEC = 8 / 60

GPU_INVISIBLE = Rule(
    "pci.inventory.gpu-invisible", Severity.REBOOT, "a GPU on the PCI bus the driver does not list"
)
GPU_OFF_BUS = Rule("pci.inventory.gpu-off-bus", Severity.ISOLATE, "a GPU is missing from the PCI bus")
NVSWITCH_OFF_BUS = Rule(
    "pci.inventory.nvswitch-off-bus", Severity.ISOLATE, "fewer NVSwitches on the PCI bus than the profile"
)
NIC_INVISIBLE = Rule(
    "pci.inventory.nic-invisible", Severity.REBOOT, "an RDMA NIC on the PCI bus without RDMA device"
)
NIC_OFF_BUS = Rule("pci.inventory.nic-off-bus", Severity.ISOLATE, "an RDMA NIC is missing from the PCI bus")
# A link read once while it retrains (monitor; confirmed where `severities:` makes it fail).
LINK_WIDTH = Rule(
    "pci.link.width", Severity.MONITOR, "a PCIe link runs narrower than both its ends support", confirm=True
)
LINK_SPEED = Rule(
    "pci.link.speed", Severity.MONITOR, "a PCIe link runs slower than both its ends support", confirm=True
)
AER_FATAL = Rule("pci.aer.fatal", Severity.REBOOT, "a fatal uncorrectable PCIe error was counted this boot")
AER_NONFATAL = Rule("pci.aer.nonfatal", Severity.MONITOR, "non-fatal uncorrectable PCIe errors grew")
AER_CORRECTABLE = Rule("pci.aer.correctable", Severity.MONITOR, "correctable PCIe errors grow > 8 a minute")


def _finding(cfg: Config, check: str, rule: Rule, msg: str, dev: PciDevice | str | None = None) -> Finding:
    if isinstance(dev, PciDevice):
        return rule_finding(cfg, check, rule, msg, (short_pci(dev.address),), short_pci(dev.address))
    if isinstance(dev, str):
        return rule_finding(cfg, check, rule, msg, (short_pci(dev),), short_pci(dev))
    return rule_finding(cfg, check, rule, msg, (), "count")


def _of_kind(sample: PciSample, kind: str) -> list[PciDevice]:
    return [d for d in sample.devices if d.kind == kind and not d.virtual_function]


def _bound(dev: PciDevice) -> str:
    return f"bound to {dev.driver}" if dev.driver else "no driver bound"


# --------------------------------------------------------------------------- inventory


def _gpu_findings(cfg: Config, facts: NodeFacts, sample: PciSample) -> tuple[list[Finding], list[str]]:
    gpus = _of_kind(sample, "gpu")
    on_bus = {d.address for d in gpus}
    findings: list[Finding] = []
    notes = [f"{len(gpus)} NVIDIA GPU(s) on the bus"]
    inv = facts.gpus
    if isinstance(inv, GpuInventory):
        listed = {g.pci_bus_id for g in inv.gpus}
        lost = set(inv.silent)
        for dev in gpus:
            if dev.address not in listed and dev.address not in lost:  # lost: gpu.responsive says it
                msg = (
                    f"NVIDIA GPU {short_pci(dev.address)} is on the PCI bus ({_bound(dev)}) "
                    f"but {inv.source} does not list it"
                )
                findings.append(_finding(cfg, INVENTORY, GPU_INVISIBLE, msg, dev))
        for addr in sorted((listed | lost) - on_bus):
            msg = f"GPU {short_pci(addr)} is listed by {inv.source} but is not on the PCI bus"
            findings.append(_finding(cfg, INVENTORY, GPU_OFF_BUS, msg, addr))
    else:
        notes.append(f"GPU list ({inv}): GPUs invisible to the driver not judged")
    prof = facts.profile
    reported = {f.key for f in findings if f.rule == GPU_OFF_BUS.name}
    if prof is not None and len(gpus) < prof.gpu_count and not reported:
        msg = f"{len(gpus)} NVIDIA GPU(s) on the PCI bus, {prof.instance_type} has {prof.gpu_count}"
        findings.append(_finding(cfg, INVENTORY, GPU_OFF_BUS, msg))
    return findings, notes


def _rdma_pcis(rdma: RdmaSample) -> set[str]:
    """PCI functions that have an RDMA device; a bond's device covers its port's sibling functions."""
    out: set[str] = set()
    for dev in rdma.devices:
        if dev.pci is None:
            continue
        out.add(dev.pci)
        if "bond" in dev.name:
            slot = dev.pci.rpartition(".")[0]
            out.update(f"{slot}.{fn}" for fn in range(8))
    return out


def _nic_findings(cfg: Config, facts: NodeFacts, sample: PciSample) -> tuple[list[Finding], list[str]]:
    efa, cx = _of_kind(sample, "efa"), _of_kind(sample, "connectx")
    findings: list[Finding] = []
    notes = [f"{len(efa)} EFA, {len(cx)} ConnectX function(s) on the bus"]
    prof = facts.profile
    rdma = facts.rdma
    if isinstance(rdma, RdmaSample):
        with_rdma = _rdma_pcis(rdma)
        # ConnectX functions serve plain Ethernet too: judge them when the profile expects an RDMA
        # fabric or when the RDMA driver (mlx5_ib) runs, i.e. another ConnectX has an RDMA device.
        cx_judged = (prof is not None and prof.connectx_count > 0) or any(d.address in with_rdma for d in cx)
        for dev in efa + (cx if cx_judged else []):
            if dev.address not in with_rdma:
                what = "EFA" if dev.kind == "efa" else "ConnectX"
                msg = f"{what} {short_pci(dev.address)} is on the PCI bus ({_bound(dev)}), no RDMA device"
                findings.append(_finding(cfg, INVENTORY, NIC_INVISIBLE, msg, dev))
        on_bus = {d.address for d in sample.devices}
        for rdev in rdma.devices:
            if rdev.pci is not None and rdev.pci not in on_bus:
                msg = f"RDMA device {rdev.name} ({short_pci(rdev.pci)}) is not on the PCI bus"
                findings.append(_finding(cfg, INVENTORY, NIC_OFF_BUS, msg, rdev.pci))
    else:
        notes.append(f"RDMA devices ({rdma}): NICs invisible to the RDMA driver not judged")
    if prof is not None:
        expected = (("EFA", len(efa), prof.efa_count), ("ConnectX", len(cx), prof.connectx_count))
        for what, have, want in expected:
            if have < want:
                msg = f"{have} {what} function(s) on the PCI bus, {prof.instance_type} has {want}"
                findings.append(rule_finding(cfg, INVENTORY, NIC_OFF_BUS, msg, (), f"count/{what}"))
    return findings, notes


def _vanished(cfg: Config, facts: NodeFacts, sample: PciSample) -> list[Finding]:
    """A judged device the previous read saw and this one does not: it fell off the bus."""
    prev = facts.pci_previous
    if prev is None:
        return []
    now = {d.address for d in sample.devices}
    out = []
    for dev in prev.devices:
        if dev.kind in JUDGED and not dev.virtual_function and dev.address not in now:
            rule = GPU_OFF_BUS if dev.kind in ("gpu", "nvswitch") else NIC_OFF_BUS
            msg = f"{dev.label} was on the PCI bus at the previous read and is gone"
            out.append(_finding(cfg, INVENTORY, rule, msg, dev))
    return out


def check_inventory(facts: NodeFacts, cfg: Config) -> CheckResult:
    sample = typed_input(INVENTORY, facts.pci, PciSample)
    if isinstance(sample, CheckResult):
        return sample
    gpu_f, gpu_n = _gpu_findings(cfg, facts, sample)
    nic_f, nic_n = _nic_findings(cfg, facts, sample)
    seen = {f.key for f in gpu_f + nic_f}
    gone = [f for f in _vanished(cfg, facts, sample) if f.key not in seen]
    nvswitch = len(_of_kind(sample, "nvswitch"))
    notes = [*gpu_n, *nic_n] + ([f"{nvswitch} NVSwitch(es)"] if nvswitch else [])
    prof = facts.profile
    if prof is not None and nvswitch < prof.nvswitch_count:
        msg = f"{nvswitch} NVSwitch(es) on the PCI bus, {prof.instance_type} has {prof.nvswitch_count}"
        gpu_f.append(rule_finding(cfg, INVENTORY, NVSWITCH_OFF_BUS, msg, (), "count/nvswitch"))
    return CheckResult(INVENTORY, findings=tuple(gpu_f + nic_f + gone), note="; ".join(notes))


# --------------------------------------------------------------------------- links


def _shares_link(dev: PciDevice, by_addr: dict[str, PciDevice]) -> bool:
    """Function 1..7 of a multi-function device rides function 0's link: judge that one only."""
    slot, _, fn = dev.address.rpartition(".")
    first = by_addr.get(f"{slot}.0")
    return fn != "0" and first is not None and first.kind == dev.kind


def _lowest(*values: float | None) -> float | None:
    known = [v for v in values if v]
    return min(known) if known else None


def _pstates(facts: NodeFacts) -> dict[str, str | None]:
    inv = facts.gpus
    if not isinstance(inv, GpuInventory):
        return {}
    return {g.pci_bus_id: g.power.performance_state for g in inv.gpus}


def _link_findings(
    cfg: Config, facts: NodeFacts, dev: PciDevice, up: PciDevice | None, pstates: dict[str, str | None]
) -> tuple[list[Finding], str | None]:
    """Findings on one device's link, and a note when its speed was not judged."""
    out: list[Finding] = []
    prof = facts.profile
    profile_width = prof.pcie_width if prof is not None and dev.kind == "gpu" else None
    want_w = _lowest(dev.width_max, up.width_max if up else None, profile_width)
    where = f" (upstream port {short_pci(up.address)})" if up else ""
    if dev.width_current is not None and want_w is not None and dev.width_current < want_w:
        state = "link down (x0)" if dev.width_current == 0 else f"x{dev.width_current}"
        msg = f"{dev.label}: PCIe link {state}, both ends support x{want_w:g}{where}"
        out.append(_finding(cfg, LINK, LINK_WIDTH, msg, dev))
    want_s = _lowest(dev.speed_max, up.speed_max if up else None)
    if dev.speed_current is None or want_s is None or dev.speed_current >= want_s or dev.width_current == 0:
        return out, None
    if dev.kind == "gpu":
        pstate = pstates.get(dev.address)
        if pstate != "P0":
            why = f"in {pstate}" if pstate else "performance state unknown"
            return out, f"{dev.label} at {dev.speed_current:g} of {want_s:g} GT/s {why}: not judged"
    msg = f"{dev.label}: PCIe link at {dev.speed_current:g} GT/s, both ends support {want_s:g} GT/s{where}"
    out.append(_finding(cfg, LINK, LINK_SPEED, msg, dev))
    return out, None


def check_link(facts: NodeFacts, cfg: Config) -> CheckResult:
    sample = typed_input(LINK, facts.pci, PciSample)
    if isinstance(sample, CheckResult):
        return sample
    by_addr = sample.by_address()
    judged = [
        d
        for d in sample.devices
        if d.kind in JUDGED and not d.virtual_function and not _shares_link(d, by_addr)
    ]
    if not judged:
        return CheckResult(LINK, skipped="no GPU, NVSwitch or RDMA NIC on the PCI bus")
    pstates = _pstates(facts)
    findings: list[Finding] = []
    notes: list[str] = []
    unread = [d.label for d in judged if d.width_current is None and d.speed_current is None]
    for dev in judged:
        up = by_addr.get(dev.upstream) if dev.upstream else None
        found, note = _link_findings(cfg, facts, dev, up, pstates)
        findings += found
        if note:
            notes.append(note)
    head = f"{len(judged) - len(unread)} link(s) judged"
    if unread:
        head += f"; no link attributes for {', '.join(unread[:5])}"
    if len(notes) > 2:  # an idle 8-GPU node: one line, not eight
        notes = [f"{len(notes)} GPU link(s) below top speed outside P0 or with no state known: not judged"]
    return CheckResult(LINK, findings=tuple(findings), note="; ".join([head, *notes]))


# --------------------------------------------------------------------------- AER


def _path(dev: PciDevice, by_addr: dict[str, PciDevice]) -> list[PciDevice]:
    """The device and every bridge above it: an error on a link is counted at either end."""
    out = [dev]
    seen = {dev.address}
    up = by_addr.get(dev.upstream) if dev.upstream else None
    while up is not None and up.address not in seen:
        out.append(up)
        seen.add(up.address)
        up = by_addr.get(up.upstream) if up.upstream else None
    return out


def _total(dev: PciDevice, kind: str) -> int | None:
    counters = dev.aer.get(kind)
    if counters is None:
        return None
    key = {"fatal": "TOTAL_ERR_FATAL", "nonfatal": "TOTAL_ERR_NONFATAL", "correctable": "TOTAL_ERR_COR"}[kind]
    return counters.get(key, sum(counters.values()))


def _top(dev: PciDevice, kind: str) -> str:
    named = {k: v for k, v in dev.aer.get(kind, {}).items() if v and not k.startswith("TOTAL_")}
    return ", ".join(f"{k} {v}" for k, v in sorted(named.items(), key=lambda kv: -kv[1])[:3])


def _aer_findings(cfg: Config, dev: PciDevice, prev: PciDevice | None, dt: float) -> list[Finding]:
    out = []
    fatal = _total(dev, "fatal")
    if fatal:
        detail = _top(dev, "fatal")
        msg = f"{dev.label}: {fatal} fatal PCIe error(s) this boot" + (f" ({detail})" if detail else "")
        out.append(_finding(cfg, AER, AER_FATAL, msg, dev))
    if prev is None or dt <= 0:
        return out
    for kind, rule in (("nonfatal", AER_NONFATAL), ("correctable", AER_CORRECTABLE)):
        now, before = _total(dev, kind), _total(prev, kind)
        if now is None or before is None or now <= before:
            continue  # unchanged, or reset (the device was re-enumerated)
        delta = now - before
        if kind == "correctable" and delta / dt <= CORRECTABLE_PER_SEC:
            continue
        detail = _top(dev, kind)
        msg = f"{dev.label}: {kind} PCIe errors grew by {delta} in {dt:.0f} s"
        msg += f" ({detail})" if detail else ""
        out.append(_finding(cfg, AER, rule, msg, dev))
    return out


def check_aer(facts: NodeFacts, cfg: Config) -> CheckResult:
    sample = typed_input(AER, facts.pci, PciSample)
    if isinstance(sample, CheckResult):
        return sample
    by_addr = sample.by_address()
    watched: dict[str, PciDevice] = {}
    for dev in sample.devices:
        if dev.kind in JUDGED:
            watched.update((d.address, d) for d in _path(dev, by_addr))
    if not watched:
        return CheckResult(AER, skipped="no GPU, NVSwitch or RDMA NIC on the PCI bus")
    with_aer = [d for d in watched.values() if d.aer]
    if not with_aer:
        return CheckResult(AER, skipped=f"no AER counters in sysfs for the {len(watched)} device(s) watched")
    prev = facts.pci_previous
    before = prev.by_address() if prev is not None else {}
    dt = sample.taken_at - prev.taken_at if prev is not None else 0.0
    findings = [f for d in with_aer for f in _aer_findings(cfg, d, before.get(d.address), dt)]
    notes = [f"AER counters of {len(with_aer)} device(s) and upstream port(s)"]
    if prev is None:
        notes.append("no previous sample: error rates not evaluated")
    elif dt <= 0:
        notes.append("samples not in time order: error rates not evaluated")
    return CheckResult(AER, findings=tuple(findings), note="; ".join(notes))


CHECKS = (
    CheckSpec(
        INVENTORY,
        check_inventory,
        (Input.PCI, Input.GPUS, Input.RDMA),
        "topology",
        (GPU_INVISIBLE, GPU_OFF_BUS, NVSWITCH_OFF_BUS, NIC_INVISIBLE, NIC_OFF_BUS),
    ),
    CheckSpec(LINK, check_link, (Input.PCI, Input.GPUS), "topology", (LINK_WIDTH, LINK_SPEED)),
    CheckSpec(AER, check_aer, (Input.PCI,), "topology", (AER_FATAL, AER_NONFATAL, AER_CORRECTABLE)),
)
