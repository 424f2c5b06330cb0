"""How the kernel-log follower waits (agent.probes.kernel_follow, agent.probes.inotify): inotify on a
snapshot's kmsg.log, poll(2) on the device or a FIFO standing in for it, and no busy loop where
neither can tell it when to look (a regular file standing in for the device, a FIFO whose writer went
away). Real files, a real FIFO and the kernel's own inotify; nothing of ours is patched."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.core.kernel import KernelXids
from agent.probes.inotify import FileChanges
from agent.probes.kernel_follow import KernelFollower
from agent.probes.kernel_tail import KernelTail
from agent.probes.snapshot import SnapshotSource

ROOT = Path(__file__).resolve().parent.parent

XID79 = "NVRM: Xid (PCI:0000:53:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
LINE = f"kern  :err   : 2025-01-21T03:12:44,118231+00:00 {XID79}\n"
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")


class Counting(KernelTail):
    """The real tail, counting how often the follower looks."""

    polls = 0

    def poll(self, *, early: bool = False):  # type: ignore[no-untyped-def]
        self.polls += 1
        return super().poll(early=early)


@linux
def test_file_changes_see_appends_truncation_and_replacement_of_the_file_only(tmp_path: Path) -> None:
    log = tmp_path / "kmsg.log"
    log.write_text("")
    changes = FileChanges.open(str(log))
    assert changes is not None
    try:
        assert not changes.changed()
        (tmp_path / "other").write_text("x")  # another file in the directory: not ours
        assert not changes.wait(0.2)
        with log.open("a") as fh:
            fh.write(LINE)
        assert changes.wait(5)
        assert not changes.changed()  # every event was read
        log.write_text("")  # truncated
        assert changes.wait(5)
        new = tmp_path / "kmsg.new"
        new.write_text(LINE)
        changes.changed()
        new.replace(log)  # replaced: another inode at the path
        assert changes.wait(5)
    finally:
        changes.close()


@linux
def test_the_follower_of_a_file_waits_on_inotify_and_does_not_poll(tmp_path: Path) -> None:
    log = tmp_path / "kmsg.log"
    log.write_text("kern  :info  : 2025-01-21T03:12:40,0+00:00 eth0: link up\n")
    tail = Counting(str(log), device=False)
    wake = threading.Event()
    follower = KernelFollower(tail, wake.set)
    follower.start()
    try:
        assert wake.wait(10)  # the full read at start
        wake.clear()
        time.sleep(0.5)
        assert follower.changes is not None
        idle_polls = tail.polls
        time.sleep(1.0)
        assert tail.polls - idle_polls <= 1  # at most the safety look; 20 with the old 50 ms poll
        with log.open("a") as fh:
            fh.write(LINE)
        assert wake.wait(10)
    finally:
        follower.stop()
        follower.join(5)
    assert not follower.is_alive()  # stop() wakes the wait at once


def test_the_follower_of_a_fifo_waits_on_poll_and_a_gone_writer_does_not_make_it_spin(tmp_path: Path) -> None:
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so the writer's open does not block
    wfd = os.open(fifo, os.O_WRONLY)
    os.write(wfd, b"6,0,100,-;Linux version 6.8.0\n")
    tail = Counting(str(fifo), device=True)
    wake = threading.Event()
    follower = KernelFollower(tail, wake.set)
    follower.start()
    try:
        assert wake.wait(10)
        wake.clear()
        time.sleep(0.5)
        idle_polls = tail.polls
        time.sleep(1.0)
        assert tail.polls - idle_polls <= 1  # poll(2) blocks until a record comes
        os.write(wfd, f"3,1,200,-;{XID79}\n".encode())
        assert wake.wait(10)
        os.close(wfd)
        wfd = -1
        time.sleep(0.5)
        gone = tail.polls
        time.sleep(1.0)
        assert tail.polls - gone <= 40  # POLLHUP for ever: polled every 50 ms, not in a busy loop
    finally:
        follower.stop()
        follower.join(5)
        if wfd >= 0:
            os.close(wfd)
        os.close(rfd)
    assert not follower.is_alive()


def test_a_snapshot_whose_kmsg_log_is_a_fifo_reads_it_as_the_device(tmp_path: Path) -> None:
    """bench/fault_to_taint --kmsg fifo: the live path's reader (one record at a time, poll(2)) in a
    snapshot-backed agent."""
    fifo = tmp_path / "kmsg.log"
    os.mkfifo(fifo)
    keep = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so the writer's open does not block
    wfd = os.open(fifo, os.O_WRONLY)
    try:
        src = SnapshotSource(tmp_path)
        assert src.kernel_tail.device
        os.write(wfd, f"3,1,200,-;{XID79}\n".encode())
        view = src.kernel()
        assert isinstance(view, KernelXids) and view.format == "kmsg"
        assert [(t.first.code, t.first.pci) for t in view.tallies] == [(79, "00000000:53:00.0")]
    finally:
        src.kernel_tail.forget()
        os.close(wfd)
        os.close(keep)
    assert not SnapshotSource(ROOT / "examples" / "snapshots" / "p5.48xlarge-healthy").kernel_tail.device
