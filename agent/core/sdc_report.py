"""The SDC probe's report as the agent reads it, and who it shows to be odd (docs/guides/odd-gpu-out.md).

The probe (sdcprobe/, its own image) runs the same deterministic computation on every GPU of an idle
node and reports, per attempt, the SHA-256 of each GPU's output per kernel and precision. One GPU
model on one software stack must give the same bytes for the same inputs, so a GPU whose digest is
not its siblings' majority computed a wrong answer. The majority is judged here from the digests
(the probe's own `differed` is for a reader): of at least MIN_PEERS GPUs that ran a kernel, more
than half agreeing. Without one (two GPUs, a split, every GPU different) nobody can be named: that
key is undecided, never a fault. A GPU that differs on the first attempt only is a mismatch once
(a warning); on both (the immediate re-run with the same inputs) a repeated one (the GPU fails).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.core.peers import MIN_PEERS
from agent.core.probed import ParseError

REPORT_VERSION = 1  # sdcprobe.REPORT_VERSION: the report schema this agent reads


@dataclass(frozen=True)
class SdcDevice:
    index: str  # the probe's device index, as its digests are keyed
    uuid: str
    pci_bus_id: str
    name: str


@dataclass(frozen=True)
class SdcAttempt:
    number: int
    digests: Mapping[str, Mapping[str, str]]  # device index → "kernel/precision" → SHA-256
    errors: Mapping[str, str]  # device index → why it could not run


@dataclass(frozen=True)
class SdcReport:
    devices: tuple[SdcDevice, ...]
    attempts: tuple[SdcAttempt, ...]
    started_at: str
    backend: str = ""
    seconds: float | None = None
    source: str = "sdc probe"
    kept: str = ""  # a later run was aborted for work: why (this completed run's verdict stands)


@dataclass(frozen=True)
class SdcVerdict:
    once: dict[str, tuple[str, ...]] = field(default_factory=dict)  # device → keys, attempt 1 only
    repeated: dict[str, tuple[str, ...]] = field(default_factory=dict)  # device → keys, both attempts
    undecided: tuple[str, ...] = ()  # keys with a disagreement and no majority
    errors: dict[str, str] = field(default_factory=dict)  # device → its error (last attempt's first)
    peers: dict[str, int] = field(default_factory=dict)  # device → how many siblings it was compared with


def parse_sdc_report(text: str, source: str = "sdc probe") -> SdcReport:
    """The probe's JSON; ParseError when it is not a report of a version this agent reads."""
    try:
        return report_from_doc(json.loads(text), source)
    except ParseError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ParseError(f"not an SDC probe report: {type(exc).__name__}: {exc}") from exc


def report_from_doc(doc: Any, source: str = "sdc probe") -> SdcReport:
    if not isinstance(doc, dict) or doc.get("version") != REPORT_VERSION:
        found = doc.get("version") if isinstance(doc, dict) else type(doc).__name__
        raise ParseError(f"not an SDC probe report of version {REPORT_VERSION} (version {found!r})")
    devices = tuple(
        SdcDevice(
            str(d["index"]), str(d.get("uuid") or ""), str(d.get("pciBusId") or ""), str(d.get("name") or "")
        )
        for d in doc["devices"]
    )
    attempts = tuple(
        SdcAttempt(
            int(a["attempt"]),
            {str(dev): {str(k): str(v) for k, v in ds.items()} for dev, ds in a["digests"].items()},
            {str(dev): str(e) for dev, e in (a.get("errors") or {}).items()},
        )
        for a in doc["attempts"]
    )
    if not attempts:
        raise ParseError("an SDC probe report without an attempt")
    seconds = doc.get("seconds")
    return SdcReport(
        devices,
        attempts,
        str(doc.get("startedAt") or ""),
        str(doc.get("backend") or ""),
        float(seconds) if isinstance(seconds, (int, float)) else None,
        source,
    )


def odd_ones(
    digests: Mapping[str, Mapping[str, str]],
) -> tuple[dict[str, set[str]], set[str], dict[str, int]]:
    """(device → keys where its digest is not the majority's, the keys that disagree with no
    majority, device → the most siblings it was compared with)."""
    odd: dict[str, set[str]] = {}
    undecided: set[str] = set()
    peers: dict[str, int] = {}
    for key in sorted({k for d in digests.values() for k in d}):
        seen = {dev: d[key] for dev, d in digests.items() if key in d}
        for dev in seen:
            peers[dev] = max(peers.get(dev, 0), len(seen) - 1)
        top, n = Counter(seen.values()).most_common(1)[0]
        if n == len(seen):
            continue
        if len(seen) < MIN_PEERS or n * 2 <= len(seen):
            undecided.add(key)
            continue
        for dev, digest in seen.items():
            if digest != top:
                odd.setdefault(dev, set()).add(key)
    return odd, undecided, peers


def judge(report: SdcReport) -> SdcVerdict:
    """Who computed a wrong answer once, who on both attempts, and what could not be decided."""
    first = report.attempts[0]
    odd1, undecided, peers = odd_ones(first.digests)
    odd2: dict[str, set[str]] = {}
    if len(report.attempts) > 1:
        odd2, und2, _ = odd_ones(report.attempts[1].digests)
        undecided |= und2
    repeated = {d: tuple(sorted(odd1[d] | odd2[d])) for d in odd1 if d in odd2}
    once = {d: tuple(sorted(keys)) for d, keys in {**odd2, **odd1}.items() if d not in repeated}
    errors: dict[str, str] = {}
    for attempt in report.attempts:
        for dev, err in attempt.errors.items():
            errors.setdefault(dev, err)
    return SdcVerdict(once, repeated, tuple(sorted(undecided)), errors, peers)


__all__ = [
    "REPORT_VERSION",
    "SdcAttempt",
    "SdcDevice",
    "SdcReport",
    "SdcVerdict",
    "judge",
    "odd_ones",
    "parse_sdc_report",
    "report_from_doc",
]
