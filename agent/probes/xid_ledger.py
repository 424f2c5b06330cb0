"""This boot's Xid/SXid/AER events folded per (kind, code, device): O(1) per event, bounded memory.

A storm of 400,000 identical Xid lines is one tally with a count and a rate, never 400,000 objects.
The rate is a sliding one-minute window over log time (the kernel's own timestamp where the line has
one, else its wall-clock stamp; the time we read it when it has neither), kept as two counters per
tally.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from agent.core.kernel import KernelRecord, KernelXids, LinePos, XidEvent, XidTally

WINDOW_S = 60.0
BURST_QUIET_S = 180.0  # a device's burst of Xids ends after 3 min of silence (NVIDIA Fleet Intelligence)
MAX_KEYS = 512  # distinct (kind, code, device); a real node has a few dozen at most
_Key = tuple[str, int, "str | None", str, "tuple[int, int] | None", "int | None"]


@dataclass
class _Tally:
    first: XidEvent
    latest: XidEvent
    numbered: int  # lines that carry an Xid number (or SXid / AER lines)
    companions: int  # number-less "fallen off the bus" lines: the same event printed again
    win_start: float
    win_count: int
    prev_count: int
    first_companion: bool = False  # `first` is a number-less line: the first numbered one replaces it
    burst: int = 0
    last: LinePos | None = None  # the newest line that moved the count or `latest` (what a clear covers)

    def count(self) -> int:
        return self.numbered or self.companions

    def per_minute(self, now: float) -> float:
        """Sliding-window estimate: the previous window weighted by how much of it still overlaps."""
        elapsed = now - self.win_start
        if elapsed >= 2 * WINDOW_S:
            return 0.0
        if elapsed >= WINDOW_S:
            prev, cur, elapsed = self.win_count, 0, elapsed - WINDOW_S
        else:
            prev, cur = self.prev_count, self.win_count
        return round((prev * max(0.0, 1.0 - elapsed / WINDOW_S) + cur) * 60.0 / WINDOW_S, 1)


@lru_cache(maxsize=256)
def _wall_seconds(stamp: str) -> float | None:
    """Seconds of a wall-clock stamp cut to the second (ISO, ctime, syslog); None if none. Seconds
    are enough for a one-minute window, and a storm repeats the same second thousands of times."""
    text = stamp.replace("Z", "")
    for fmt in ("%Y-%m-%dT%H:%M:%S", "%a %b %d %H:%M:%S %Y", "%b %d %H:%M:%S"):
        try:
            return datetime.strptime(" ".join(text.split()), fmt).timestamp()
        except ValueError:
            continue
    return None


def second_of(wallclock: str) -> str:
    """The stamp up to its whole second: "2025-01-21T02:21:33,4985+00:00" → "2025-01-21T02:21:33"."""
    if wallclock[:4].isdigit():
        return wallclock[:19]
    return wallclock.partition(".")[0]


def _key(ev: XidEvent) -> _Key:
    kind = "aer" if ev.aer else "sxid" if ev.sxid else "xid"
    return kind, ev.code, ev.pci, ev.variant, ev.subcode, ev.cause


def _numbered(ev: XidEvent) -> bool:
    return ev.sxid or ev.aer or ev.message.startswith("Xid")


class XidLedger:
    """What the xid check needs from the whole boot, updated one event at a time."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.tallies: dict[_Key, _Tally] = {}
        self.untallied = 0
        self.now = 0.0  # the latest log time seen (of any record with a kernel timestamp): rates are "now"
        self.version = 0  # bumped on every change: a view is rebuilt only when it moved
        self.bursts: dict[str | None, list[float]] = {}  # device → [last line's time, burst number]
        self._last_second: str | None = None  # a one-entry cache: a storm repeats the same second
        self._last_seconds: float | None = None

    def reset(self) -> None:
        """A new boot, or the log was replaced: nothing of what we held is this log's any more."""
        self.tallies.clear()
        self.bursts.clear()
        self.untallied = 0
        self.version += 1

    def _log_time(self, ts_us: int | None, wallclock: str | None) -> float:
        """The kernel's timestamp, else the wall-clock stamp's second, else when we read it."""
        if ts_us is not None:
            return ts_us / 1e6
        if wallclock is not None:
            t = self.wall_time(wallclock)
            if t is not None:
                return t
        return self.clock()

    def wall_time(self, wallclock: str) -> float | None:
        """The log time of a wall-clock stamp (its second); None when it does not parse."""
        second = second_of(wallclock)
        if second != self._last_second:
            self._last_second, self._last_seconds = second, _wall_seconds(second)
        return self._last_seconds

    def add(self, ev: XidEvent, rec: KernelRecord | None = None, pos: LinePos | None = None) -> bool:
        """Fold one event in (its time from `rec`, the line it came from, when given; `pos`: where
        that line stands in the log); True when the engine should look now (a new kind/code/device,
        or an Xid 154 whose recovery action changed), False when only counts moved."""
        t = (
            self._log_time(ev.ts_us, ev.wallclock)
            if rec is None
            else self._log_time(rec.ts_us, rec.wallclock)
        )
        return self.add_at(ev, t, 1, pos)

    def add_at(self, ev: XidEvent, t: float, n: int = 1, pos: LinePos | None = None) -> bool:
        """Fold n lines of one event at log time t in: what n add() calls with that time do (a
        storm's lines of one second, counted together; `pos`: the last of them's position)."""
        if t > self.now:
            self.now = t
        self.version += n
        key = _key(ev)
        tally = self.tallies.get(key)
        numbered = _numbered(ev)
        if tally is None:
            if len(self.tallies) >= MAX_KEYS:
                self.untallied += n
                return False
            burst = self._burst(ev.pci, t)
            m = 1 if ev.wrapped else n  # the lines after a wrapped one's first only repeat its action
            self.tallies[key] = _Tally(
                ev, ev, m if numbered else 0, 0 if numbered else m, t, m, 0, not numbered, burst, pos
            )
            return True
        tally.burst = self._burst(ev.pci, t)
        if ev.wrapped:  # the rest of the line counted already: only its recovery action is news
            changed = ev.recovery_action != tally.latest.recovery_action
            tally.latest = ev
            tally.last = pos or tally.last
            return changed
        if numbered:
            tally.numbered += n
            if tally.first_companion:
                tally.first, tally.first_companion = ev, False
        else:
            tally.companions += n
        if t - tally.win_start >= WINDOW_S:
            gap = t - tally.win_start
            tally.prev_count = tally.win_count if gap < 2 * WINDOW_S else 0
            tally.win_start, tally.win_count = t, 0
        if numbered or not tally.numbered:
            tally.win_count += n
        changed = ev.recovery_action != tally.latest.recovery_action
        if numbered or not tally.numbered:  # a companion beside numbered lines moves neither
            tally.latest = ev
            tally.last = pos or tally.last
        return changed

    def latest(self, ev: XidEvent, pos: LinePos | None = None) -> None:
        """`ev` is its tally's latest line, at `pos` (after add_at() took lines of several events of
        one tally together, not in the order they came)."""
        tally = self.tallies.get(_key(ev))
        if tally is not None and (_numbered(ev) or not tally.numbered):
            tally.latest = ev
            tally.last = pos or tally.last

    def _burst(self, device: str | None, t: float) -> int:
        """The burst number of a line on `device` at time t (O(1); one entry per tallied device)."""
        state = self.bursts.get(device)
        if state is None:
            self.bursts[device] = state = [t, 1.0]
        elif t - state[0] > BURST_QUIET_S:
            state[1] += 1
        state[0] = max(state[0], t)
        return int(state[1])

    def view(
        self, records: int, fmt: str, lost: int = 0, nvidia_devices: frozenset[str] = frozenset()
    ) -> KernelXids:
        return KernelXids(
            tallies=tuple(
                XidTally(t.first, t.latest, t.count(), t.per_minute(self.now), t.burst, t.last)
                for t in self.tallies.values()
            ),
            records=records,
            format=fmt,
            lost=lost,
            untallied=self.untallied,
            nvidia_devices=nvidia_devices,
        )
