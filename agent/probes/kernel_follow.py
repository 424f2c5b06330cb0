"""Follow the kernel log as it is written, so a new Xid reaches the Node in a fraction of a second.

Live: a blocking read of /dev/kmsg from its end. Snapshot: the kmsg.log file is polled every 50 ms
(tests append to it). Either way the follower only wakes the engine; the engine re-reads the log.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)
TRIGGERS = (b"Xid", b"fallen off the bus", b"SXid")
POLL_SECONDS = 0.05


class KernelFollower(threading.Thread):
    def __init__(self, path: Path, on_trigger: Callable[[], None], *, device: bool) -> None:
        super().__init__(name="kernel-follower", daemon=True)
        self.path = path
        self.on_trigger = on_trigger
        self.device = device
        self.stopped = threading.Event()

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        try:
            self._follow_device() if self.device else self._follow_file()
        except Exception:  # the follower must never take the agent down; the tier still polls
            log.exception("kernel log follower stopped; Xids are still read on every gpu tier run")

    def _hit(self, data: bytes) -> None:
        if any(t in data for t in TRIGGERS):
            self.on_trigger()

    def _follow_file(self) -> None:
        path = str(self.path)  # os.stat on a str: this runs 20 times a second
        try:
            offset = os.stat(path).st_size
        except OSError:
            offset = 0
        while not self.stopped.wait(POLL_SECONDS):
            try:
                size = os.stat(path).st_size
            except OSError:
                continue
            if size < offset:  # truncated or replaced: start over
                offset = 0
                self.on_trigger()
            if size == offset:
                continue
            with self.path.open("rb") as fh:
                fh.seek(offset)
                data = fh.read(size - offset)
            offset += len(data)
            self._hit(data)

    def _follow_device(self) -> None:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.lseek(fd, 0, os.SEEK_END)
            while not self.stopped.is_set():
                try:
                    record = os.read(fd, 8192)  # one record per read; blocks until the next one
                except OSError as exc:
                    if exc.errno == errno.EPIPE:  # we fell behind and records were overwritten
                        self.on_trigger()
                        continue
                    raise
                if not record:
                    break
                self._hit(record)
        finally:
            os.close(fd)
