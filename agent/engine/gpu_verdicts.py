"""A verdict per GPU, for the results annotation: "GPU 3 of this node is broken, these pods run on it".

A scheduler extension, a dashboard or a person reads the node's GPUs one by one: index, UUID, PCI
address, the DRA device that publishes it (`gpu-3`, where NVIDIA's DRA driver runs), status and
severity, the keys of the findings on it, the next step, its warnings before a fault (by their own
step: rule → rate; not repeated among the keys), and — only for a GPU
with a finding, so that pods coming and going on healthy GPUs never cause a write — the containers
the kubelet says hold it. A finding belongs to the GPUs whose PCI address its key or entities name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from agent.core.dra import DraSlices
from agent.core.findings import CheckResult, Finding
from agent.core.gpu import GpuInventory
from agent.core.pci import normalize_pci, short_pci
from agent.core.severity import Severity, Status
from agent.core.trend_history import CHECK_PREFIX

PCI = re.compile(r"\b([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(\.[0-7])?\b")
MAX_PODS = 8  # per GPU in the annotation; the rest counted

Holders = Callable[[], Mapping[int, Sequence[str]]]


def _pcis(texts: Iterable[str]) -> set[str]:
    """Every PCI address in the texts, normalised ("PCI:0000:97:00" of an Xid line is function 0)."""
    return {normalize_pci(m.group(1) + (m.group(2) or ".0")) for t in texts for m in PCI.finditer(t)}


def finding_pcis(finding: Finding) -> set[str]:
    """The normalised PCI addresses a finding names in its key or entities."""
    return _pcis((finding.key, *finding.entities))


def findings_by_gpu(results: Iterable[CheckResult], by_pci: Mapping[str, int]) -> dict[int, list[Finding]]:
    """Pure: GPU index -> the findings (severity above none) that name its PCI address."""
    out: dict[int, list[Finding]] = {}
    for res in results:
        for f in res.findings:
            if f.severity <= Severity.NONE:
                continue
            for pci in _pcis((f.key, *f.entities)):
                if pci in by_pci:
                    out.setdefault(by_pci[pci], []).append(f)
    return out


def _status(severity: Severity, node_status: Status) -> Status:
    if severity >= Severity.RESET:
        return Status.FAIL
    if node_status is Status.UNKNOWN:
        return Status.UNKNOWN  # no finding on it, but the node could not be fully looked at
    return Status.WARN if severity == Severity.MONITOR else Status.PASS


def dra_fields(dra: Any, pci: str | None, uuid: str | None) -> dict[str, Any]:
    """Where NVIDIA's DRA driver publishes this GPU (*dra*: the DraSlices read, or why not): `dra`,
    its device for the whole GPU (`gpu-3`), `draPartitions`, its MIG devices, and `driverTaints`,
    the driver's own taints on them (`gpu.nvidia.com/xid=48:NoSchedule`, checks/dra_taints.py), only
    where it has some; {} where the driver does not publish it (or was not read)."""
    if not isinstance(dra, DraSlices):
        return {}
    p = dra.published(pci, uuid)
    if p is None:
        return {}
    out: dict[str, Any] = {"dra": p.device} if p.device else {}
    out.update({"draPartitions": p.partitions} if p.partitions else {})
    return {**out, "driverTaints": p.taint_texts()} if p.taints else out


def gpu_verdicts(
    results: Sequence[CheckResult],
    gpus: Any,
    node_status: Status,
    holders: Holders | None = None,
    dra: Any = None,
) -> list[dict[str, Any]]:
    """Pure but for *holders* (asked only when a GPU has a finding): one entry per GPU of the last
    inventory, in index order; [] when the inventory could not be read. *dra*: the DRA driver's
    devices (DraSlices), to name each GPU's device beside its PCI address and UUID."""
    if not isinstance(gpus, GpuInventory):
        return []
    by_pci = {normalize_pci(g.pci_bus_id): g.index for g in gpus.gpus}
    by_pci.update({normalize_pci(h.pci_bus_id): h.index for h in gpus.hung if h.pci_bus_id})
    # GPUs the driver lists but cannot talk to have no index: numbered after the others here
    lost = [normalize_pci(x.pci_bus_id) for x in gpus.lost if x.pci_bus_id]
    lost_ids = {pci: -1 - i for i, pci in enumerate(lost)}
    hits = findings_by_gpu(results, {**by_pci, **lost_ids})
    pods: Mapping[int, Sequence[str]] = {}
    if hits and holders is not None:
        try:
            pods = holders()
        except Exception:  # naming pods is a courtesy: the verdict stands without them
            pods = {}
    out = []
    # A GPU whose calls hang is in index order with the others: `unknown` until its finding fails.
    answered = [(g.index, g.uuid, g.pci_bus_id, False) for g in gpus.gpus]
    hung = [(h.index, h.uuid, h.pci_bus_id, True) for h in gpus.hung]
    for index, uuid, pci, silent in sorted(answered + hung, key=lambda e: e[0]):
        found = hits.get(index, [])
        worst = max(found, key=lambda f: f.severity, default=None)
        severity = worst.severity if worst else Severity.NONE
        status = _status(severity, node_status)
        entry: dict[str, Any] = {
            "index": index,
            "uuid": uuid,
            "pci": short_pci(pci) if pci else None,
            **dra_fields(dra, pci, uuid),
        }
        if silent:
            entry["hung"] = True
            status = status if status is Status.FAIL else Status.UNKNOWN
        entry.update(status=status.value, severity=severity.label)
        if worst is not None:
            keys = sorted({f.key or f.rule for f in found if not is_trend(f)})
            if keys:
                entry["findings"] = keys
            entry.update(worst.recommendation.as_dict())
            warned = warnings(found)
            if warned:
                entry["warnings"] = warned
            held = list(pods.get(index, ()))
            if held:
                entry["pods"] = held[:MAX_PODS] + (
                    [f"+{len(held) - MAX_PODS} more"] if len(held) > MAX_PODS else []
                )
        out.append(entry)
    for pci, key in lost_ids.items():
        found = hits.get(key, [])
        worst = max(found, key=lambda f: f.severity, default=None)
        entry = {
            "index": None,
            "uuid": None,
            "pci": short_pci(pci),
            **dra_fields(dra, pci, None),
            "lost": True,
            "status": Status.FAIL.value,
        }
        entry["severity"] = (worst.severity if worst else Severity.NONE).label
        if worst is not None:
            entry["findings"] = sorted({f.key or f.rule for f in found})
            entry.update(worst.recommendation.as_dict())
        out.append(entry)
    return out


def is_trend(f: Finding) -> bool:
    return f.check.startswith(CHECK_PREFIX)


def warnings(found: Iterable[Finding]) -> dict[str, dict[str, str]]:
    """A GPU's warnings before a fault (checks/trends.py) by their own next step, then rule → rate:
    {"plan-service": {"trend.memory.remap-headroom": "2 bank(s) low"}, "watch": {...}}. Compact:
    8 GPUs with every warning fit the annotation (its keys would repeat the GPU's address)."""
    out: dict[str, dict[str, str]] = {}
    for f in sorted((f for f in found if is_trend(f)), key=lambda f: f.rule):
        out.setdefault(f.recommendation.action.value, {})[f.rule] = f.rate
    return dict(sorted(out.items()))


def pods_text(entries: Sequence[Mapping[str, Any]], *names: str) -> str:
    """ "; pods: ns/pod/ctr, …" for the GPUs a finding's key or entities name (empty when none
    hold one)."""
    named = _pcis(names)
    held = [p for e in entries if normalize_pci(str(e.get("pci", ""))) in named for p in e.get("pods", ())]
    return f"; pods: {', '.join(held)}" if held else ""
