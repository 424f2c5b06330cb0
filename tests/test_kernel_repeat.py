"""A storm read by its shape (agent.probes.kernel_repeat) is read exactly as line by line.

The tail slices lines of the shape of the last Xid line it parsed, and folds a second's worth of
wall-clock-stamped lines whose texts it knows into the ledger at once (issue 30: a 400,000-line
storm's CPU). The reference here is the same KernelTail that never learns a shape, so it reads
every line the slow way (LineReader, XidReader, one ledger add a line): the two must agree on every
view, counter and change, for the real recordings and for generated logs that mix formats, seconds,
reboots, damaged lines and the texts of one tally in any order."""

from __future__ import annotations

import itertools
import random
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.kernel import KernelRecord, XidEvent
from agent.probes.kernel_follow import KernelFollower
from agent.probes.kernel_log import clean_lines, garbled
from agent.probes.kernel_tail import Change, KernelTail
from agent.probes.xid_ledger import XidLedger

FIXTURES = Path(__file__).parent / "fixtures"
GPUS = ("53", "64", "75", "86")


class LineByLine(KernelTail):
    """The reference: no shape is ever learnt, so no line is sliced or folded in bulk."""

    def _learn(self, line: str, rec: KernelRecord) -> None:
        pass


def _state(tail: KernelTail) -> tuple[object, ...]:
    led = tail.ledger
    return (
        tail.view(),
        tail.lines_read,
        tail.records,
        tail.lost,
        dict(tail.lines.formats),
        led.version,
        led.now,
        led.untallied,
        {k: (t.first, t.latest, t.numbered, t.companions, t.win_start, t.win_count, t.prev_count, t.burst)
         for k, t in led.tallies.items()},
        dict(led.bursts),
        tail.xids.since_header,
    )  # fmt: skip


def _read_both(data: bytes, cuts: list[int]) -> tuple[KernelTail, KernelTail, list[tuple[Change, Change]]]:
    """Both tails fed the same chunks (cut at `cuts`), as polls are; each chunk's change compared."""
    fast, slow = (
        KernelTail("<fast>", device=False, clock=lambda: 7.0),
        LineByLine("<slow>", device=False, clock=lambda: 7.0),
    )
    changes = []
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(data)), len(data)]
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        got = []
        for tail in (fast, slow):
            tail.change, tail.urgent = Change.NONE, False
            tail._data(data[a:b], first=i == 0)
            tail._flush(at_end=b == len(data))
            got.append((tail.change, tail.urgent))
        changes.append((got[0], got[1]))
    return fast, slow, changes


def _assert_same(data: bytes, cuts: list[int]) -> KernelTail:
    fast, slow, changes = _read_both(data, cuts)
    assert all(f == s for f, s in changes)
    assert _state(fast) == _state(slow)
    return fast


RECORDINGS = sorted(
    p
    for d in ("xid-kernel-log", "kernel-log")
    for p in (FIXTURES / d).iterdir()
    if p.suffix in (".log", ".txt") and not p.name.endswith(".source.txt")
)


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name)
def test_every_real_recording_reads_the_same(path: Path) -> None:
    data = path.read_bytes()
    _assert_same(data, [])
    _assert_same(data, list(range(0, len(data), 4096)))  # polls that cut lines


# ------------------------------------------------------------------------------ generated logs

XID13 = (
    "NVRM: Xid (PCI:0000:{g}:00): 13, pid='{pid}', name=python3, Graphics SM Warp Exception (GPC {n}, SM 0)"
)
XID31 = "NVRM: Xid (PCI:0000:{g}:00): 31, pid={pid}, name=python3, Ch 00000010, MMU Fault @ 0x7f3a_{n:08x}"
TEXTS = (
    XID13,
    XID31,
    "NVRM: Xid (PCI:0000:{g}:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:{g}:00): 154, GPU recovery action changed from 0x0 (None) to 0x{n} (GPU Reset)",
    "NVRM: Xid (PCI:0000:{g}:00): 154, GPU recovery action changed",
    "   from 0x0 (None) to 0x2 (Node Reboot Required)",
    "NVRM: Xid (PCI:0000:{g}:00): 45, pid={pid}, name=python3, Ch 00000001 caused by previous Xid 79",
    "NVRM: GPU 0000:{g}:00.0: GPU has fallen off the bus.",
    "NVRM: The NVIDIA GPU 0000:{g}:00.0",
    "NVRM: fallen off the bus and is not responding to commands.",
    "nvidia 0000:{g}:00.0: enabling device (0000 -> 0003)",
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
    "pcieport 0000:{g}:00.0: AER: Uncorrected (Fatal) error received: 0000:{g}:00.0",
    "eth0: link up",
    "[ 12.345678] a stamp in the text",
    "NVRM: Xid (PCI:0000:{g}:00): 13, pid=1, bad\x01byte",
)


def _text(r: random.Random, new: bool = False) -> str:
    """A line's text; *new*: most texts never seen before (each its own pid and address)."""
    t = r.choice(TEXTS[:3]) if r.random() < 0.7 else r.choice(TEXTS)  # mostly a storm's texts
    if new:
        return t.format(g=r.choice(GPUS), pid=r.randrange(10**6), n=r.randrange(2**32))
    return t.format(g=r.choice(GPUS), pid=r.choice((4821, 4822, 99999)), n=r.choice((1, 2, 4, 8)))


def _line(r: random.Random, fmt: str, sec: int, seq: int, text: str) -> str:
    usec = r.randrange(1_000_000)
    stamp = f"2026-11-26T07:{sec // 60 % 60:02d}:{sec % 60:02d},{usec:06d}+00:00"
    if fmt == "decode":
        return f"kern  :{r.choice(('warn ', 'warn ', 'err  '))} : {stamp} {text}"
    if fmt == "iso":
        return f"{stamp} {text}"
    if fmt == "bad-stamp":  # the shape of a stamp, not a time: read when it is read
        return f"kern  :warn  : 2026-19-{sec % 60:02d}T07:99:{sec % 60:02d},{usec:06d}+00:00 {text}"
    if fmt == "kmsg":
        return f"4,{seq},{sec * 1_000_000 + usec},-;{text}"
    if fmt == "journal":
        return f"2026-11-26T07:{sec // 60 % 60:02d}:{sec % 60:02d}+0000 gpu-node-7 kernel: {text}"
    if fmt == "syslog":
        return f"Nov 26 07:{sec // 60 % 60:02d}:{sec % 60:02d} gpu-node-7 kernel: {text}"
    return text


FORMATS = ("decode", "decode", "iso", "bad-stamp", "kmsg", "journal", "syslog", "plain")


def _log(seed: int, n: int, new: bool = False) -> bytes:
    r = random.Random(seed)
    lines, sec, seq = [], 100, 1000
    fmt = r.choice(FORMATS)
    for _ in range(n):
        if r.random() < 0.05:
            fmt = r.choice(FORMATS)
        if r.random() < 0.1:
            sec += r.choice((1, 1, 2, 61, 200))  # most lines share their second with the one before
        if r.random() < 0.01:  # a reboot: the kmsg sequence and time start again
            seq, sec = 0, 1
        seq += 1 if r.random() < 0.95 else 3  # a few records lost
        pick = r.random()
        if pick < 0.01:
            lines.append("-- Boot 0123456789abcdef --")
        elif pick < 0.02:
            lines.append("")
        else:
            line = _line(r, fmt, sec, seq, _text(r, new))
            lines.append(line + "\r" if r.random() < 0.01 else line)
    return ("\n".join(lines) + "\n").encode()


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 3000), st.lists(st.integers(0, 400_000), max_size=8))
def test_generated_logs_read_the_same(seed: int, n: int, cuts: list[int]) -> None:
    _assert_same(_log(seed, n), cuts)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 3000), st.lists(st.integers(0, 400_000), max_size=8))
def test_generated_logs_of_new_texts_read_the_same(seed: int, n: int, cuts: list[int]) -> None:
    """Most texts new (each line its own pid or address): read by their heads (XidReader.known)."""
    _assert_same(_log(seed, n, new=True), cuts)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=40) | st.text(max_size=40).map(lambda t: t.encode()))
def test_a_read_is_clean_when_no_line_of_it_is_garbled(raw: bytes) -> None:
    """clean_lines looks at a whole read once; the answer is each line's garbled() together."""
    text = raw.decode("utf-8", errors="replace")
    assert clean_lines(raw, text) == (not any(garbled(line) for line in text.split("\n")))


# ------------------------------------------------------------------------------ the storm itself


def _storm(texts: list[str], per_second: int, seconds: int) -> bytes:
    out = []
    for s in range(seconds):
        for i in range(per_second):
            stamp = f"2026-11-26T07:50:{s:02d},{i:06d}+00:00"
            out.append(f"kern  :warn  : {stamp} {texts[i % len(texts)]}\n")
    return "".join(out).encode()


def test_a_storm_of_known_texts_is_folded_a_second_at_a_time() -> None:
    texts = [t.format(g=g, pid=4821, n=4) for g in GPUS for t in (XID13, XID31)]
    data = _storm(texts, 5000, 3)
    folded: list[int] = []

    class Counting(KernelTail):
        def _fold(self, kinds: list[object], events: list[XidEvent], wallclock: str, fmt: str) -> None:
            folded.append(len(kinds))
            super()._fold(kinds, events, wallclock, fmt)

    tail = Counting("<x>", device=False)
    tail._data(data, first=True)
    assert sum(folded) > 14_900 and len(folded) <= 3  # all but the first line of each text
    view = tail.view()
    assert {(t.first.code, t.first.pci): t.count for t in view.tallies} == {
        (c, f"00000000:{g}:00.0"): 1875 for g in GPUS for c in (13, 31)
    }
    _assert_same(data, [len(data) // 3])


AMID = (  # lines amid a storm of new texts that its heads alone must not read
    "NVRM: Xid (PCI:0000:53:00): 13, pid=7, name=AERsim, Graphics SM Warp Exception",  # says AER
    "NVRM: Xid (PCI:0000:53:00): 45, pid=7, name=python3, Ch 00000001 caused by previous Xid 79",
    "NVRM: Xid (PCI:0000:53:00): 13, pid=7, bad\x01byte",  # garbled: no evidence
    "NVRM: Xid (PCI:0000:64:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset)",
    "NVRM: Xid (PCI:0000:64:00): 154, GPU recovery action changed",  # its action on the next line
    "   from 0x0 (None) to 0x2 (Node Reboot Required)",
    "NVRM: Xid (PCI:0000:75:00): 149, NETIR_LINK_EVT  Fatal  XC0 i0 Link 09 (0x025525c6 0x00000000 0x0)",
    "NVRM: Xid (PCI:0000:53:00): 13,pid=7, no space after the comma",
    "NVRM: Xid (PCI:0000:53:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
)


def test_a_storm_of_new_texts_is_read_by_their_heads_as_line_by_line() -> None:
    """The bench's pids storm (each line its own pid, each Xid 31 its own address), more new texts
    a second than the memo holds, with lines amid it that a head does not tell (AER in the text, a
    cause, a damaged line, Xid 154 and 149, an Xid 79): read exactly as line by line, and almost
    every line folded a second at a time."""
    out, k = [], 0
    for s in range(3):
        for i in range(1500):
            code, g = k % 2, GPUS[k // 2 % len(GPUS)]
            text = (XID13 if code == 0 else XID31).format(g=g, pid=20000 + 37 * (k % 977), n=k)
            if i % 97 == 50:
                text = AMID[k % len(AMID)]
            elif i % 89 == 0 and out:
                text = out[-3].split(" ", 5)[-1]  # a text seen three lines ago: the memo's
            out.append(f"kern  :warn  : 2026-11-26T07:50:{s:02d},{i:06d}+00:00 {text}")
            k += 1
    data = ("\n".join(out) + "\n").encode()
    folded: list[int] = []

    class Counting(KernelTail):
        def _fold(self, kinds: list[object], events: list[XidEvent], wallclock: str, fmt: str) -> None:
            folded.append(len(kinds))
            super()._fold(kinds, events, wallclock, fmt)

    tail = Counting("<x>", device=False, clock=lambda: 7.0)
    tail._data(data, first=True)
    assert _state(tail) == _state(_assert_same(data, []))
    _assert_same(data, [len(data) // 3, len(data) // 2 + 7])  # polls that cut lines
    assert sum(folded) > 0.9 * len(out)
    tallies = {(t.first.code, t.first.pci): t for t in tail.view().tallies}
    assert (79, "00000000:53:00.0") in tallies and (149, "00000000:75:00.0") in tallies
    last13 = next(line for line in reversed(out) if "(PCI:0000:86:00): 13, pid=" in line)
    latest = tallies[(13, "00000000:86:00.0")].latest
    assert last13.endswith(latest.message) and latest.wallclock is not None and latest.wallclock in last13


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify")
def test_a_fault_after_a_storm_of_new_texts_is_still_seen(tmp_path: Path) -> None:
    """The follower on a growing kmsg.log, as on a snapshot node: a pids storm (each line its own
    pid, each Xid 31 its own address, far more texts than the memo holds) appended in batches a
    second of log time apart, then an Xid 79 on a GPU the storm was on. The storm is read by the
    texts' heads and folded, every line counted; the 79 is a new tally that wakes the engine."""
    log = tmp_path / "kmsg.log"
    log.write_text("kern  :info  : 2026-11-26T07:49:59,000000+00:00 eth0: link up\n")
    folded: list[int] = []

    class Counting(KernelTail):
        def _fold(self, kinds: list[object], events: list[XidEvent], wallclock: str, fmt: str) -> None:
            folded.append(len(kinds))
            super()._fold(kinds, events, wallclock, fmt)

    tail = Counting(str(log), device=False)
    woken: list[float] = []
    wake = threading.Event()

    def trigger() -> None:
        woken.append(time.monotonic())
        wake.set()

    follower = KernelFollower(tail, trigger)
    follower.start()
    batches, per_batch, k = 10, 4000, 0
    try:
        assert wake.wait(30)  # the whole log at start
        for s in range(batches):
            lines = []
            for i in range(per_batch):
                code, g = k % 2, GPUS[k // 2 % len(GPUS)]
                text = (XID13 if code == 0 else XID31).format(g=g, pid=20000 + 37 * (k % 977), n=k)
                lines.append(f"kern  :warn  : 2026-11-26T07:50:{s:02d},{i:06d}+00:00 {text}\n")
                k += 1
            with log.open("a") as fh:
                fh.write("".join(lines))
            time.sleep(0.05)
        deadline = time.monotonic() + 60
        while tail.lines_read < 1 + batches * per_batch:  # the storm read (on a loaded machine: late)
            assert time.monotonic() < deadline, tail.lines_read
            time.sleep(0.05)
        wake.clear()
        written = time.monotonic()
        with log.open("a") as fh:
            fh.write(
                "kern  :crit  : 2026-11-26T07:50:30,000000+00:00 NVRM: Xid (PCI:0000:53:00): 79, "
                "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
            )
        assert wake.wait(30), "the Xid 79 after the storm did not wake the engine"
        assert woken[-1] >= written
    finally:
        follower.stop()
        follower.join(5)
    tallies = {(t.first.code, t.first.pci): t for t in tail.view().tallies}
    assert tallies[(79, "00000000:53:00.0")].count == 1
    storm = sum(t.count for (code, _), t in tallies.items() if code in (13, 31))
    assert storm == batches * per_batch  # every line of the storm counted
    assert sum(folded) > 0.9 * storm  # read by the heads and folded, not line by line


def test_the_latest_line_of_a_tally_is_the_last_one_read_whatever_its_text() -> None:
    """Two texts of one tally (one GPU's Xid 13 on two SMs) in one second: the tally's latest is
    the text of the last line, as line by line."""
    a, b = XID13.format(g="53", pid=1, n=1), XID13.format(g="53", pid=1, n=2)
    for order in ([a, b, a, b, a], [a, b, b], [b, a, a, b], [a, a, a, b]):
        data = "".join(
            f"kern  :warn  : 2026-11-26T07:50:01,{i:06d}+00:00 {t}\n" for i, t in enumerate([a, b, *order])
        )
        tail = _assert_same(data.encode(), [])
        (tally,) = tail.view().tallies
        assert (
            tally.latest.message.endswith(order[-1].split("NVRM: ", 1)[1]) and tally.count == len(order) + 2
        )


# ------------------------------------------------------------------------------ the ledger's n lines at once

GPU53, GPU64 = "00000000:53:00.0", "00000000:64:00.0"
EVENTS = (
    XidEvent(13, GPU53, "Xid (PCI:0000:53:00): 13, pid=1, SM 0"),
    XidEvent(13, GPU53, "Xid (PCI:0000:53:00): 13, pid=1, SM 1"),
    XidEvent(79, GPU53, "GPU 0000:53:00.0: GPU has fallen off the bus."),  # a companion line
    XidEvent(79, GPU53, "Xid (PCI:0000:53:00): 79, GPU has fallen off the bus."),
    XidEvent(154, GPU64, "Xid (PCI:0000:64:00): 154, ... to 0x1 (GPU Reset)", recovery_action="GPU Reset"),
    XidEvent(154, GPU64, "Xid 154 ... to 0x2 (Node Reboot)", recovery_action="Node Reboot", wrapped=True),
    XidEvent(20034, "00000000:05:00.0", "SXid (PCI:0000:05:00.0): 20034, Fatal", sxid=True),
)  # fmt: skip


def _ledger_state(led: XidLedger) -> tuple[object, ...]:
    return (
        led.version, led.now, led.untallied, dict(led.bursts),
        {k: (t.first, t.latest, t.numbered, t.companions, t.win_start, t.win_count, t.prev_count, t.burst,
             t.first_companion) for k, t in led.tallies.items()},
    )  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, len(EVENTS) - 1),
            st.sampled_from((0.0, 30.0, 61.0, 100.0, 250.0, 500.0)),
            st.integers(1, 5),
        ),
        max_size=20,
    )
)  # fmt: skip
def test_n_lines_at_once_are_n_lines_one_by_one(steps: list[tuple[int, float, int]]) -> None:
    at_once, one_by_one = XidLedger(lambda: 0.0), XidLedger(lambda: 0.0)
    for i, t, n in steps:
        news = at_once.add_at(EVENTS[i], t, n)
        assert news == any([one_by_one.add_at(EVENTS[i], t) for _ in range(n)])
        assert _ledger_state(at_once) == _ledger_state(one_by_one)


def test_a_new_boot_on_a_known_text_of_the_same_shape_drops_the_earlier_boot() -> None:
    """kmsg records whose sequence number goes back (a reboot) while text and digit counts stay:
    the fast path sees the boot, as line by line (it used to count the record twice and miss it)."""
    xid = XID13.format(g="53", pid=1, n=1)
    before = "".join(f"4,{5000 + i},{5_000_000 + i},-;{xid}\n" for i in range(50))
    after = "".join(f"4,{1000 + i},{1_000_000 + i},-;{xid}\n" for i in range(3))
    tail = _assert_same((before + after).encode(), [len(before)])
    assert [t.count for t in tail.view().tallies] == [3] and tail.records == 3
