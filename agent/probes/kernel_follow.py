"""Follow the kernel log as it is written, so a new Xid reaches the Node in a fraction of a second.

The follower is the kernel log's reader: it feeds each record, once, into the source's KernelTail,
and wakes the engine only when the ledger says so: at once for a new (kind, code, device) or an Xid
154 whose recovery action changed, at most every COUNTS_EVERY_S when only counts moved (a storm of
repeated lines costs a few Node writes, not one per line). The engine's xid tier then takes the
tail's view; it reads nothing itself but what the follower has not read yet.

Live: poll(2) on /dev/kmsg (readable when a record is waiting; a FIFO standing in for it alike).
Snapshot: inotify on kmsg.log's directory wakes the follower when the file is written, truncated or
replaced (tests and the benchmark append to it), so the first line after a quiet spell is read at
once; while the file keeps growing it is read in batches, one every 50 ms (a storm of appends costs
what it did when the file was polled); without inotify it is polled every 50 ms. A regular file
standing in for the device (poll(2) calls it always readable) is polled every 50 ms while idle. An
idle follower makes no system call but poll(2) or inotify's read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import stat
import threading
import time
from collections.abc import Callable

from agent.probes.inotify import FileChanges
from agent.probes.kernel_tail import Change, KernelTail

log = logging.getLogger(__name__)
POLL_SECONDS = 0.05  # a file without inotify, or a regular file standing in for the device, when idle
BATCH_SECONDS = 0.05  # a file that grows: the next read after this, however often it is appended to
SAFETY_POLL_SECONDS = 2.0  # with inotify or poll(2): a look now and then whatever they say
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
        self.changes: FileChanges | None = None  # a file's inotify watch (None: polled)
        self._wake: tuple[int, int] | None = None  # a pipe: stop() wakes a wait at once (while running)
        self._wake_lock = threading.Lock()

    def stop(self) -> None:
        self.stopped.set()
        with self._wake_lock:
            if self._wake is not None:
                with contextlib.suppress(OSError):
                    os.write(self._wake[1], b"x")

    def run(self) -> None:
        with self._wake_lock:
            self._wake = os.pipe()
            os.set_blocking(self._wake[1], False)
        if not self.tail.device:
            self.changes = FileChanges.open(self.tail.path)  # before the first read: no write is missed
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
            if self.changes is not None:
                self.changes.close()
            with self._wake_lock:
                for fd in self._wake or ():
                    os.close(fd)
                self._wake = None

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
        if self.stopped.is_set():
            return
        if self.tail.device:
            self._wait_device(idle)
            return
        if not idle:  # growing: let more lines come, and read them in one go
            self.stopped.wait(BATCH_SECONDS)
        if self.changes is not None:
            self.changes.wait(SAFETY_POLL_SECONDS, self._wake_fd())  # at once when written meanwhile
        elif idle:
            self.stopped.wait(POLL_SECONDS)

    def _wait_device(self, idle: bool) -> None:
        """poll(2) on the device (or a FIFO): readable when a record waits, an error on EPIPE. A
        regular file standing in for it is always readable, and a FIFO without a writer always hangs
        up: those are polled."""
        fd = self.tail.fd
        if fd is None or not _pollable(fd):
            if idle:
                self.stopped.wait(POLL_SECONDS)
            return
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLERR | select.POLLPRI)
        poller.register(self._wake_fd(), select.POLLIN)
        events = dict(poller.poll(SAFETY_POLL_SECONDS * 1000))
        if events.get(fd, 0) & select.POLLHUP and not events.get(fd, 0) & select.POLLIN:
            self.stopped.wait(POLL_SECONDS)  # a FIFO whose writer went away: nothing comes until one opens

    def _wake_fd(self) -> int:
        assert self._wake is not None  # set for as long as run() runs
        return self._wake[0]


def _pollable(fd: int) -> bool:
    """poll(2) tells when a character device or a FIFO has data; a regular file is always readable."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)
