"""gpu.driver-taints: the taints NVIDIA's DRA driver puts on its own devices are evidence about a GPU,
judged beside ours; and `corroborate`, the pure step after the checks that joins them with our own
findings on the same GPU (one finding naming both sources where they agree, a warning naming both
where only the driver sees a fault).

What the driver writes (kubernetes-sigs/dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin/device_health.go
`healthEventToTaint`, read at bc3c4d86; feature gate `NVMLDeviceHealthCheck`, alpha since v0.4.0):
its NVML event monitor taints the device in its own ResourceSlice (`spec.devices[].taints`,
resource.k8s.io/v1), one taint per key per device, kept until its kubelet plugin restarts:
- `gpu.nvidia.com/xid`, value the decimal Xid NVML reported (EventTypeXidCriticalError), effect
  `NoSchedule`, or `None` for an Xid it deems non-fatal (13, 31, 43, 45, 68, 109 and its
  `--additional-xids-to-ignore`); a later non-fatal Xid never weakens a `NoSchedule` one;
- `gpu.nvidia.com/gpu-lost`, no value, `NoSchedule`: NVML answered GPU_IS_LOST (the event wait is
  node-wide: then every device of the node) or an event's GPU had no readable UUID;
- `gpu.nvidia.com/unmonitored`, no value, `None`: it could not register NVML events for that GPU (no
  handle, not supported, too old), so it would taint it on no fault.
The driver writes no `NoExecute` (an admin's DeviceTaintRule may add one; a hand-written slice may
carry one: both read the same here). A MIG device carries its own taints; they count for its GPU.
The agent only reads them: it never writes the driver's slice or its taints.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import replace

from agent.checks import CheckSpec, rule_finding, typed_input
from agent.config import Config
from agent.core.device_scope import PCI
from agent.core.dra import DeviceTaint, DraSlices, PublishedGpu
from agent.core.facts import Input, NodeFacts
from agent.core.findings import CheckResult, Evidence, Finding
from agent.core.gpu import GpuInventory
from agent.core.metric_labels import DriverTaintEffect, DriverTaintKey
from agent.core.pci import normalize_pci
from agent.core.probed import ProbeError
from agent.core.rules import Rule
from agent.core.severity import Severity, Status

NAME = "gpu.driver-taints"
DRIVER_SAYS = "NVIDIA's DRA driver"
SOURCE = "ResourceSlices (gpu.nvidia.com)"

XID = Rule(
    f"{NAME}.xid",
    Severity.MONITOR,
    "NVIDIA's DRA driver tainted a GPU for an Xid it deems fatal and our own checks see no fault there",
)
# Said, not judged (severity none): findings of their own names, not rules of `severities:` (every
# rule's default is a real severity); alert on them by gpu_healthcheck_driver_device_taints.
XID_NONFATAL = Rule(
    f"{NAME}.xid-nonfatal",
    Severity.NONE,
    "NVIDIA's DRA driver tainted a GPU (effect None) for an Xid it deems non-fatal (an application's)",
)
GPU_LOST = Rule(
    f"{NAME}.gpu-lost",
    Severity.MONITOR,
    "NVIDIA's DRA driver tainted a GPU gpu-lost and our own checks see no fault there",
)
UNMONITORED = Rule(
    f"{NAME}.unmonitored",
    Severity.NONE,
    "NVIDIA's DRA driver cannot health-check a GPU (our own checks still judge it)",
)
FATAL_EFFECTS = (DriverTaintEffect.EFFECT_NO_SCHEDULE, DriverTaintEffect.EFFECT_NO_EXECUTE)
EFFECT_WORDS = {
    DriverTaintEffect.EFFECT_NONE: "scheduling unaffected",
    DriverTaintEffect.EFFECT_NO_SCHEDULE: "no new claim gets that device",
    DriverTaintEffect.EFFECT_NO_EXECUTE: "pods holding that device are evicted",
}
# Our findings that say what the driver's taint says (besides any fault of ours at reset or above).
XID_VALUE = re.compile(r"/xid=(\d+):")
AGREES = {XID.name: ("xid.",), XID_NONFATAL.name: ("xid.",), GPU_LOST.name: ("gpu.responsive.",)}


def _rule(t: DeviceTaint) -> Rule | None:
    key = DriverTaintKey.of(t.key)
    if key is DriverTaintKey.DRIVER_XID:
        return XID if DriverTaintEffect.of(t.effect) in FATAL_EFFECTS else XID_NONFATAL
    if key is DriverTaintKey.DRIVER_GPU_LOST:
        return GPU_LOST
    if key is DriverTaintKey.DRIVER_UNMONITORED:
        return UNMONITORED
    return None  # a key this release does not know: shown per GPU (gpu_verdicts), not judged


def _why(rule: Rule, taints: Sequence[DeviceTaint], cfg: Config) -> str:
    """What the driver's taints of one rule on one GPU say, in words."""
    effect = EFFECT_WORDS.get(DriverTaintEffect.of(taints[0].effect), f"effect {taints[0].effect}")
    if rule is UNMONITORED:
        return (
            "it cannot health-check this GPU (it could not register NVML events for it), so it "
            "would taint it on no fault; our own checks still judge it"
        )
    if rule is GPU_LOST:
        return f"NVML told it the GPU is lost; {effect}"
    codes = sorted({t.value for t in taints})
    named = ", ".join(
        f"Xid {c} ({cfg.xid_catalog.name(int(c))})" if c.isdigit() else f"Xid {c or '?'}" for c in codes
    )
    kind = "fatal" if rule is XID else "non-fatal (an application's fault)"
    return f"{named} reported by NVML, which it deems {kind}; {effect}"


def check_driver_taints(facts: NodeFacts, cfg: Config) -> CheckResult:
    """One finding per GPU and rule of the driver's taints on its devices. A ResourceSlice read that
    failed is `skipped`, not `unknown`: the driver's taints add to our evidence, and gpu.allocatable
    owns that read's gap on a DRA-only node (a node that cannot list slices is not unknown for it)."""
    if isinstance(facts.dra, ProbeError):
        return CheckResult(NAME, skipped=f"the driver's taints not read: {facts.dra.message}")
    dra = typed_input(NAME, facts.dra, DraSlices)
    if isinstance(dra, CheckResult):
        return dra
    published = dra.gpus()
    if not published:
        return CheckResult(NAME, skipped=f"{DRIVER_SAYS} publishes no device for this node")
    inv = facts.gpus if isinstance(facts.gpus, GpuInventory) else None
    findings: list[Finding] = []
    for p in published:
        by_rule: dict[str, tuple[Rule, list[tuple[str, DeviceTaint]]]] = {}
        for device, t in p.taints:
            rule = _rule(t)
            if rule is not None:
                by_rule.setdefault(rule.name, (rule, []))[1].append((device, t))
        for rule, tainted in by_rule.values():
            findings.append(_finding(cfg, rule, p, tainted, inv))
    tainted_gpus = sum(1 for p in published if p.taints)
    note = (
        f"{DRIVER_SAYS} taints none of the {len(published)} GPU(s) it publishes"
        if not tainted_gpus
        else f"{DRIVER_SAYS} taints {tainted_gpus} of its {len(published)} GPU(s)"
    )
    return CheckResult(NAME, findings=tuple(findings), note=note)


def _label(p: PublishedGpu, inv: GpuInventory | None) -> str:
    """The GPU as our other findings name it ("GPU 2 (0000:75:00.0)"), else as the driver does."""
    if inv is not None:
        for g in inv.gpus:
            if (p.pci and normalize_pci(g.pci_bus_id) == p.pci) or (p.uuid and g.uuid == p.uuid):
                return g.label
    return p.label


def _finding(
    cfg: Config,
    rule: Rule,
    p: PublishedGpu,
    tainted: Sequence[tuple[str, DeviceTaint]],
    inv: GpuInventory | None,
) -> Finding:
    devices = sorted({d for d, _ in tainted})
    texts = sorted({t.text for _, t in tainted})
    label = _label(p, inv)
    message = (
        f"{label}: {DRIVER_SAYS} taints {'/'.join(devices)} {', '.join(texts)}: "
        f"{_why(rule, [t for _, t in tainted], cfg)}"
    )
    evidence = tuple(Evidence(SOURCE, None, f"{d}: {t.text}") for d, t in tainted)
    key = p.pci or p.uuid or p.label
    return rule_finding(cfg, NAME, rule, message, (label,), key, evidence)


def _pcis(finding: Finding) -> set[str]:
    texts = (finding.key, *finding.entities)
    return {normalize_pci(m.group(1) + (m.group(2) or ".0")) for t in texts for m in PCI.finditer(t)}


def corroborate(results: Iterable[CheckResult]) -> list[CheckResult]:
    """Pure, after the checks (engine.evaluate, `check`): each finding of the driver's taints on a GPU
    (an Xid, gpu-lost) that one of our own findings on that GPU agrees with (our Xid of the same
    number, whatever our catalog makes of it; else one of our Xids or our lost or hung GPU at least
    as severe, or any fault of ours there at `reset` or above) becomes part of ours: our
    finding's message gains the driver's word, and the driver's finding goes. One that no finding of
    ours agrees with stays, its message saying that our own checks see nothing wrong there (and why
    they might not: our Xid check could not look). `unmonitored` stays as it is."""
    results = list(results)
    at = next((i for i, r in enumerate(results) if r.name == NAME and r.findings), None)
    if at is None:
        return results
    ours = [(i, j, f) for i, r in enumerate(results) if i != at for j, f in enumerate(r.findings)]
    xid_gap = next(
        (r for r in results if r.name == "xid" and r.status in (Status.UNKNOWN, Status.SKIPPED)), None
    )
    merged: dict[tuple[int, int], Finding] = {}
    kept: list[Finding] = []
    joined = 0
    for f in results[at].findings:
        if f.rule not in AGREES:
            kept.append(f)
            continue
        here = _pcis(f)
        on_gpu = [(i, j, g) for i, j, g in ours if here and _pcis(g) & here]
        codes = _xids(f)
        same = [x for x in on_gpu if any(x[2].key.startswith(f"xid/{c}/") for c in codes)]
        agree = same or [x for x in on_gpu if _agrees(f, x[2])]
        if agree:
            i, j, g = max(agree, key=lambda x: x[2].severity)
            g = merged.get((i, j), g)
            merged[(i, j)] = replace(g, message=f"{g.message}; {DRIVER_SAYS} agrees: {_taint_words(f)}")
            joined += 1
            continue
        seen = sorted({g.key or g.rule for _, _, g in on_gpu if g.severity > Severity.NONE})
        words = (
            f"our own checks find no fault on it (only {', '.join(seen)})"
            if seen
            else ("our own checks find nothing wrong with it")
        )
        if xid_gap is not None and f.rule in (XID.name, XID_NONFATAL.name):
            words += f" (our xid check could not look: {xid_gap.message})"
        kept.append(replace(f, message=f"{f.message}; {words}"))
    out = []
    for i, r in enumerate(results):
        if i == at:
            note = r.note + (f"; {joined} agree with our own findings (named there)" if joined else "")
            out.append(replace(r, findings=tuple(kept), note=note))
        elif any(k[0] == i for k in merged):
            findings = tuple(merged.get((i, j), g) for j, g in enumerate(r.findings))
            out.append(replace(r, findings=findings))
        else:
            out.append(r)
    return out


def _agrees(driver: Finding, ours: Finding) -> bool:
    """Our finding says what the driver's says: a fault of ours at `reset` or above on that GPU, or
    one of the same kind (an Xid; a lost or hung GPU) at least as severe."""
    if ours.severity >= Severity.RESET:
        return True
    kind = ours.rule.startswith(AGREES[driver.rule])
    return kind and ours.severity > Severity.NONE and ours.severity >= driver.severity


def _xids(f: Finding) -> set[str]:
    """The Xid numbers of the driver's taints a finding rests on (its evidence: `gpu-2: …/xid=48:…`)."""
    return {m.group(1) for e in f.evidence for m in XID_VALUE.finditer(e.text)}


def _taint_words(f: Finding) -> str:
    """ "it taints gpu-2 gpu.nvidia.com/xid=48:NoSchedule" from a finding of the driver's taints."""
    return "it taints " + ", ".join(e.text.replace(": ", " ", 1) for e in f.evidence)


CHECKS = (
    CheckSpec(
        NAME,
        check_driver_taints,
        (Input.GPUS, Input.DRA),
        "gpu",
        (XID, GPU_LOST),
    ),
)
