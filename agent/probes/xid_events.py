"""Kernel log records → Xid / SXid events. Every matching line is one event; the xid check de-duplicates.

Recognised lines (anywhere in the record text):
- ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.`` (also ``(PCI:0000:3b:00.0)`` and
  the older ``(0000:3b:00)``), including Blackwell NVLink 144–150 sub-code lines;
- Xid 154 ``... GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)``: the text in the
  last parentheses becomes ``recovery_action``;
- "fallen off the bus" lines without an Xid number (``NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.``,
  ``NVRM: The NVIDIA GPU 0000:3b:00.0 ... has fallen off the bus``) → code 79: some drivers print only these;
- NVSwitch ``nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, ...`` → ``sxid=True``.

Multi-line GSP banners (``NVRM: _kgspLogXid119: *** GSP Timeout ***``, RPC history rows) carry no
``Xid (<pci>): <code>`` and produce nothing.
"""

from __future__ import annotations

import re

from agent.core.model import KernelLog, KernelRecord, XidEvent, normalize_pci

_XID = re.compile(r"NVRM:\s*(Xid \(([^)]*)\):\s*(\d+)\b.*)$")
_SXID = re.compile(r"(?:^|\s|:)(SXid \(([^)]*)\):\s*(\d+)\b.*)$")
_NVRM = re.compile(r"NVRM:\s*(.*)$")
_PCI = re.compile(r"\b(?:PCI:)?((?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\b")
_LAST_PARENS = re.compile(r"\(([^()]*)\)[^()]*$")
_FALLEN_OFF = "fallen off the bus"


def _pci(text: str) -> str | None:
    m = _PCI.search(text)
    if m is None:
        return None
    norm = normalize_pci(m.group(1))
    return norm if re.fullmatch(r"[0-9a-f]{8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", norm) else None


def _event(
    rec: KernelRecord,
    code: int,
    pci: str | None,
    message: str,
    sxid: bool = False,
    recovery_action: str | None = None,
) -> XidEvent:
    return XidEvent(
        code=code,
        pci=pci,
        message=message.strip(),
        sxid=sxid,
        recovery_action=recovery_action,
        seq=rec.seq,
        ts_us=rec.ts_us,
        wallclock=rec.wallclock,
    )


def _from_record(rec: KernelRecord) -> XidEvent | None:
    text = rec.message
    if "Xid" not in text and _FALLEN_OFF not in text:
        return None
    m = _XID.search(text)
    if m:
        code = int(m.group(3))
        action = None
        if code == 154:
            pm = _LAST_PARENS.search(m.group(1))
            action = pm.group(1).strip() if pm else None
        return _event(rec, code, _pci(m.group(2)), m.group(1), recovery_action=action)
    m = _SXID.search(text)
    if m:
        prefix = text[: m.start(1)].strip()
        message = f"{prefix} {m.group(1)}" if prefix else m.group(1)
        return _event(rec, int(m.group(3)), _pci(m.group(2)), message, sxid=True)
    if _FALLEN_OFF in text:
        n = _NVRM.search(text)
        if n:
            return _event(rec, 79, _pci(n.group(1)), n.group(1))
    return None


def extract_xids(log: KernelLog) -> list[XidEvent]:
    """Every Xid/SXid event in the log, in log order (no de-duplication)."""
    events: list[XidEvent] = []
    for rec in log.records:
        ev = _from_record(rec)
        if ev is not None:
            events.append(ev)
    return events
