"""Kernel log parser: every real fixture, each line format, boot boundaries, live kmsg reads, fuzz."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.kernel import KernelLog
from agent.core.probed import ParseError
from agent.probes.kernel_log import parse_kernel_log, read_kmsg_live

FIX = Path(__file__).parent / "fixtures"
XK = FIX / "xid-kernel-log"
KL = FIX / "kernel-log"


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _real(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if not p.name.endswith(".source.txt") and "DERIVED" not in p.name)


# --------------------------------------------------------------------------- real fixtures


@pytest.mark.parametrize("path", _real(XK) + _real(KL), ids=lambda p: p.name)
def test_every_real_fixture_parses(path: Path) -> None:
    log = parse_kernel_log(_read(path))
    assert isinstance(log, KernelLog)
    assert all(r.message == r.message.strip("\n") for r in log.records)


def test_h100_boot_dmesg_decode_iso() -> None:
    text = _read(KL / "gpud-h100-boot-dmesg-decode-iso-no-xid.log")
    log = parse_kernel_log(text)
    non_blank = [ln for ln in text.split("\n") if ln.strip()]
    assert len(log.records) == len(non_blank) == 2362  # 2381 lines, 19 of them blank
    assert log.format == "dmesg"
    first = log.records[0]
    assert first.message == "pci_bus 0000:d7: on NUMA node 5"
    assert first.wallclock == "2025-01-17T15:36:15,345059+00:00"
    assert first.priority == 7  # debug


def test_dmesg_iso_without_decode() -> None:
    log = parse_kernel_log(_read(XK / "gpud-h100-xid48-63-94-dbe-rowremap-iso.log"))
    assert log.format == "dmesg"
    assert log.records[0].message.startswith("nvidia-peermem nv_get_p2p_free_callback:127 ERROR")
    assert log.records[0].wallclock == "2024-11-15T05:39:15,491363+00:00"


def test_kmsg_raw_records() -> None:
    log = parse_kernel_log(_read(KL / "gpud-kmsg-raw-nvswitch-open.log"))
    assert log.format == "kmsg"
    r = log.records[0]
    assert (r.priority, r.seq, r.ts_us, r.message) == (
        6,
        3964,
        206764307,
        "nvidia-nvswitch2: open (major=510)",
    )
    seqs = [r.seq for r in log.records if r.seq is not None]
    assert seqs == sorted(seqs)


def test_journalctl_short_iso() -> None:
    log = parse_kernel_log(_read(KL / "gpud-journalctl-short-iso-a800-docker.log"))
    assert log.format == "journalctl-short-iso"
    assert len(log.records) == 11
    assert log.records[0].message == "docker0: port 1(vetha17b2cc) entered disabled state"
    assert log.records[0].wallclock == "2025-01-02T15:20:12+0800"


def test_syslog_keeps_only_kernel_lines() -> None:
    log = parse_kernel_log(_read(KL / "issue-gpud-pr1209-gpu-node-journalctl-k-mlx5-context-EXCERPT.log"))
    assert log.format == "syslog"
    assert [r.message for r in log.records] == [
        "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link INIT",
        "workqueue: ib_cache_event_task [ib_core] hogged CPU for >10000us 4 times, "
        "consider switching to WQ_UNBOUND",
        "EXT4-fs (md127p3): re-mounted 0f3cd65a-338b-4574-bba3-ecef214e1917 r/w. Quota mode: none.",
        "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE",
    ]
    # a syslog file with only user-space programs holds no kernel record
    assert parse_kernel_log(_read(KL / "aznhc-azure-ib6-link-flap-syslog.log")).records == ()


def test_talos_remote_prefix() -> None:
    log = parse_kernel_log(
        _read(KL / "issue-open-gpu-1118-a100x8-talos-kern-warning-gsp-rpc-history-EXCERPT.log")
    )
    assert len(log.records) == 6
    r = log.records[0]
    assert r.message.startswith("NVRM:      0    76   GSP_RM_CONTROL")
    assert r.wallclock == "2026-04-22T21:27:51.288830314Z"
    assert r.priority == 4


def test_blockquote_is_unquoted() -> None:
    log = parse_kernel_log(_read(XK / "gpud-hgx-xid79-fallen-off-bus-plus-sxid20034-BLOCKQUOTE.txt"))
    assert len(log.records) == 13  # 25 lines: 13 records, 12 lone ">" lines
    assert log.records[0].message == "NVRM: GPU at PCI:0000:91:00: GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b"
    assert log.records[0].ts_us == 6781741548768
    assert not any(r.message.startswith(">") for r in log.records)


def test_unprefixed_lines_are_plain_messages() -> None:
    text = _read(XK / "issue-gpud-pr1160-1174-blackwell-nvlink-xid144-145-149-lines.log")
    log = parse_kernel_log(text)
    assert log.format == "plain"
    assert [r.message for r in log.records] == [ln for ln in text.split("\n") if ln]


# --------------------------------------------------------------------------- line formats without a fixture


@pytest.mark.parametrize(
    ("line", "message", "ts_us", "wallclock"),
    [
        ("[ 1234.567890] NVRM: loading", "NVRM: loading", 1234567890, None),
        ("[    0.000000] Linux version 6.8.0", "Linux version 6.8.0", 0, None),
        ("kern  :info  : [ 1234.56] msg here", "msg here", 1234560000, None),
        ("2024-06-20T21:24:53,799999+00:00 msg", "msg", None, "2024-06-20T21:24:53,799999+00:00"),
        ("[Thu Jun 20 21:24:53 2024] msg", "msg", None, "Thu Jun 20 21:24:53 2024"),
        ("2024-06-20T21:24:53+0000 host kernel: msg", "msg", None, "2024-06-20T21:24:53+0000"),
        ("Jun 20 21:24:53 host kernel: [123.45] msg", "msg", 123450000, "Jun 20 21:24:53"),
        ("Jun  2 01:02:03 host kernel: msg", "msg", None, "Jun  2 01:02:03"),
        ("10.0.0.1: kern: err: [2026-04-22T21:27:51Z]: msg", "msg", None, "2026-04-22T21:27:51Z"),
        ("6,1234,5678901,-;msg", "msg", 5678901, None),
        ("just some text", "just some text", None, None),
    ],
)
def test_line_formats(line: str, message: str, ts_us: int | None, wallclock: str | None) -> None:
    (rec,) = parse_kernel_log(line + "\n").records
    assert (rec.message, rec.ts_us, rec.wallclock) == (message, ts_us, wallclock)


def test_kmsg_continuation_lines_are_dropped() -> None:
    text = (
        "3,812,12000000,-;nvidia 0000:3b:00.0: enabling device\n"
        " SUBSYSTEM=pci\n"
        " DEVICE=+pci:0000:3b:00.0\n"
        "6,813,12000100,-;next\n"
    )
    log = parse_kernel_log(text)
    assert [r.message for r in log.records] == ["nvidia 0000:3b:00.0: enabling device", "next"]
    assert log.records[0].priority == 3


def test_journal_meta_lines_are_skipped() -> None:
    text = (
        "-- Logs begin at Thu 2024-06-20 21:00:00 UTC, end at Thu 2024-06-20 22:00:00 UTC. --\n"
        "2024-06-20T21:24:53+0000 host kernel: a\n"
        "-- No entries --\n"
    )
    assert [r.message for r in parse_kernel_log(text).records] == ["a"]


def test_partly_quoted_file_keeps_its_text() -> None:
    text = "> [1.0] quoted\nnot quoted\n"
    assert [r.message for r in parse_kernel_log(text).records] == ["> [1.0] quoted", "not quoted"]


# --------------------------------------------------------------------------- current boot only


def test_journal_boot_separator_keeps_last_boot() -> None:
    path = KL / "gpud-journalctl-short-iso-peermem-errors-DERIVED-two-boots-xid-in-earlier-boot.log"
    log = parse_kernel_log(_read(path))
    assert not any("Xid" in r.message for r in log.records)
    original = parse_kernel_log(_read(KL / "gpud-journalctl-short-iso-peermem-errors.log"))
    assert log.records == original.records[6:]


def test_kmsg_sequence_restart_keeps_last_boot() -> None:
    log = parse_kernel_log(
        _read(KL / "gpud-kmsg-raw-nvswitch-open-DERIVED-two-boots-xid-in-earlier-boot.log")
    )
    assert [r.seq for r in log.records] == list(range(1, 11))
    assert not any("Xid" in r.message for r in log.records)


def test_dmesg_timestamp_drop_is_a_reboot() -> None:
    text = "[  500.000000] old boot\n[  900.100000] NVRM: Xid (PCI:0000:3b:00): 79, x\n[    0.000000] Linux\n"
    assert [r.message for r in parse_kernel_log(text).records] == ["Linux"]


def test_small_timestamp_jitter_is_not_a_reboot() -> None:
    text = "[  900.100000] a\n[  900.099000] b\n"
    assert len(parse_kernel_log(text).records) == 2


# --------------------------------------------------------------------------- bad input


def test_empty_log_is_zero_records() -> None:
    assert parse_kernel_log("").records == ()
    assert parse_kernel_log("\n\n  \n").records == ()


def test_nul_bytes_are_not_a_log() -> None:
    with pytest.raises(ParseError):
        parse_kernel_log("\x00" * 100 + "abc")


def test_truncated_fixture_lines_still_parse() -> None:
    text = _read(XK / "gpud-h100-xid13-43-dmesg-decode-iso.log")
    for cut in (1, 17, 40, len(text) // 2, len(text) - 5):
        log = parse_kernel_log(text[:cut])
        assert isinstance(log, KernelLog)


@given(st.text())
@settings(max_examples=300)
def test_fuzz_text(text: str) -> None:
    try:
        log = parse_kernel_log(text)
    except ParseError:
        return
    assert isinstance(log, KernelLog)


@given(st.binary())
@settings(max_examples=300)
def test_fuzz_binary(data: bytes) -> None:
    try:
        log = parse_kernel_log(data.decode("utf-8", errors="replace"))
    except ParseError:
        return
    assert isinstance(log, KernelLog)


# --------------------------------------------------------------------------- live read


def test_read_kmsg_live_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_bytes((KL / "gpud-kmsg-raw-nvswitch-open.log").read_bytes())
    log = read_kmsg_live(str(path), timeout_s=5.0)
    assert log.format == "kmsg"
    assert len(log.records) == len(parse_kernel_log(_read(KL / "gpud-kmsg-raw-nvswitch-open.log")).records)


def test_read_kmsg_live_fifo_stops_at_eagain(tmp_path: Path) -> None:
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    # Keep a writer open so the reader sees EAGAIN (no data now), not EOF.
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    wfd = os.open(fifo, os.O_WRONLY)
    try:
        os.write(wfd, b"6,1,100,-;first\n6,2,200,-;second\n")
        result: list[KernelLog] = []
        t = threading.Thread(target=lambda: result.append(read_kmsg_live(str(fifo), timeout_s=5.0)))
        t.start()
        t.join(30)
        assert not t.is_alive()
        assert [r.message for r in result[0].records] == ["first", "second"]
    finally:
        os.close(wfd)
        os.close(rfd)


def test_read_kmsg_live_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_kmsg_live(str(tmp_path / "absent"))


def test_read_kmsg_live_epipe_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/dev/kmsg answers EPIPE once when records were overwritten; the next read goes on."""
    import errno

    path = tmp_path / "kmsg"
    path.write_bytes(b"")
    replies: list[bytes | OSError] = [
        b"6,10,100,-;before\n",
        OSError(errno.EPIPE, "Broken pipe"),
        b"6,15,300,-;after\n",
        BlockingIOError(errno.EAGAIN, "again"),
    ]

    def fake_read(fd: int, n: int) -> bytes:
        reply = replies.pop(0)
        if isinstance(reply, OSError):
            raise reply
        return reply

    monkeypatch.setattr(os, "read", fake_read)
    log = read_kmsg_live(str(path), timeout_s=5.0)
    assert [r.message for r in log.records] == ["before", "after"]
    assert replies == []
