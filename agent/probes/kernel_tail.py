"""The kernel log read incrementally: each record is parsed once, as it arrives, into the Xid ledger.

The whole log is read only at start (the current boot's records still in the ring or the file, so
Xids from before the agent started count) and when what we were reading is gone: EPIPE on /dev/kmsg
(the ring overwrote records under us; the next read goes on with the oldest one left), or a snapshot
file truncated or replaced. Everything else is read from where the last read stopped. State is O(1)
apart from the ledger, which is bounded by the number of distinct (kind, code, device).

Two kinds of path:
- a device (/dev/kmsg): opened once, non-blocking; one record per read(), EAGAIN when caught up.
  A regular file or a FIFO standing in for it behaves the same (EOF or EAGAIN ends a read);
- a file (a snapshot's kmsg.log): read from the last offset; a smaller size, another inode or other
  first bytes mean truncated or replaced, and it is read again from the top.

A storm's lines are not parsed one by one: agent.probes.kernel_repeat reads a line of the shape of
the last Xid line parsed by slicing it, and counts a second's worth of known texts at once.
"""

from __future__ import annotations

import enum
import errno
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable

from agent.core.kernel import KernelRecord, KernelXids, LinePos, XidEvent
from agent.probes.kernel_log import NEW_BOOT, LineReader, clean_lines, garbled, is_binary, looks_quoted
from agent.probes.kernel_repeat import Bulk, Repeat
from agent.probes.xid_events import XidReader, whole
from agent.probes.xid_ledger import MAX_KEYS, XidLedger

log = logging.getLogger(__name__)
CHUNK = 256 * 1024  # a poll stops after the chunk that held news, so the engine hears of it at once
MAX_LINE = 64 * 1024  # a longer line is cut: no record is that long, and the buffer stays bounded
HEAD_BYTES = 256  # a file whose first bytes changed was replaced, even at the same size and inode
DEVICE_READ_S = 0.1  # the follower's poll of the device reads at most this long, then lets the engine look
DEVICE_FULL_READ_S = 5.0  # the engine's read (a whole ring at start takes ~0.1 s)


class Change(enum.IntEnum):
    NONE = 0
    COUNTS = 1  # only counts (and rates) of known findings moved
    NEW = 2  # a new (kind, code, device), an Xid 154 action changed, or the log was read again


def whole_line(text: str) -> bool:
    """A kernel log's last line without its newline is read only when it is whole by the grammar: a
    journal boot separator closed by " --", an Xid/SXid/AER line that says all it has to say."""
    stripped = text.strip()
    if stripped.startswith("-- "):
        return stripped.endswith(" --")
    return whole(text)


class BinaryLog(Exception):
    """The log is not text (NUL bytes dominate)."""


class KernelTail:
    """One reader of one kernel log; poll() and view() are safe from any thread."""

    def __init__(self, path: str, *, device: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.device = device
        self.clock = clock
        self.lock = threading.Lock()
        self.ledger = XidLedger(clock)
        self.full_reads = 0  # start, EPIPE, truncation, replacement: how often the whole log was read
        self.lines_read = 0  # every line fed, this process (for the benchmark and the metric)
        self._start()
        self.fd: int | None = None
        self.identity: tuple[int, int] | None = None
        self.offset = 0
        self.head = b""
        self.binary = False
        self.urgent = False
        self.early = False
        self.timed_out = False
        self.warned = False
        self.followed = False  # a follower thread is the reader: the engine only takes the view
        self.error: OSError | BinaryLog | None = None  # what the last poll raised
        self.read: tuple[bytes, str] = (b"", "")  # the read being fed, raw and decoded (_clean)
        self.read_clean: bool | None = True

    def _start(self) -> None:
        """Forget everything: the log is about to be read from its start."""
        self.lines = LineReader()
        self.xids = XidReader(memo=True)
        self.ledger.reset()
        self.records = 0
        self.lost = 0
        self.last_seq: int | None = None
        self.partial = b""
        self.change = Change.NEW
        self.repeat: Repeat | None = None
        self.bulk: Bulk | None = None

    # ------------------------------------------------------------------ feeding

    def _boot(self) -> None:
        self.ledger.reset()
        self.xids.reset()
        self.records = 0
        self.change = Change.NEW
        self.repeat = self.bulk = None

    def _learn(self, line: str, rec: KernelRecord) -> None:
        self.repeat = Repeat.learn(line, rec, self.lines.last_format)
        xids, ledger = self.xids, self.ledger
        self.bulk = Bulk.of(self.repeat, xids.memo, xids.known, ledger.wall_time, self._clean, self._fold)

    def _record(self, rec: KernelRecord, line: str | None = None) -> None:
        """A record parsed: its event, if any, counted; `line` given, a line whose shape is learnt."""
        self.records += 1
        self._seq(rec)
        ev = self.xids.feed(rec)
        if ev is None:
            if rec.ts_us is not None and rec.ts_us > self.ledger.now * 1e6:
                self.ledger.now = rec.ts_us / 1e6  # log time goes on: a storm that stopped decays
            return
        if line is not None and self.xids.memo and rec.message in self.xids.memo:
            self._learn(line, rec)
        self._count(ev, rec)

    def _count(self, ev: XidEvent, rec: KernelRecord) -> None:
        """`rec` is this boot's latest record (self.records counts it): its kmsg sequence number, or
        without one its ordinal, is where its line stands (LinePos)."""
        if rec.ts_us is not None:
            clock, t = "mono", rec.ts_us / 1e6
        else:
            wall = self.ledger.wall_time(rec.wallclock) if rec.wallclock is not None else None
            clock, t = ("wall", wall) if wall is not None else ("", 0.0)
        kind, n = ("seq", rec.seq) if rec.seq is not None else ("line", self.records)
        self._changed(self.ledger.add(ev, rec, LinePos(kind, n, clock, t)))

    def _count_at(self, ev: XidEvent, t: float, n: int, pos: LinePos) -> None:
        self._changed(self.ledger.add_at(ev, t, n, pos))

    def _changed(self, news: bool) -> None:
        if news:
            self.change = Change.NEW
            self.urgent = True
        elif self.change is Change.NONE:
            self.change = Change.COUNTS

    def _line(self, line: str, read: bool = False) -> None:
        """One line; *read*: of the read being fed (_lines), not the last line of a file."""
        self.lines_read += 1
        repeat = self.repeat
        rec = repeat.record(line) if repeat is not None else None
        if repeat is not None and rec is not None:  # the shape of the last Xid line parsed: sliced
            memo = self.xids.memo
            ev = memo.get(rec.message) if memo is not None else None
            if ev is not None or (repeat.verbatim and ((read and self._clean()) or not garbled(rec.message))):
                if self.lines.accept(rec, repeat.fmt) is NEW_BOOT:
                    self._boot()
                    self._record(rec, line)
                elif ev is not None:  # a text seen before: its event, without a parse
                    self._seq(rec)
                    self.records += 1
                    self.xids.since_header += 1
                    self._count(ev, rec)
                else:  # a new text of the same shape: the text is parsed, the shape kept
                    self._record(rec)
                return
        fits = rec is not None
        rec = self.lines.feed(line)
        if rec is NEW_BOOT:
            self._boot()
            rec = self.lines.pending
        if rec is not None:
            self._record(rec, None if fits else line)

    def _seq(self, rec: KernelRecord) -> None:
        if rec.seq is not None:
            if self.last_seq is not None and rec.seq > self.last_seq + 1:
                self.lost += rec.seq - self.last_seq - 1
            self.last_seq = rec.seq

    def _lines(self, lines: list[str]) -> None:
        for line in lines:
            bulk = self.bulk
            if bulk is None or not bulk.take(line):
                if bulk is not None:
                    bulk.flush()  # what it listed comes before this line
                self._line(line, True)
        if self.bulk is not None:
            self.bulk.flush()

    def _clean(self) -> bool:
        """No line of the read being fed is garbled: looked at once, when a new text first asks."""
        if self.read_clean is None:
            self.read_clean = clean_lines(*self.read)
        return self.read_clean

    def _fold(self, kinds: list[object], events: list[XidEvent], wallclock: str, fmt: str) -> None:
        """Lines Bulk listed: one second's, each line's kind and event, in the order they came.
        The same as reading them line by line (tests/test_kernel_repeat.py): all have the same log
        time and the lines of one kind are lines of one tally, so each kind's lines are counted at
        once with its first line's event, in the order of each kind's first line (which tally is
        new, which numbered line comes first after a companion); then each tally's latest line is
        the last line of the kind whose last line came last."""
        n = len(kinds)
        before = self.records  # line i is record before + i + 1 of this boot (no sequence numbers here)
        self.lines_read += n
        self.records += n
        self.lines.count(fmt, n)
        self.xids.since_header += n
        t = self.ledger.wall_time(wallclock)
        assert t is not None  # Bulk lists only seconds whose stamp reads as a time
        last = dict(zip(kinds, events, strict=True))  # in the order of each kind's first line
        first = dict(zip(reversed(kinds), reversed(events), strict=True))  # reversed: of its last line
        counts = Counter(kinds)
        ends = {kind: before + i + 1 for i, kind in enumerate(kinds)}  # each kind's last line
        for kind in last:
            self._count_at(first[kind], t, counts[kind], LinePos("line", ends[kind], "wall", t))
        for kind in reversed(first):
            self.ledger.latest(last[kind], LinePos("line", ends[kind], "wall", t))

    def _data(self, data: bytes, *, first: bool = False) -> None:
        if first:
            text = data[:CHUNK].decode("utf-8", errors="replace")
            if is_binary(text):
                raise BinaryLog("kernel log: binary data (mostly NUL bytes), not text")
            self.lines.quoted = looks_quoted(text)
        buf = self.partial + data if self.partial else data
        end = buf.rfind(b"\n") + 1  # UTF-8 never has a newline byte inside a character
        self.partial = buf[end:]
        if end:
            raw = buf[:end]
            text = raw.decode("utf-8", errors="replace")
            self.read, self.read_clean = (raw, text), None
            try:
                self._lines(text.split("\n")[:-1])
            finally:
                self.read, self.read_clean = (b"", ""), True
        if len(self.partial) > MAX_LINE:
            self._flush(MAX_LINE)

    def _flush(self, limit: int = MAX_LINE, *, at_end: bool = False) -> None:
        """The partial line counts as a line: one too long, or (at_end) a file's last line without
        its newline when it is whole by the grammar. One cut inside is kept back: a writer may still
        finish it, and a capture cut there never says more (never read from a prefix)."""
        if self.partial:
            text = self.partial[:limit].decode("utf-8", errors="replace")
            if at_end and not whole_line(text):
                return
            self._line(text)
        self.partial = b""

    # ------------------------------------------------------------------ reading

    def poll(self, *, early: bool = False) -> Change:
        """Read what is new: everything there is now, or (early=True, the follower) stop after the
        chunk that held news, or after DEVICE_READ_S, so the engine hears of it at once.
        Raises OSError when the log cannot be opened or read, BinaryLog."""
        with self.lock:
            self.change = Change.NONE
            self.urgent = False
            self.early = early
            try:
                if self.device:
                    self._poll_device()
                else:
                    self._poll_file()
            except (OSError, BinaryLog) as exc:
                self.error = exc
                raise
            self.error = None
            return self.change

    def forget(self) -> None:
        """The log is gone (a snapshot without kmsg.log): read it whole when it is back."""
        with self.lock:
            self._close()
            self.identity = None

    def _close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _full_read(self, why: str) -> None:
        self.full_reads += 1
        if self.full_reads > 1:
            log.warning(f"kernel log {self.path}: {why}; reading it again from the start")
        self._start()

    def _poll_file(self) -> None:
        st = os.stat(self.path)
        identity = (st.st_dev, st.st_ino)
        head = b""
        if self.identity == identity and st.st_size >= self.offset and self.offset > 0:
            with open(self.path, "rb") as fh:
                head = fh.read(min(HEAD_BYTES, len(self.head)))
        if self.identity != identity or st.st_size < self.offset or head != self.head[: len(head)]:
            why = "replaced" if self.identity not in (None, identity) else "truncated or rewritten"
            self._full_read(why)
            self.identity, self.offset, self.head, self.binary = identity, 0, b"", False
        end = st.st_size  # not "until EOF": a storm may grow the file as fast as we read it
        if end == self.offset:
            return
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            while self.offset < end and not (self.early and self.urgent):
                data = fh.read(min(CHUNK, end - self.offset))
                if not data:
                    break
                first = self.offset == 0
                if len(self.head) < HEAD_BYTES:
                    self.head = (self.head + data)[:HEAD_BYTES]
                self.offset += len(data)
                self._data(data, first=first)
        if self.offset >= end:  # writers append whole lines; a last line without its newline is one
            self._flush(at_end=True)  # when whole

    def _poll_device(self) -> None:
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            self._full_read("opened")
        deadline = self.clock() + (DEVICE_READ_S if self.early else DEVICE_FULL_READ_S)
        self.timed_out = True
        while not (self.early and self.urgent) and self.clock() < deadline:
            try:
                data = os.read(self.fd, 8192)  # /dev/kmsg: exactly one record
            except BlockingIOError:
                self.timed_out = False
                return
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno != errno.EPIPE:
                    raise
                # The ring overwrote records we had not read; the next read gives the oldest left.
                # Nothing read so far is read twice, so the ledger stays; the gap shows in `lost`.
                self.full_reads += 1
                self.change = Change.NEW
                log.warning(f"kernel log {self.path}: records were overwritten before we read them")
                continue
            if not data:
                self.timed_out = False
                return  # a regular file at its end (a stand-in for the device); later reads go on
            self._data(data, first=self.records == 0 and not self.partial)

    def behind(self) -> bool:
        """The last poll stopped before the end (news found, or the device read's time was up)."""
        return (self.early and self.urgent) or (self.device and self.timed_out)

    def view(self) -> KernelXids:
        with self.lock:
            if self.ledger.untallied and not self.warned:
                self.warned = True
                log.warning(
                    f"kernel log {self.path}: more than {MAX_KEYS} distinct Xid (kind, code, device); "
                    "lines of further ones are counted as untallied, not kept"
                )
            return self.ledger.view(self.records, self.lines.format, self.lost, frozenset(self.xids.nvidia))


def fold_kernel_text(text: str) -> KernelXids:
    """A whole kernel log text through the reader the agent uses (tests, one-shot tools).
    Raises BinaryLog for data that is not text."""
    tail = KernelTail("<text>", device=False)
    with tail.lock:
        tail._data(text.encode("utf-8", errors="replace"), first=True)
        tail._flush(at_end=True)
    return tail.view()
