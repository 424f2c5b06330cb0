"""The kernel log as the Xid checks read it: records, Xid events and their bounded tallies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class KernelRecord(NamedTuple):
    """One kernel log line. `seq`/`ts_us` come from /dev/kmsg records when present. A NamedTuple,
    not a frozen dataclass: one is made per line read, and a storm is 40,000 lines a second."""

    message: str
    ts_us: int | None = None  # microseconds since boot (kmsg, dmesg) when known
    wallclock: str | None = (
        None  # ISO time when the format carries one (journalctl short-iso, dmesg --time-format iso)
    )
    seq: int | None = None
    priority: int | None = None


class LinePos(NamedTuple):
    """Where a line stands in its boot's kernel log, so that a clear can say which lines it covered
    (core/clear_cover.py): kind "seq", a /dev/kmsg record's sequence number (it survives the ring
    overwriting older records), or "line", the record's ordinal among this boot's records of a log
    read from its start (a file without sequence numbers). Positions of different kinds never compare.
    `clock`/`t`: the line's own time, "mono" (seconds since boot, the kernel's stamp) or "wall" (epoch
    seconds of its wall-clock stamp), "" when it has none; only a clear recorded by an agent before
    clearCover is judged by it (core/clear_cover.py adopt), and it is never persisted."""

    kind: str
    n: int
    clock: str = ""
    t: float = 0.0


class XidEvent(NamedTuple):
    """An NVRM Xid (or SXid) line. pci is normalised. A NamedTuple for the same reason as KernelRecord."""

    code: int
    pci: str | None
    message: str  # the whole line text after "NVRM: "
    sxid: bool = False
    recovery_action: str | None = None  # Xid 154: text in the last parentheses, e.g. "GPU Reset Required"
    seq: int | None = None
    ts_us: int | None = None
    wallclock: str | None = None
    aer: bool = False  # a PCIe AER fatal/unrecovered line on `pci` (code 0), not an NVIDIA Xid
    wrapped: bool = False  # the second line of an Xid 154 wrapped onto two: its action, not a new line
    variant: str = ""  # "fatal" for an NVLink5 (144-150) line the driver marks Fatal or Link Fatal
    subcode: tuple[int, int] | None = None  # NVLink5 (144-150): the line's IntrInfo and ErrorStatus
    cause: int | None = None  # "... caused by previous Xid N": the Xid this one is a consequence of


@dataclass(frozen=True)
class KernelLog:
    """Records of the current boot only (a kmsg ring or a dmesg/journal capture of this boot)."""

    records: tuple[KernelRecord, ...]
    format: str  # "kmsg", "dmesg", "journalctl-short-iso", "syslog", "plain"


@dataclass(frozen=True)
class XidTally:
    """Every line of one (kind, code, device) this boot folded into one: a storm of 400,000 lines is
    one of these. `per_minute` is the rate over the last minute of log time (sliding window)."""

    first: XidEvent
    latest: XidEvent
    count: int
    per_minute: float
    burst: int = 0  # which burst of its device its latest line belongs to (a burst ends after BURST_QUIET_S)
    last: LinePos | None = None  # the newest line that moved its count or latest line (None: not known)


@dataclass(frozen=True)
class KernelXids:
    """This boot's kernel log as the xid check judges it, read incrementally and bounded in size
    whatever the log's length: one tally per distinct (kind, code, device)."""

    tallies: tuple[XidTally, ...]  # in order of first appearance
    records: int  # kernel records read this boot
    format: str  # the most common line format seen ("kmsg", "dmesg", ...)
    lost: int = 0  # records the ring overwrote before we read them (EPIPE on /dev/kmsg)
    untallied: int = 0  # lines of distinct keys past the bound (counted, not kept)
    nvidia_devices: frozenset[str] = frozenset()  # PCI addresses the nvidia driver printed lines about
