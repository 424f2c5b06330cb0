"""Follow the kernel log as it is written, so a new Xid reaches the Node in a fraction of a second.

The follower is the kernel log's reader: it feeds each record, once, into the source's KernelTail,
and wakes the engine only when the ledger says so: at once for a new (kind, code, device) or an Xid
154 whose recovery action changed, at most every COUNTS_EVERY_S when only counts moved (a storm of
repeated lines costs a few Node writes, not one per line). The engine's xid tier then takes the
tail's view; it reads nothing itself but what the follower has not read yet.

Live: poll(2) on /dev/kmsg (readable when a record is waiting). Snapshot: kmsg.log is polled every
50 ms (tests and the benchmark append to it).
"""

from __future__ import annotations

import logging
import select
import threading
import time
from collections.abc import Callable

from agent.probes.kernel_tail import Change, KernelTail

log = logging.getLogger(__name__)
POLL_SECONDS = 0.05
COUNTS_EVERY_S = 5.0


class KernelFollower(threading.Thread):
    def __init__(
        self, tail: KernelTail, on_trigger: Callable[[], None], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(name="kernel-follower", daemon=True)
        self.tail = tail
        self.on_trigger = on_trigger
        self.clock = clock
        self.stopped = threading.Event()
        self.counts_at = clock()  # the last wake-up; counts alone wake the engine COUNTS_EVERY_S later
        self.counts_pending = False

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        try:
            if self.tail.poll() is Change.NEW:  # the whole log, before the engine stops reading it
                self.on_trigger()
        except Exception as exc:  # reported by the engine's read (tail.error), and retried below
            log.warning(f"kernel log follower: {type(exc).__name__}: {exc}; retrying")
        self.tail.followed = True
        try:
            self._follow()
        finally:
            self.tail.followed = False

    def _follow(self) -> None:
        failures = 0
        while not self.stopped.is_set():
            try:
                self._step()
                failures = 0
            except Exception as exc:  # the follower must never take the agent down; the tier still reads
                failures += 1
                if failures == 1:
                    log.warning(f"kernel log follower: {type(exc).__name__}: {exc}; retrying")
                self.stopped.wait(min(30.0, POLL_SECONDS * 2**failures))

    def _step(self) -> None:
        before = self.tail.lines_read
        change = self.tail.poll(early=True)
        now = self.clock()
        if change is Change.NEW:
            self.counts_pending, self.counts_at = False, now
            self.on_trigger()
        elif change is Change.COUNTS or self.counts_pending:
            self.counts_pending = True
            if now - self.counts_at >= COUNTS_EVERY_S:
                self.counts_pending, self.counts_at = False, now
                self.on_trigger()
        self._wait(idle=self.tail.lines_read == before)

    def _wait(self, idle: bool) -> None:
        if not idle and self.tail.behind():
            return  # more is waiting (a poll stops early for news, or when a storm outruns it)
        fd = self.tail.fd if self.tail.device else None
        if fd is None or idle:  # a file, or a stand-in for the device that poll(2) calls always readable
            self.stopped.wait(POLL_SECONDS)
            return
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLERR | select.POLLPRI)
        poller.poll(500)  # ms: wakes at once for a new record (or EPIPE), and to notice stop()
