"""/dev/kmsg faked at the syscall layer: os.open / os.read on one path, nothing of ours patched.

The kernel's ring semantics (Documentation/ABI/testing/dev-kmsg): each read() returns exactly one
record ``prio,seq,ts_us,-;message\\n``; EAGAIN (non-blocking) when the reader has caught up; EPIPE once
when records the reader had not read yet were overwritten, after which it reads on from the oldest
record left. The ring holds `capacity` records. The path is a real (empty) file so poll(2) works on
the descriptor.
"""

from __future__ import annotations

import errno
import os
from collections import deque
from pathlib import Path
from typing import Any

import pytest


class FakeKmsg:
    def __init__(self, path: Path, monkeypatch: pytest.MonkeyPatch, capacity: int = 1000) -> None:
        self.path = str(path)
        path.write_bytes(b"")
        self.ring: deque[tuple[int, bytes]] = deque(maxlen=capacity)
        self.next_seq = 0
        self.ts_us = 1_000_000
        self.positions: dict[int, int] = {}  # fd → next seq to read
        self.reads = 0
        real_open, real_read, real_close = os.open, os.read, os.close

        def fake_open(p: Any, flags: int, *args: Any, **kw: Any) -> int:
            fd = real_open(p, flags, *args, **kw)
            if str(p) == self.path:
                self.positions[fd] = self.ring[0][0] if self.ring else self.next_seq
            return fd

        def fake_read(fd: int, n: int) -> bytes:
            if fd not in self.positions:
                return real_read(fd, n)
            self.reads += 1
            pos = self.positions[fd]
            first = self.ring[0][0] if self.ring else self.next_seq
            if pos < first:
                self.positions[fd] = first
                raise OSError(errno.EPIPE, "Broken pipe")
            if pos >= self.next_seq:
                raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
            seq, record = self.ring[pos - first]
            assert seq == pos
            self.positions[fd] = pos + 1
            return record[:n]

        def fake_close(fd: int) -> None:
            self.positions.pop(fd, None)
            real_close(fd)

        monkeypatch.setattr(os, "open", fake_open)
        monkeypatch.setattr(os, "read", fake_read)
        monkeypatch.setattr(os, "close", fake_close)

    def write(self, message: str, prio: int = 4, step_us: int = 100) -> None:
        """One record, as printk would store it (kmsg_inject writes `<4>` lines the same way)."""
        self.ts_us += step_us
        record = f"{prio},{self.next_seq},{self.ts_us},-;{message}\n".encode()
        self.ring.append((self.next_seq, record))
        self.next_seq += 1
