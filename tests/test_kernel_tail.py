"""The kernel log read incrementally (agent.probes.kernel_tail): each record once, the whole log only
at start and after an overrun, truncation or replacement; bounded whatever the log's length.

/dev/kmsg is faked at the syscall layer (tests/fakes/kmsg.py) or stood in for by a real FIFO; a
snapshot's kmsg.log is a real file that grows, is truncated and is replaced."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.checks.xid import check_xid
from agent.config import Config
from agent.core.facts import NodeFacts
from agent.core.kernel import KernelXids
from agent.core.probed import ProbeError
from agent.core.severity import Severity, Status
from agent.probes.kernel_follow import KernelFollower
from agent.probes.kernel_tail import Change, KernelTail, fold_kernel_text
from agent.probes.live import LiveSource
from agent.probes.snapshot import SnapshotSource
from agent.probes.xid_ledger import MAX_KEYS
from tests.conftest import live_cfg
from tests.fakes.kmsg import FakeKmsg

ROOT = Path(__file__).resolve().parent.parent
XK = Path(__file__).parent / "fixtures" / "xid-kernel-log"
KL = Path(__file__).parent / "fixtures" / "kernel-log"
XID79 = "NVRM: Xid (PCI:0000:53:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID13 = (
    "NVRM: Xid (PCI:0000:38:00): 13, pid='1234', name=python, Graphics SM Warp Exception on "
    "(GPC 8, TPC 5, SM 0): Out Of Range Address"
)
XID31 = "NVRM: Xid (PCI:0000:38:00): 31, pid=1234, name=python, Ch 00000008, intr 00000000. MMU Fault"


def _tallies(view: object) -> dict[tuple[int, str | None], int]:
    assert isinstance(view, KernelXids)
    return {(t.first.code, t.first.pci): t.count for t in view.tallies}


# --------------------------------------------------------------------------- /dev/kmsg (syscall fake)


def test_device_reads_the_ring_at_start_then_only_new_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kmsg = FakeKmsg(tmp_path / "kmsg", monkeypatch)
    kmsg.write("Linux version 6.8.0", prio=5)
    kmsg.write(XID79)  # before the agent started: still found
    src = LiveSource(live_cfg(), kmsg_path=kmsg.path)
    assert _tallies(src.kernel()) == {(79, "00000000:53:00.0"): 1}
    assert kmsg.reads == 3  # two records and the EAGAIN
    for _ in range(500):
        kmsg.write(XID13)
    kmsg.write("eth0: link up", prio=6)
    reads_before = kmsg.reads
    view = src.kernel()
    assert _tallies(view) == {(79, "00000000:53:00.0"): 1, (13, "00000000:38:00.0"): 500}
    assert kmsg.reads - reads_before == 502  # one read per new record, plus the EAGAIN: none re-read
    assert src.kernel_tail.lines_read == 503 and src.kernel_tail.full_reads == 1
    assert isinstance(view, KernelXids) and view.records == 503 and view.format == "kmsg" and view.lost == 0


def test_device_overrun_epipe_goes_on_with_the_oldest_record_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kmsg = FakeKmsg(tmp_path / "kmsg", monkeypatch, capacity=50)
    kmsg.write(XID79)
    tail = KernelTail(kmsg.path, device=True)
    assert tail.poll() is Change.NEW
    for _ in range(200):  # the ring (50 records) overwrites 150 records the reader has not read
        kmsg.write(XID13)
    kmsg.write(XID31)
    assert tail.poll() is Change.NEW
    view = tail.view()
    assert tail.full_reads == 2  # start, and the overrun
    assert view.lost == 151  # seq 1..151 overwritten before we read them (the ring keeps 152..201)
    assert _tallies(view) == {
        (79, "00000000:53:00.0"): 1,
        (13, "00000000:38:00.0"): 49,
        (31, "00000000:38:00.0"): 1,
    }


def test_a_fifo_stands_in_for_the_device(tmp_path: Path) -> None:
    """A real FIFO: EAGAIN when caught up (a writer is open), records appended later are read on."""
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so the writer's open does not block
    wfd = os.open(fifo, os.O_WRONLY)
    try:
        os.write(wfd, f"4,1,100,-;{XID13}\n".encode())
        tail = KernelTail(str(fifo), device=True)
        box: list[Change] = []
        t = threading.Thread(target=lambda: box.append(tail.poll()))
        t.start()
        t.join(30)
        assert box == [Change.NEW]
        os.write(wfd, f"4,2,200,-;{XID13}\n".encode())
        os.write(wfd, f"4,3,300,-;{XID79}\n".encode())
        assert tail.poll() is Change.NEW
        assert _tallies(tail.view()) == {(13, "00000000:38:00.0"): 2, (79, "00000000:53:00.0"): 1}
        assert tail.poll() is Change.NONE
    finally:
        os.close(wfd)
        os.close(rfd)
        tail.forget()


def test_follower_on_the_device_wakes_the_engine_for_a_new_xid_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kmsg = FakeKmsg(tmp_path / "kmsg", monkeypatch)
    kmsg.write(XID13)
    src = LiveSource(live_cfg(), kmsg_path=kmsg.path)
    wake = threading.Event()
    follower = KernelFollower(src.kernel_tail, wake.set)
    follower.start()
    try:
        assert wake.wait(10)  # the full read at start
        wake.clear()
        for _ in range(100):
            kmsg.write(XID13)  # only counts move: no wake-up before COUNTS_EVERY_S
        assert not wake.wait(0.5)
        kmsg.write(XID79)
        assert wake.wait(10)
        assert _tallies(src.kernel()) == {(13, "00000000:38:00.0"): 101, (79, "00000000:53:00.0"): 1}
    finally:
        follower.stop()
        follower.join(5)


# --------------------------------------------------------------------------- a snapshot's kmsg.log


def _snap(tmp_path: Path, text: str) -> SnapshotSource:
    (tmp_path / "kmsg.log").write_text(text)
    return SnapshotSource(tmp_path)


def test_growing_file_is_read_from_where_it_stopped(tmp_path: Path) -> None:
    real = (KL / "gpud-h100-boot-dmesg-decode-iso-no-xid.log").read_text()
    src = _snap(tmp_path, real)
    view = src.kernel()
    assert _tallies(view) == {}
    lines = src.kernel_tail.lines_read
    assert lines == len(real.splitlines())  # each line once
    with (tmp_path / "kmsg.log").open("a") as fh:
        fh.write(f"kern  :warn  : 2025-01-21T03:12:40,000001+00:00 {XID79}\n")
    assert _tallies(src.kernel()) == {(79, "00000000:53:00.0"): 1}
    with (tmp_path / "kmsg.log").open("a") as fh:
        fh.write(f"kern  :warn  : 2025-01-21T03:12:41,000001+00:00 {XID13}")  # no newline at the end
    assert _tallies(src.kernel()) == {(79, "00000000:53:00.0"): 1, (13, "00000000:38:00.0"): 1}
    assert src.kernel() == src.kernel()  # nothing new: nothing read, the same view
    assert src.kernel_tail.lines_read == lines + 2 and src.kernel_tail.full_reads == 1


def test_truncated_or_replaced_file_is_read_again_from_the_top(tmp_path: Path) -> None:
    src = _snap(tmp_path, f"[ 10.0] {XID79}\n[ 11.0] {XID13}\n")
    assert len(_tallies(src.kernel())) == 2
    (tmp_path / "kmsg.log").write_text(f"[ 12.0] {XID31}\n")  # truncated, shorter
    assert _tallies(src.kernel()) == {(31, "00000000:38:00.0"): 1}
    assert src.kernel_tail.full_reads == 2
    new = tmp_path / "kmsg.new"
    new.write_text(f"[ 12.0] {XID13}\n")
    os.replace(new, tmp_path / "kmsg.log")  # replaced (log rotation), same size as before
    assert _tallies(src.kernel()) == {(13, "00000000:38:00.0"): 1}
    assert src.kernel_tail.full_reads == 3
    with (tmp_path / "kmsg.log").open("r+") as fh:  # rewritten in place with other first bytes, longer
        fh.write(f"[ 13.0] {XID79}\n[ 14.0] {XID79}\n")
    assert _tallies(src.kernel()) == {(79, "00000000:53:00.0"): 2}
    assert src.kernel_tail.full_reads == 4


def test_file_gone_is_not_captured_and_read_whole_when_back(tmp_path: Path) -> None:
    src = _snap(tmp_path, f"[ 10.0] {XID79}\n")
    assert len(_tallies(src.kernel())) == 1
    (tmp_path / "kmsg.log").unlink()
    assert not isinstance(src.kernel(), (KernelXids, ProbeError))
    (tmp_path / "kmsg.log").write_text(f"[ 10.0] {XID13}\n")
    assert _tallies(src.kernel()) == {(13, "00000000:38:00.0"): 1}


def test_binary_file_is_unreadable_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "kmsg.log").write_bytes(b"\x00" * 4096 + XID79.encode())
    assert isinstance(SnapshotSource(tmp_path).kernel(), ProbeError)


def test_a_new_boot_in_the_appended_lines_drops_the_earlier_boot(tmp_path: Path) -> None:
    src = _snap(tmp_path, f"4,100,5000000,-;{XID79}\n")
    assert len(_tallies(src.kernel())) == 1
    with (tmp_path / "kmsg.log").open("a") as fh:
        fh.write(f"6,0,1000,-;Linux version 6.8.0\n4,1,2000,-;{XID13}\n")  # seq and time start again
    assert _tallies(src.kernel()) == {(13, "00000000:38:00.0"): 1}


# --------------------------------------------------------------------------- bounded state, storms


def test_state_is_bounded_by_distinct_findings_not_lines() -> None:
    lines = [f"4,{i},{1_000_000 + i * 10},-;{XID13}" for i in range(100_000)]
    view = fold_kernel_text("\n".join(lines) + "\n")
    assert _tallies(view) == {(13, "00000000:38:00.0"): 100_000} and view.records == 100_000
    many = [
        f"4,{i},{i},-;NVRM: Xid (PCI:{i // 256:04x}:{i % 256:02x}:00): 13, x" for i in range(MAX_KEYS + 100)
    ]
    view = fold_kernel_text("\n".join(many) + "\n")
    assert len(view.tallies) == MAX_KEYS and view.untallied == 100


def _storm(n: int, per_s: float) -> str:
    step = int(1e6 / per_s)
    return "".join(f"4,{i},{1_000_000 + i * step},-;{XID13 if i % 2 else XID31}\n" for i in range(n))


def test_an_application_fault_storm_is_monitor_with_its_rate(cfg: Config) -> None:
    res = check_xid(NodeFacts(kernel=fold_kernel_text(_storm(4000, 40))), cfg)  # 40 lines/s for 100 s
    assert res.status is Status.WARN and res.severity is Severity.MONITOR
    (f13,) = [f for f in res.findings if f.rule == "xid.13"]
    assert "×2000, 1201/min (storm)" in f13.message and f13.severity is Severity.MONITOR  # sliding window


def test_the_same_faults_spread_out_are_not_a_storm(cfg: Config) -> None:
    res = check_xid(NodeFacts(kernel=fold_kernel_text(_storm(400, 1))), cfg)  # 1 line/s
    assert res.status is Status.PASS and res.severity is Severity.NONE
    assert {f.rule for f in res.findings} == {"xid.13", "xid.31"}
    assert all("storm" not in f.message for f in res.findings)


def test_a_storm_that_stopped_decays_as_the_kernel_logs_on(cfg: Config) -> None:
    storm = _storm(4000, 40)  # kmsg records: 100 s of storm
    later = "".join(
        f"6,{5000 + i},{1_000_000 + 100_000_000 + (i + 1) * 10_000_000},-;eth0: link up\n" for i in range(13)
    )
    res = check_xid(NodeFacts(kernel=fold_kernel_text(storm + later)), cfg)  # 130 s of other lines later
    assert res.severity is Severity.NONE
    assert all("storm" not in f.message for f in res.findings)


@settings(max_examples=60, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(list("NVRM: Xid (PCI:0000:3b:00): 79,13 154 AER\n[]0123.>-,;kern")),
        max_size=400,
    )
)
def test_any_text_folds_without_an_error(text: str) -> None:
    view = fold_kernel_text(text)
    assert view.records <= text.count("\n") + 1 and len(view.tallies) <= MAX_KEYS
