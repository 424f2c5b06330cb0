"""A storm's lines read without parsing each: the shape of a line parsed once reads the next ones.

A storm repeats a few texts thousands of times and only the stamps differ. `Repeat` is the shape of
the last Xid line parsed the slow way (its prefix, equal but for digits): a line of that shape gives
its record by slicing, and a text the XidReader already knows gives its event without a parse.
`Bulk` goes further for wall-clock-stamped lines (`dmesg --time-format iso`, a snapshot's kmsg.log):
the log's time of such a line is its stamp's second, so the lines of one second whose events need
no parse (a known text, or a new text of a known head: each line its own pid or fault address) are
only listed as they come and folded into the ledger together when the second ends (or anything
else comes), one ledger call per tally and second.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from agent.core.kernel import KernelRecord, XidEvent
from agent.probes.kernel_log import garbled
from agent.probes.xid_ledger import second_of


class Repeat:
    """The shape of the last Xid line parsed the slow way, so that a line of the same shape (its
    prefix equal but for digits) is read by slicing: the record's stamps are cut from the places the
    slow parse found them. `verbatim`: the parser takes the text after this prefix as it is (a kmsg
    record, a dmesg line with a wall-clock stamp), so any line of this shape is read by slicing;
    other shapes (journal, syslog: the parser strips a stamp at the start of the message) only for
    a text the XidReader knows."""

    __slots__ = ("fmt", "plen", "second", "seq", "shape", "ts", "verbatim", "wall")

    def __init__(self, plen: int, shape: re.Pattern[str], fmt: str) -> None:
        self.plen, self.shape, self.fmt = plen, shape, fmt
        self.seq: tuple[int, int] | None = None
        self.ts: tuple[int, int] | None = None
        self.wall: tuple[int, int] | None = None
        self.second: tuple[int, int] | None = None  # the wall stamp up to its second
        self.verbatim = False

    @staticmethod
    def learn(line: str, rec: KernelRecord, fmt: str) -> Repeat | None:
        plen = len(line) - len(rec.message)
        if plen <= 0 or line[plen:] != rec.message:
            return None
        prefix = line[:plen]
        pattern = "".join(r"\d" if c.isdigit() else re.escape(c) for c in prefix)
        shape = Repeat(plen, re.compile(pattern), fmt)  # re's own cache: a storm has one shape
        if rec.seq is not None:  # kmsg "prio,seq,ts,flags;": the fields between the commas
            a = prefix.index(",") + 1
            b = prefix.index(",", a)
            c = prefix.index(",", b + 1)
            shape.seq, shape.ts = (a, b), (b + 1, c)
        elif rec.ts_us is not None:
            return None  # "[ 123.456]" stamps: rare in storms, parsed the slow way
        if rec.wallclock is not None:
            at = prefix.find(rec.wallclock)
            if at < 0:
                return None
            shape.wall = (at, at + len(rec.wallclock))
            shape.second = (at, at + len(second_of(rec.wallclock)))
        shape.verbatim = fmt == "kmsg" or (fmt == "dmesg" and rec.wallclock is not None)
        return shape

    def fits(self, line: str) -> bool:
        return self.shape.fullmatch(line, 0, self.plen) is not None

    def record(self, line: str) -> KernelRecord | None:
        """The record of a line of this shape (None when the prefix is not of this shape)."""
        if self.shape.fullmatch(line, 0, self.plen) is None:
            return None
        seq = int(line[self.seq[0] : self.seq[1]]) if self.seq else None
        ts = int(line[self.ts[0] : self.ts[1]]) if self.ts else None
        wall = line[self.wall[0] : self.wall[1]] if self.wall else None
        return KernelRecord(line[self.plen :], ts_us=ts, wallclock=wall, seq=seq)


class Bulk:
    """Lines of one wall-clock-stamped verbatim shape that give their event without a parse, listed
    per second: a text the XidReader knows (its memo), or a new one whose head tells its event
    (XidReader.known: a storm whose every line has its own pid or fault address). Each line's event
    is resolved as it comes (the memo changes as it would line by line) and listed with its kind
    (its text, or for a new text its device and code: lines of one kind are lines of one tally);
    `fold(kinds, events, wallclock, fmt)` takes each second's lists, in the order the lines came."""

    __slots__ = (
        "clean", "current", "events", "fmt", "fold", "kinds", "known", "memo", "plen", "second",
        "seconds", "shape", "wall", "wallclock",
    )  # fmt: skip

    def __init__(
        self,
        repeat: Repeat,
        memo: dict[str, XidEvent],
        known: Callable[[str, str], XidEvent | None],
        seconds: Callable[[str], float | None],
        clean: Callable[[], bool],
        fold: Fold,
    ) -> None:
        assert repeat.wall is not None and repeat.second is not None and repeat.seq is None
        self.shape, self.plen, self.wall, self.fmt = repeat.shape, repeat.plen, repeat.wall, repeat.fmt
        self.second: tuple[int, int] = repeat.second
        self.memo = memo
        self.known = known  # a new text's event from its head (XidReader.known), None: parse it
        self.seconds = seconds  # a wall-clock stamp's log time (XidLedger.wall_time)
        self.clean = clean  # no line of the read being listed is garbled (kernel_log.clean_lines)
        self.fold = fold
        self.kinds: list[object] = []
        self.events: list[XidEvent] = []
        self.current = ""  # the second being listed
        self.wallclock = ""  # its first line's stamp

    @staticmethod
    def of(
        repeat: Repeat | None,
        memo: dict[str, XidEvent] | None,
        known: Callable[[str, str], XidEvent | None],
        seconds: Callable[[str], float | None],
        clean: Callable[[], bool],
        fold: Fold,
    ) -> Bulk | None:
        """A Bulk for a wall-clock-stamped verbatim shape (None for any other: kmsg records carry
        their own time and sequence number, read line by line)."""
        if repeat is None or memo is None or not repeat.verbatim or repeat.wall is None or repeat.seq:
            return None
        return Bulk(repeat, memo, known, seconds, clean, fold)

    def take(self, line: str) -> bool:
        """List a line of this shape whose event needs no parse and counts as one more line of it
        (not an Xid 154's action, not the second line of a wrapped one), in a second whose stamp
        reads as a time; False for any other line, which the caller reads itself after flush()."""
        if self.shape.fullmatch(line, 0, self.plen) is None:
            return False
        second = line[self.second[0] : self.second[1]]
        if second != self.current:
            self.flush()  # another second: the one listed so far is folded first
            wallclock = line[self.wall[0] : self.wall[1]]
            if self.seconds(wallclock) is None:
                return False  # each line's time is when it is read: line by line
            self.current, self.wallclock = second, wallclock
        text = line[self.plen :]
        ev = self.memo.get(text)
        if ev is None:
            if not self.clean() and garbled(text):
                return False
            ev = self.known(text, line[self.wall[0] : self.wall[1]])
            if ev is None:
                return False
            self.kinds.append((ev.code, ev.pci))  # one tally, whatever the text
        elif ev.wrapped or ev.recovery_action is not None:
            return False
        else:
            self.kinds.append(text)
        self.events.append(ev)
        return True

    def flush(self) -> None:
        """Fold what is listed (before any other line is read, and at the end of each read)."""
        if self.kinds:
            kinds, events = self.kinds, self.events
            self.kinds, self.events, self.current = [], [], ""
            self.fold(kinds, events, self.wallclock, self.fmt)


Fold = Callable[[list[object], list[XidEvent], str, str], None]
