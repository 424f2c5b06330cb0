"""What a reboot did not fix: a short history, kept on the Node, of which failing finding was seen on
which GPU in which boot, so that a fault that comes back after N reboots escalates to `isolate`.

A reboot clears the latches (the Xid is gone from the new boot's kernel log) and the driver state,
which fixes most faults; one that returns on the same GPU after `node.escalateAfterReboots` reboots
will not be fixed by another. The GPU is named by its serial (else UUID) so that a replaced board
starts a new history. The history lives in the results annotation (restored after an agent restart,
across boots), is bounded (MAX_ENTRIES, and boots per entry), and an operator's clear of a latch
clears its history too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agent.core.actions import Action
from agent.core.findings import CheckResult, Finding
from agent.core.gpu import GpuInventory
from agent.core.pci import normalize_pci
from agent.core.results_doc import HISTORY_FIELD
from agent.core.severity import Severity
from agent.engine.gpu_verdicts import finding_pcis

MAX_ENTRIES = 32


@dataclass(frozen=True)
class Seen:
    """One failing finding (by rule and key) on one GPU (serial/UUID), and the boots it was seen in."""

    rule: str
    key: str
    gpu: str  # serial, else UUID, else PCI address; "" for a node-level finding
    boots: tuple[str, ...]

    @property
    def ident(self) -> tuple[str, str]:
        return (self.rule, self.gpu or self.key)

    def as_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "key": self.key, "gpu": self.gpu, "boots": list(self.boots)}


def parse(doc: Any) -> dict[tuple[str, str], Seen]:
    """The history of a results annotation (entries that do not parse are dropped)."""
    out: dict[tuple[str, str], Seen] = {}
    for item in (doc or {}).get(HISTORY_FIELD) or () if isinstance(doc, dict) else ():
        try:
            seen = Seen(
                str(item["rule"]),
                str(item["key"]),
                str(item.get("gpu") or ""),
                tuple(map(str, item["boots"])),
            )
        except (KeyError, TypeError):
            continue
        out[seen.ident] = seen
    return out


def _gpu_names(gpus: Any) -> dict[str, str]:
    """normalised PCI -> the GPU's lasting name (serial, else UUID, else the PCI address)."""
    if not isinstance(gpus, GpuInventory):
        return {}
    names = {normalize_pci(g.pci_bus_id): g.lasting_name for g in gpus.gpus}
    names.update({pci: pci for pci in gpus.silent})
    return names


def _gpu_of(finding: Finding, names: Mapping[str, str]) -> str:
    found = sorted(names[p] for p in finding_pcis(finding) if p in names)
    return found[0] if found else ""


def record(
    history: Mapping[tuple[str, str], Seen],
    results: Iterable[CheckResult],
    boot: str | None,
    gpus: Any,
    keep_boots: int,
) -> dict[tuple[str, str], Seen]:
    """Pure: the history with this boot added to every failing finding seen now (bounded)."""
    out = dict(history)
    if not boot:
        return out
    names: dict[str, str] | None = None  # worked out for the first failing finding only
    for res in results:
        for f in res.findings:
            if f.severity < Severity.RESET:
                continue
            names = _gpu_names(gpus) if names is None else names
            gpu = _gpu_of(f, names)
            ident = (f.rule, gpu or f.key)
            old = out.get(ident)
            boots = old.boots if old else ()
            if boot not in boots:
                out[ident] = Seen(f.rule, f.key, gpu, (*boots, boot)[-max(keep_boots, 1) :])
    while len(out) > MAX_ENTRIES:  # forget the entry whose last boot is the oldest
        order = {b: i for i, b in enumerate(dict.fromkeys(b for s in out.values() for b in s.boots))}
        del out[min(out, key=lambda k: order.get(out[k].boots[-1], -1))]
    return out


def escalate(
    results: Sequence[CheckResult],
    history: Mapping[tuple[str, str], Seen],
    gpus: Any,
    after_reboots: int,
) -> list[CheckResult]:
    """Pure: findings seen in more than *after_reboots* boots on the same GPU become `isolate`,
    "came back after N reboots"; 0 turns it off."""
    if after_reboots <= 0:
        return list(results)
    names = _gpu_names(gpus) if history else {}
    out = []
    for res in results:
        findings = []
        for f in res.findings:
            seen = history.get((f.rule, _gpu_of(f, names) or f.key)) if f.severity >= Severity.RESET else None
            reboots = len(seen.boots) - 1 if seen else 0
            if seen is not None and reboots >= after_reboots and f.severity < Severity.ISOLATE:
                f = replace(
                    f,
                    severity=Severity.ISOLATE,
                    message=f"{f.message} (came back after {reboots} reboots)",
                    action=Action.SERVICE,
                )
            findings.append(f)
        # The result itself when nothing came back: what it worked out once (status, message) stays.
        changed = any(a is not b for a, b in zip(findings, res.findings, strict=True))
        out.append(replace(res, findings=tuple(findings)) if changed else res)
    return out


def forget(history: Mapping[tuple[str, str], Seen], keys: Iterable[str]) -> dict[tuple[str, str], Seen]:
    """The history without the entries of these finding keys (an operator cleared their latches)."""
    drop = set(keys)
    return {k: v for k, v in history.items() if v.key not in drop}
