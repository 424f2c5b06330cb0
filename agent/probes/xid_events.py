"""Kernel log records → Xid / SXid / PCIe AER events, one record at a time with O(1) context.

Recognised lines (anywhere in the record text):
- ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.`` (also ``(PCI:0000:3b:00.0)`` and
  the older ``(0000:3b:00)``), including Blackwell NVLink 144–150 sub-code lines;
- Xid 154 ``... GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)``: the text in the
  last parentheses becomes ``recovery_action``;
- "fallen off the bus" lines without an Xid number (``NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.``)
  → code 79: some drivers print only these. The driver also prints one record over three lines
  (``NVRM: The NVIDIA GPU 0000:3b:00.0`` / ``NVRM: (PCI ID: 10de:2330) installed in this system has`` /
  ``NVRM: fallen off the bus and is not responding to commands.``): the address of the first line is
  carried to the third, so a dmesg or journal capture still gives one Xid 79 on that GPU;
- Blackwell NVLink5 (144-150) ``149, NETIR_LINK_EVT  Fatal  XC0 i0 Link 09 (...)``: the sub-code unit and
  the driver's Fatal / Link Fatal / Nonfatal; a Fatal one is ``variant="fatal"`` (its own finding);
- NVSwitch ``nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, ...`` → ``sxid=True``;
- PCIe AER ``Uncorrected (Fatal)``, ``can't recover``, ``device recovery failed`` → ``aer=True`` (code 0)
  on the device the line names (``error received: <bdf>`` names the source; else the line's own device);
- the devices the ``nvidia`` driver prints lines about (``nvidia 0000:03:00.0: ...``) are kept in
  ``XidReader.nvidia``: they are GPUs, even where no inventory says so;
- the driver's consequence lines ``45, pid=..., Ch 00000001 caused by previous Xid 149`` → ``cause=149``.

Multi-line GSP banners (``NVRM: _kgspLogXid119: *** GSP Timeout ***``, RPC history rows) carry no
``Xid (<pci>): <code>`` and produce nothing.
"""

from __future__ import annotations

import re
from functools import lru_cache

from agent.core.kernel import KernelLog, KernelRecord, XidEvent
from agent.core.pci import normalize_pci

_XID = re.compile(r"NVRM:\s*(Xid \(([^)]*)\):\s*(\d+)\b.*)$")
_SXID = re.compile(r"(?:^|\s|:)(SXid \(([^)]*)\):\s*(\d+)\b.*)$")
_NVRM = re.compile(r"NVRM:\s*(.*)$")
_PCI = re.compile(r"\b(?:PCI:)?((?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\b")
_FULL_PCI = re.compile(r"[0-9a-f]{8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_LAST_PARENS = re.compile(r"\(([^()]*)\)[^()]*$")
_FALLEN_OFF = "fallen off the bus"
_GPU_HEADER = re.compile(r"NVRM:\s*The NVIDIA GPU\s+(\S+)")  # first line of the three-line record
_HEADER_REACH = 3  # records: the header, "(PCI ID: ...) installed in this system has", "fallen off ..."
_AER_LINE = re.compile(
    r"^(?:(\S+)\s+)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]):?\s+AER:\s*(.*)$"
)
# The kernel's device prefix of a line the nvidia driver prints ("nvidia 0000:19:00.0: ..."): that
# device is a GPU, whatever inventory there is (none in an excerpt).
_NVIDIA_DEVICE = re.compile(r"^nvidia ([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]):")
MAX_NVIDIA_DEVICES = 64  # GPUs of one node; bounded whatever the log holds
_AER_SOURCE = re.compile(  # the port names the device that sent it (kernels < 6.x, then 6.x wording)
    r"(?:error received:|error message received from)\s*(?:id=)?"
    r"([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])"
)
_NVLINK5 = re.compile(
    r"\s*(\w+)\s+(Link Fatal|Fatal|Nonfatal|Non-fatal)\b"
)  # "149, NETIR_LINK_EVT  Fatal  XC0"
_NVLINK5_REGS = re.compile(
    r"\((0x[0-9a-fA-F]+)\s+(0x[0-9a-fA-F]+)"
)  # "(0x025525c6 0x00000000": IntrInfo, status
_CAUSE = re.compile(r"\bcaused by previous Xid\s+(\d+)\s*$")  # the driver's root cause of an Xid 45
_CAUSED_BY = "caused by previous Xid"  # what _CAUSE needs in a line, looked for first
_ACTION_WRAP = re.compile(r"^\s*from 0x[0-9a-fA-F]+ \([^()]*\) to 0x[0-9a-fA-F]+ \(([^()]*)\)")
_AER_FATAL = ("Uncorrected (Fatal)", "can't recover", "device recovery failed", "Uncorrectable (Fatal)")
_NVLINK5_CLOSED = re.compile(r"\(0x[0-9a-fA-F]+(?:\s+0x[0-9a-fA-F]+)*\s*\)")  # the whole register list
_ACTION_CLOSED = re.compile(r"\bto 0x[0-9a-fA-F]+ \([^()]*\)\s*$")  # "... to 0x1 (GPU Reset Required)"
# A text's head, up to its code's comma ("NVRM: Xid (PCI:0000:53:00): 13,"): _XID read from the
# start of a text that begins with it gives this device and code whatever follows.
_HEAD = re.compile(r"NVRM:\s*(Xid \(([^)]*)\):\s*(\d+)),")


def whole(text: str) -> bool:
    """Whether a kernel line that ends a capture without its newline says all it has to say, by the
    driver's and the kernel's grammar: an Xid's code followed by its comma ("4" may be "48"), an
    NVLink5 line with its closed register list, an Xid 154 with its closed "to 0x.. (action)", a
    cascade's cause not at the very end ("Xid 14" may be "Xid 149"), an AER source address in full.
    A line that reads as no event at all is whole: nothing on it is read."""
    if "Xid" in text:
        m = _XID.search(text)
        sxid = m is None
        m = m or _SXID.search(text)
        if m is not None:
            if text[m.end(3) : m.end(3) + 1] != ",":
                return False
            code = int(m.group(3))
            if sxid:
                return True
            if 144 <= code <= 150:
                return _NVLINK5_CLOSED.search(text, m.end(3)) is not None
            if code == 154:
                return _ACTION_CLOSED.search(text) is not None
            return _CAUSE.search(text) is None
    if "AER" in text and ("error received:" in text or "error message received from" in text):
        return _AER_SOURCE.search(text) is not None
    return True


@lru_cache(maxsize=1024)  # a storm repeats a handful of addresses; bounded whatever the log holds
def _pci(text: str) -> str | None:
    m = _PCI.search(text)
    if m is None:
        return None
    norm = normalize_pci(m.group(1))
    return norm if _FULL_PCI.fullmatch(norm) else None


def _event(
    rec: KernelRecord,
    code: int,
    pci: str | None,
    message: str,
    sxid: bool = False,
    recovery_action: str | None = None,
    aer: bool = False,
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
        aer=aer,
    )


MEMO_SIZE = 512
HEADS_SIZE = 1024  # heads of texts (one per device and code in a storm); bounded whatever the log holds


class XidReader:
    """Records in, events out. The only context kept is the last GPU header line (O(1)).

    memo=True (the agent's tail): a line whose text was seen before gives the event parsed then, its
    seq and stamps those of that earlier line (a storm repeats a few texts thousands of times; the
    ledger takes each line's time from its record). Bounded: cleared when MEMO_SIZE texts are held."""

    def __init__(self, memo: bool = False) -> None:
        self.header_pci: str | None = None
        self.since_header = _HEADER_REACH
        self.open_154: XidEvent | None = None  # an Xid 154 whose line ended before its action
        self.memo: dict[str, XidEvent] | None = {} if memo else None
        self.nvidia: dict[str, None] = {}  # devices the nvidia driver printed a line about (ordered set)
        self.heads: dict[str, tuple[int, str | None, int] | None] = {}  # known(): code, device, offset

    def reset(self) -> None:
        self.header_pci, self.since_header = None, _HEADER_REACH
        self.nvidia.clear()
        if self.memo is not None:
            self.memo.clear()

    def _learn_nvidia(self, bdf: str) -> None:
        pci = _pci(bdf)
        if pci is not None and pci not in self.nvidia and len(self.nvidia) < MAX_NVIDIA_DEVICES:
            self.nvidia[pci] = None

    def _aer(self, rec: KernelRecord) -> XidEvent | None:
        text = rec.message
        m = _AER_LINE.search(text)
        if m is None:
            return None
        if m.group(1) == "nvidia":
            self._learn_nvidia(m.group(2))
        if not any(f in text for f in _AER_FATAL):
            return None
        src = _AER_SOURCE.search(text)
        pci = _pci(src.group(1) if src else m.group(2))
        return _event(rec, 0, pci, text, aer=True)

    def feed(self, rec: KernelRecord) -> XidEvent | None:
        memo = self.memo
        if memo is None:
            return self._feed(rec)
        hit = memo.get(rec.message)
        if hit is not None:
            self.since_header += 1
            return hit
        ev = self._feed(rec)
        if ev is not None and (ev.sxid or ev.message.startswith("Xid")) and self.open_154 is None:
            if len(memo) >= MEMO_SIZE:
                memo.clear()
            memo[rec.message] = ev
        return ev

    def known(self, text: str, wallclock: str) -> XidEvent | None:
        """What feed() gives for a new, undamaged text of a wall-clock-stamped record (no kmsg
        sequence or time) without its parse, where the text's head (up to its code's comma) says
        it all: a plain numbered Xid (not 144-150 or 154), no AER and no "caused by previous Xid"
        in it, no Xid 154 open before it. Memoized as feed() memoizes it; None when feed() must
        read it (nothing changed then). A storm whose every line has its own pid or address is
        such texts, a few heads over and over. The caller counts the line (since_header)."""
        memo = self.memo
        if memo is None or self.open_154 is not None or "AER" in text or _CAUSED_BY in text:
            return None
        head = text[: text.find(",") + 1]
        try:
            found = self.heads[head]
        except KeyError:
            found = self._head(head)
        if found is None:
            return None
        code, pci, start = found
        ev = XidEvent(code, pci, text[start:].strip(), False, None, None, None, wallclock)
        if len(memo) >= MEMO_SIZE:
            memo.clear()
        memo[text] = ev
        return ev

    def _head(self, head: str) -> tuple[int, str | None, int] | None:
        m = _HEAD.fullmatch(head)
        code = int(m.group(3)) if m is not None else 0
        plain = m is not None and code != 154 and not 144 <= code <= 150  # no action, variant or subcode
        found = (code, _pci(m.group(2)), m.start(1)) if m is not None and plain else None
        if len(self.heads) >= HEADS_SIZE:
            self.heads.clear()
        self.heads[head] = found
        return found

    def _feed(self, rec: KernelRecord) -> XidEvent | None:
        text = rec.message
        self.since_header += 1
        open_154, self.open_154 = self.open_154, None
        if open_154 is not None:
            w = _ACTION_WRAP.match(text)
            if w:  # "...154, GPU recovery action changed" / "   from 0x0 (None) to 0x2 (...)"
                return open_154._replace(
                    message=f"{open_154.message} {text.strip()}",
                    recovery_action=w.group(1).strip(),
                    wrapped=True,
                )
        if "AER" in text:
            return self._aer(rec)
        if text[:7] == "nvidia ":
            d = _NVIDIA_DEVICE.match(text)
            if d is not None:
                self._learn_nvidia(d.group(1))
        if "NVRM" not in text and "SXid" not in text:
            return None
        if "Xid" in text:
            m = _XID.search(text)
            if m:
                code = int(m.group(3))
                action = None
                if code == 154:  # the text in the last parentheses after the code, if any
                    pm = _LAST_PARENS.search(text, m.end(3))
                    action = pm.group(1).strip() if pm else None
                ev = _event(rec, code, _pci(m.group(2)), m.group(1), recovery_action=action)
                if 144 <= code <= 150:
                    nv = _NVLINK5.match(text, m.end(3) + 1)
                    if nv is not None and "Fatal" in nv.group(2):
                        ev = ev._replace(variant="fatal")
                    regs = _NVLINK5_REGS.search(text, m.end(3))
                    if regs is not None:
                        ev = ev._replace(subcode=(int(regs.group(1), 16), int(regs.group(2), 16)))
                cause = _CAUSE.search(text, m.end(3)) if _CAUSED_BY in text else None  # the regex is slow
                if cause is not None:  # a consequence: the driver names the Xid that caused it
                    ev = ev._replace(cause=int(cause.group(1)))
                if code == 154 and action is None:
                    self.open_154 = ev
                return ev
            m = _SXID.search(text)
            if m:
                prefix = text[: m.start(1)].strip()
                message = f"{prefix} {m.group(1)}" if prefix else m.group(1)
                return _event(rec, int(m.group(3)), _pci(m.group(2)), message, sxid=True)
        h = _GPU_HEADER.search(text)
        if h:
            self.header_pci, self.since_header = _pci(h.group(1)), 0
        if _FALLEN_OFF in text:
            n = _NVRM.search(text)
            if n:
                pci = _pci(n.group(1))
                if pci is None and self.since_header < _HEADER_REACH:
                    pci = self.header_pci
                return _event(rec, 79, pci, n.group(1))
        return None


def extract_xids(log: KernelLog) -> list[XidEvent]:
    """Every Xid/SXid/AER event in the log, in log order (no de-duplication)."""
    reader = XidReader()
    events: list[XidEvent] = []
    for rec in log.records:
        ev = reader.feed(rec)
        if ev is not None:
            events.append(ev)
    return events
