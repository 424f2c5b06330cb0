"""Kernel log text → KernelLog, whatever tool printed it, keeping only the current boot.

Each line is recognised on its own (captures get concatenated and tools get swapped), so one file may
mix formats. Accepted line shapes:

- raw ``/dev/kmsg`` records ``6,1234,5678901,-;message``; continuation lines that start with a space
  (`` SUBSYSTEM=pci``) belong to the record before and are dropped;
- ``dmesg``: ``[ 1234.567890] msg``; ``--decode``: ``kern  :info  : [ 1234.56] msg``;
  ``--time-format iso``: ``2024-06-20T21:24:53,799999+00:00 msg``;
  ``--ctime``: ``[Thu Jun 20 21:24:53 2024] msg``;
- ``dmesg -H``: ``[Jun20 21:24] msg`` then ``[  +0.000123] msg``;
- ``journalctl -k -o short-iso``: ``2024-06-20T21:24:53+0000 host kernel: msg``;
- syslog, ``journalctl -o short``/``short-precise``: ``Jun 20 21:24:53[.123456] host kernel: [123.45] msg``;
- journal and syslog lines pasted without their host field: ``Jun 20 21:24:53 kernel: msg``;
- remote collectors (talosctl dmesg): ``10.0.0.1: kern: warning: [2026-04-22T21:27:51.28Z]: msg``;
- anything else is kept as a plain message (kernel logs are free text).

In journal and syslog lines only the ``kernel`` identifier is kept: a user-space program (our own agent
included) that logs an Xid line must not look like the driver.

A file is treated as a markdown blockquote (``> `` stripped) only when every non-blank line starts
with ``>``: a pasted log in an issue or README is quoted as a whole, a real kernel log never is.

Current boot only: a record is dropped when a later boot boundary follows it. Boundaries are the
journal separators ``-- Boot <id> --`` / ``-- Reboot --``, a kmsg sequence number that goes backwards,
and a monotonic timestamp (kmsg or dmesg) that drops back by more than one second (a reboot starts
again near 0; within one boot printk timestamps only jitter by microseconds across CPUs). Wall-clock
formats carry no such signal, so a multi-boot capture in those formats is read whole.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections import Counter

from agent.core.kernel import KernelLog, KernelRecord
from agent.core.probed import ParseError

_KMSG = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$")
_FACILITIES = (
    "kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|"
    "local0|local1|local2|local3|local4|local5|local6|local7"
)
_LEVELS = "emerg|alert|crit|err|error|warn|warning|notice|info|debug"
_DECODE = re.compile(rf"^({_FACILITIES})\s*:\s*({_LEVELS})\s*:\s?(.*)$")
_REMOTE = re.compile(rf"^\S+:\s+({_FACILITIES}):\s+({_LEVELS}):\s?(.*)$")
_MONO = re.compile(r"^\[\s*(\d+)\.(\d+)\]:?\s?(.*)$")
_ISO = r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"
_ISO_PREFIX = re.compile(rf"^({_ISO})\s(.*)$")
_ISO_BRACKET = re.compile(rf"^\[({_ISO})\]:?\s?(.*)$")
_CTIME = re.compile(
    r"^\[((?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) "
    r"+\d+ \d{2}:\d{2}:\d{2} \d{4})\]\s?(.*)$"
)
_SYSLOG = re.compile(
    r"^((?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +\d+ \d{2}:\d{2}:\d{2}(?:\.\d+)?)\s+(.*)$"
)
_HOST_IDENT = re.compile(r"^(\S+)\s+([^\s:\[]+)(?:\[\d+\])?:\s?(.*)$")
_IDENT_ONLY = re.compile(r"^([^\s:\[]+)(?:\[\d+\])?:\s(.*)$")  # a pasted line without its host field
_HUMAN = re.compile(  # dmesg -H: "[Jun20 21:24] msg", "[Thu Jun20 21:24] msg", then "[  +0.000123] msg"
    r"^\[(?:(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) )?"
    r"(?:[A-Z][a-z]{2}\s?\d{1,2} \d{2}:\d{2}(?::\d{2})?|\s*[+-]\s*\d+\.\d+)\]"
    r"\s?(.*)$"
)
_LEVEL_NUM = {
    "emerg": 0,
    "alert": 1,
    "crit": 2,
    "err": 3,
    "error": 3,
    "warn": 4,
    "warning": 4,
    "notice": 5,
    "info": 6,
    "debug": 7,
}
_REBOOT_DROP_US = 1_000_000
# NUL, C0 controls other than tab and ESC (colour codes), U+FFFD (bytes that were not UTF-8): the kernel
# escapes them (\xNN) in every record it prints, so a line holding one was damaged after it was
# written. It is no evidence: "PCI:0000:9\x001:00" must not become another GPU's address.
_GARBLED = re.compile(r"[\x00-\x08\x0a-\x1a\x1c-\x1f\x7f\ufffd]")


_GARBLED_BUT_NEWLINE = re.compile(r"[\x00-\x08\x0b-\x1a\x1c-\x1f\x7f\ufffd]")
_ASCII_KEPT = bytes(b for b in range(128) if not _GARBLED_BUT_NEWLINE.match(chr(b)))


def garbled(text: str) -> bool:
    """A character the kernel would have escaped: the text was damaged after it was written."""
    return _GARBLED.search(text) is not None


def clean_lines(raw: bytes, text: str) -> bool:
    """No line of *text* (*raw* decoded, lines split at its newlines) is garbled: one look at a
    whole read, not one a line. ASCII (a storm's lines) by deleting the bytes a line may hold and
    seeing that none is left, ~40 times faster than the search."""
    if raw.isascii():
        return not raw.translate(None, _ASCII_KEPT)
    return _GARBLED_BUT_NEWLINE.search(text) is None


def _is_boot_separator(line: str) -> bool:
    return line.startswith("-- Boot ") or line.startswith("-- Reboot --")


def _is_journal_meta(line: str) -> bool:
    return line.startswith(("-- Logs begin at", "-- Journal begins at", "-- No entries --")) or (
        line.startswith("-- ") and line.endswith(" --") and "entries" in line
    )


def _inner(text: str) -> tuple[str, int | None, str | None]:
    """Strip a timestamp that follows a facility/level or host prefix: ([mono] | [iso] | iso | [ctime])."""
    if text[:1].isdigit():  # the common case of --decode --time-format iso: no regex
        stamp, _, rest = text.partition(" ")
        if len(stamp) >= 19 and stamp[4] == "-" and stamp[10] == "T" and stamp[13] == ":":
            return rest, None, stamp
        return text, None, None
    m = _MONO.match(text)
    if m:
        return m.group(3), _mono_us(m.group(1), m.group(2)), None
    m = _ISO_BRACKET.match(text)
    if m:
        return m.group(2), None, m.group(1)
    m = _ISO_PREFIX.match(text)
    if m:
        return m.group(2), None, m.group(1)
    m = _CTIME.match(text)
    if m:
        return m.group(2), None, m.group(1)
    return text, None, None


def _mono_us(sec: str, frac: str) -> int:
    frac6 = (frac + "000000")[:6]
    return int(sec) * 1_000_000 + int(frac6)


def _host_ident(rest: str) -> tuple[str, str] | None:
    """(identifier, message) of a journal/syslog line after its time stamp, host field or not."""
    m = _IDENT_ONLY.match(rest)
    if m and m.group(1) in ("kernel", "kern"):
        return m.group(1), m.group(2)
    h = _HOST_IDENT.match(rest)
    if h:
        return h.group(2), h.group(3)
    if m:
        return m.group(1), m.group(2)
    return None


def _parse_line(line: str) -> tuple[KernelRecord | None, str]:
    """One line → (record or None if it is not a kernel record, format name)."""
    m = _KMSG.match(line)
    if m:
        prio = int(m.group(1))
        return (
            KernelRecord(
                message=m.group(4),
                ts_us=int(m.group(3)),
                seq=int(m.group(2)),
                priority=prio & 7,
            ),
            "kmsg",
        )
    m = _DECODE.match(line)
    if m:
        msg, ts, wall = _inner(m.group(3))
        return KernelRecord(msg, ts_us=ts, wallclock=wall, priority=_LEVEL_NUM[m.group(2)]), "dmesg"
    m = _MONO.match(line)
    if m:
        return KernelRecord(m.group(3), ts_us=_mono_us(m.group(1), m.group(2))), "dmesg"
    m = _CTIME.match(line)
    if m:
        return KernelRecord(m.group(2), wallclock=m.group(1)), "dmesg"
    m = _HUMAN.match(line)
    if m:
        return KernelRecord(m.group(1)), "dmesg"
    m = _ISO_PREFIX.match(line)
    if m:
        stamp, rest = m.group(1), m.group(2)
        if "," in stamp:  # dmesg --time-format iso always prints ",usec"; journalctl never does
            return KernelRecord(rest, wallclock=stamp), "dmesg"
        h = _host_ident(rest)
        if h:
            if h[0] != "kernel":
                return None, "journalctl-short-iso"
            msg, ts, _ = _inner(h[1])
            return KernelRecord(msg, ts_us=ts, wallclock=stamp), "journalctl-short-iso"
        return KernelRecord(rest, wallclock=stamp), "plain"
    m = _SYSLOG.match(line)
    if m:
        h = _host_ident(m.group(2))
        if h:
            if h[0] != "kernel":
                return None, "syslog"
            msg, ts, _ = _inner(h[1])
            return KernelRecord(msg, ts_us=ts, wallclock=m.group(1)), "syslog"
        return KernelRecord(m.group(2), wallclock=m.group(1)), "syslog"
    m = _REMOTE.match(line)
    if m:
        msg, ts, wall = _inner(m.group(3))
        return KernelRecord(msg, ts_us=ts, wallclock=wall, priority=_LEVEL_NUM[m.group(2)]), "dmesg"
    return KernelRecord(line), "plain"


def _looks_quoted(lines: list[str]) -> bool:
    body = [ln for ln in lines if ln.strip()]
    return bool(body) and all(ln.lstrip().startswith(">") for ln in body)


def _unquote(line: str) -> str:
    text = line.lstrip()
    text = text[1:] if text.startswith(">") else text
    return text[1:] if text.startswith(" ") else text


def _new_boot(prev: KernelRecord | None, rec: KernelRecord) -> bool:
    if prev is None:
        return False
    if prev.seq is not None and rec.seq is not None and rec.seq < prev.seq:
        return True
    return prev.ts_us is not None and rec.ts_us is not None and rec.ts_us < prev.ts_us - _REBOOT_DROP_US


NEW_BOOT = KernelRecord("-- new boot --")  # feed()'s marker: every record before this one is gone


class LineReader:
    """Kernel log lines in, records out, one line at a time and O(1) state: the incremental form of
    parse_kernel_log (a follower feeds appended lines; the full read feeds a whole file)."""

    def __init__(self, quoted: bool = False) -> None:
        self.quoted = quoted  # decided by the caller from the text it has (a whole file at start)
        self.prev: KernelRecord | None = None
        self.in_kmsg = False
        self.formats: Counter[str] = Counter()  # bounded: keys are format names
        self.pending: KernelRecord | None = None
        self.last_format = "plain"

    @property
    def format(self) -> str:
        return self.formats.most_common(1)[0][0] if self.formats else "plain"

    def feed(self, line: str) -> KernelRecord | None:
        """The record this line is, NEW_BOOT at a boot boundary (the caller drops what it holds; the
        line's own record follows from `self.pending`), or None (blank, metadata, user space)."""
        self.pending = None
        line = line.rstrip("\r\n")
        if self.quoted:
            line = _unquote(line)
        if not line.strip() or _GARBLED.search(line):
            return None
        if self.in_kmsg and line[0] == " ":
            return None  # kmsg dictionary continuation (" SUBSYSTEM=pci", " DEVICE=+pci:0000:3b:00.0")
        if "-- " in line[:8]:
            stripped = line.strip()
            if _is_boot_separator(stripped):
                self.prev = None
                return NEW_BOOT
            if _is_journal_meta(stripped):
                return None
        rec, fmt = _parse_line(line)
        if rec is None:
            self.in_kmsg = fmt == "kmsg"
            self.formats[fmt] += 1
            return None
        return self.accept(rec, fmt)

    def count(self, fmt: str, n: int) -> None:
        """n records of a format without a sequence number or a monotonic time read elsewhere (no
        boot can start at one): what accept() does for each."""
        self.in_kmsg = fmt == "kmsg"
        self.formats[fmt] += n
        self.last_format = fmt

    def accept(self, rec: KernelRecord, fmt: str) -> KernelRecord:
        """Count a record parsed elsewhere (or here) in: its format, and whether a boot starts."""
        self.in_kmsg = fmt == "kmsg"
        self.formats[fmt] += 1
        self.last_format = fmt
        boot = _new_boot(self.prev, rec)
        if rec.seq is not None or rec.ts_us is not None:
            self.prev = rec
        if boot:
            self.pending = rec
            return NEW_BOOT
        return rec


def is_binary(text: str) -> bool:
    return bool(text) and text.count("\x00") * 4 > len(text)


def looks_quoted(text: str) -> bool:
    """A markdown blockquote as a whole (a log pasted into an issue), never a real kernel log."""
    return _looks_quoted(text.split("\n"))


def parse_kernel_log(text: str) -> KernelLog:
    """Parse kernel log text of any supported format; see the module docstring. Raises ParseError
    only for input that is not text (NUL bytes dominate); an empty log is zero records."""
    if is_binary(text):
        raise ParseError("kernel log: binary data (mostly NUL bytes), not text")
    reader = LineReader(quoted=looks_quoted(text))
    records: list[KernelRecord] = []
    for line in text.split("\n"):
        rec = reader.feed(line)
        if rec is NEW_BOOT:
            records.clear()
            rec = reader.pending
        if rec is not None:
            records.append(rec)
    return KernelLog(records=tuple(records), format=reader.format)


def read_kmsg_live(path: str = "/dev/kmsg", timeout_s: float = 5.0) -> KernelLog:
    """Read every record now in the kernel ring without blocking, then parse it.

    /dev/kmsg returns one record per read() and EAGAIN once the reader has caught up; EPIPE means
    the ring overwrote records under us, and the next read goes on with the oldest one left. A
    regular file or a FIFO behaves the same way here (EOF or EAGAIN ends the read). Stops at
    `timeout_s` whatever happens. OSError from open() propagates: the probe turns it into ProbeError.
    """
    deadline = time.monotonic() + timeout_s
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    chunks: list[bytes] = []
    try:
        while time.monotonic() < deadline:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue
                if exc.errno == errno.EINTR:
                    continue
                raise
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(fd)
    return parse_kernel_log(b"".join(chunks).decode("utf-8", errors="replace"))
