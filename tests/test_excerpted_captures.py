"""A verdict true to every real capture (issue 23): three classes of input that real captures take
once people keep, excerpt and paste them, each rebuilt from a recording in tests/fixtures/ by
tests/fixtures/derived/make_real_shape_variants.py (the .source.txt of each says how).

1. A capture kept without its final newline: the last line is complete, so it is evidence. A last
   line is a cut only when it is incomplete by its parser's own grammar.
2. An excerpt holding only the driver's "caused by previous Xid N" lines: the cause is reported on
   its GPU, the consequential Xid 45s are its consequence, not application faults.
3. A `dmesg -H` excerpt with relative stamps only: its lines are this boot's, and an AER fatal error
   on a device the `nvidia` driver owns is a GPU's, without any inventory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.checks.registry import run_checks, select
from agent.checks.xid import check_xid
from agent.config import Config
from agent.core.facts import NodeFacts
from agent.core.findings import CheckResult
from agent.core.gpu import Gpu, GpuInventory
from agent.core.probed import ParseError
from agent.core.severity import Severity, Status
from agent.probes.kernel_tail import fold_kernel_text
from agent.probes.nvlink import parse_nvlink
from agent.probes.nvsmi_text import parse_nvsmi_text
from agent.probes.nvsmi_xml import parse_nvsmi_xml
from agent.probes.snapshot import SnapshotSource
from agent.probes.source import gather_facts
from agent.probes.topo import parse_topo
from tests.conftest import cfg

ROOT = Path(__file__).resolve().parent.parent
FIX = Path(__file__).parent / "fixtures"
CFG = cfg()


def _judge(tmp: Path, name: str, data: bytes, itype: str) -> dict[str, CheckResult]:
    """Every check on a snapshot holding this one file, by the path `check --from-snapshot` takes."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "instance-type").write_text(itype + "\n")
    (tmp / name).write_bytes(data)
    facts = gather_facts(SnapshotSource(tmp), CFG)
    return {r.name: r for r in run_checks(select(None, CFG), facts, CFG)}


# ---------------------------------------------------------------- 1. no final newline

NO_NEWLINE = [
    ("nvlink/awsome-p4de-a100-gpu0-nvlink-s", "nvidia-smi-nvlink-s.txt", "p4de.24xlarge", ("nvlink-speed",)),
    (
        "nvidia-smi-topo/issue-sglang-30401-h100x8-8nic-mlx5-topo-m-full",
        "nvidia-smi-topo-m.txt",
        "p5.48xlarge",
        ("topology",),
    ),
    ("nvidia-smi-q/gpud-h100x8-535.183.01", "nvidia-smi-q.txt", "p5.48xlarge", ("gpu.count", "gpu.ecc")),
    (
        "nvidia-smi-q/aznhc-azure-8gpu-535.86.10-page-retirement-BAD-EDITED",
        "nvidia-smi-q.txt",
        "unknown-type",
        ("gpu.retired-pages",),
    ),
]


@pytest.mark.parametrize(("stem", "name", "itype", "checks"), NO_NEWLINE, ids=lambda v: str(v).split("/")[-1])
def test_a_complete_last_line_without_its_newline_is_evidence(
    stem: str, name: str, itype: str, checks: tuple[str, ...], tmp_path: Path
) -> None:
    """The recording kept without its final newline is judged exactly as the recording: the same
    status for every check, never `unknown` for a cut that did not happen."""
    real = (FIX / f"{stem}.txt").read_bytes()
    kept = (FIX / f"{stem}-DERIVED-no-final-newline.txt").read_bytes()
    assert real.endswith(b"\n") and not kept.endswith((b"\n", b"\r")) and real.rstrip(b"\r\n") == kept
    before = _judge(tmp_path / "real", name, real, itype)
    after = _judge(tmp_path / "kept", name, kept, itype)
    assert {n: r.status for n, r in after.items()} == {n: r.status for n, r in before.items()}
    for check in checks:
        assert after[check].status is not Status.UNKNOWN, after[check].unknown
        assert after[check].status is before[check].status
        assert [f.key for f in after[check].findings] == [f.key for f in before[check].findings]
    if "BAD-EDITED" in stem:  # its last line, "Pending Page Blacklist : Yes", is read: a fault
        assert after["gpu.retired-pages"].status is Status.FAIL


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (parse_nvlink, "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-1)\n  Link 0: 25 GB/s\n  Link 1: 25 GB/"),
        (parse_nvlink, "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-1)\n  Link 0: 25 GB/s\n  Link 1: <inact"),
        (
            parse_nvlink,
            "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-1)\n  Link 0: 25 GB/s\nGPU 1: NVIDIA A100-SXM4-80GB (UU",
        ),
        (parse_topo, "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV12\t0-31\nGPU1\tNV12\t "),
        (parse_topo, "\tGPU0\tGPU1\nGPU0\t X \tNV12\nGPU1\tNV1"),
        (
            parse_nvsmi_text,
            "Attached GPUs : 1\nGPU 00000000:19:00.0\n    Retired Pages\n        Double Bit ECC : 5",
        ),
        (
            parse_nvsmi_text,
            "Attached GPUs : 1\nGPU 00000000:19:00.0\n    Retired Pages\n        Pending Page Blacklist : Ye",
        ),
    ],
)
def test_a_cut_inside_the_last_line_stays_unknown(parse: object, text: str) -> None:
    """A last line incomplete by the parser's grammar (a speed without its unit, a header without
    its UUID, a matrix row short of cells or ending in a code that may be cut, a count that may lose
    digits, a flag that is not Yes/No) is a cut: the capture is unreadable."""
    with pytest.raises(ParseError, match="cut short inside line"):
        parse(text)  # type: ignore[operator]


def test_an_xml_document_ending_with_its_closing_tag_is_whole_newline_or_not() -> None:
    """The XML view needed no change (its grammar ends at `</nvidia_smi_log>`): the real telegraf
    recordings end without a newline and read exactly as with one. A guard, not a fix."""
    real = [p for p in sorted((FIX / "nvidia-smi-xml").glob("telegraf-*.xml")) if "DERIVED" not in p.name]
    kept = [p for p in real if p.read_bytes()[-1:] != b"\n"]
    assert len(kept) >= 3
    for path in kept:
        text = path.read_text()
        assert parse_nvsmi_xml(text) == parse_nvsmi_xml(text + "\n")


def test_a_last_topo_row_is_read_for_its_cells_not_for_a_value_that_may_be_cut() -> None:
    """Whole cells followed by the affinity columns are evidence; the last affinity value ("0-3" of
    "0-31"?) and the last NIC legend name ("mlx5_1" of "mlx5_11"?) cannot be told whole: unread."""
    matrix = parse_topo("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV12\t0-31\nGPU1\tNV12\t X \t0-3")
    assert matrix.rows["GPU1"] == {"GPU0": "NV12", "GPU1": "X"} and matrix.cpu_affinity == {"GPU0": "0-31"}
    legend = parse_topo("\tGPU0\tNIC0\nGPU0\t X \tPIX\nNIC0\tPIX\t X \n\nNIC Legend:\n\n  NIC0: mlx5_1")
    assert legend.nic_names == {}


BLACKWELL = FIX / "xid-kernel-log" / "issue-gpud-pr1160-1174-blackwell-nvlink-xid144-145-149-lines.log"


def test_a_kernel_log_reads_its_complete_last_line_and_never_a_cut_one(cfg: Config) -> None:
    """The real Blackwell lines: kept without the final newline, the last line (an NVLink5 line with
    its closing register list) is read like the others; cut inside its register list it is not read
    at all, never decoded from a prefix or judged by its Fatal word alone."""
    text = BLACKWELL.read_text()
    whole = {f.key for f in check_xid(NodeFacts(kernel=fold_kernel_text(text)), cfg).findings}
    kept = {f.key for f in check_xid(NodeFacts(kernel=fold_kernel_text(text.rstrip("\n"))), cfg).findings}
    assert kept == whole and any(k.startswith("xid/145/0018:01:00.0") for k in whole)
    last = text.rstrip("\n").rsplit("\n", 1)[1]
    for cut in (last.index("(0x") + 6, last.index(" 0x00000008") + 5, len(last) - 1):
        damaged = text.rstrip("\n")[: len(text.rstrip("\n")) - len(last) + cut]
        found = {f.key for f in check_xid(NodeFacts(kernel=fold_kernel_text(damaged)), cfg).findings}
        assert not any(k.startswith("xid/145/") for k in found), (cut, found)
        assert found == whole - {k for k in whole if k.startswith("xid/145/")}


# ---------------------------------------------------------------- 2. cascades that name their cause

CASCADE = (
    FIX / "xid-kernel-log" / "issue-gpud-pr1160-1174-blackwell-DERIVED-xid45-caused-by-previous-only.log"
)


def test_an_excerpt_of_cascade_lines_reports_the_cause_they_name(cfg: Config) -> None:
    """Only "45 ... caused by previous Xid N" lines, on four GPUs: each GPU gets its cause N (the
    NVLink5 sub-code unknown: the decode sheet's fallback, which for a line without the driver's
    Fatal word is the code's catalog severity), the line as evidence, the 45s as its consequence;
    no Xid 45 application fault is left."""
    res = check_xid(NodeFacts(kernel=fold_kernel_text(CASCADE.read_text())), cfg)
    found = {f.key: f for f in res.findings}
    assert set(found) == {
        "xid/144/0000:01:00.0",
        "xid/149/0000:00:00.0",
        "xid/149/0019:01:00.0",
        "xid/145/0018:01:00.0",
    }
    for key, f in found.items():
        code = int(key.split("/")[1])
        assert f.rule == f"xid.{code}"
        assert f.severity is cfg.xid_severity(code) is Severity.MONITOR
        assert f"caused by previous Xid {code}" in f.message  # the evidence line
        assert "3 Xid 45" in f.message  # the consequences, counted
    assert not any(k.startswith("xid/45/") for k in found)
    assert res.status is Status.WARN  # before: pass, four "application faults"


# ---------------------------------------------------------------- 3. relative-only dmesg -H

DMESG_H = FIX / "kernel-log" / "gpud-h100-boot-dmesg-H-relative-only-DERIVED-pcie-aer-gpu-and-nic-EXCERPT.log"


def test_a_relative_only_dmesg_h_excerpt_is_this_boot_and_nvidia_names_the_gpu(
    cfg: Config, tmp_path: Path
) -> None:
    """No absolute stamp, no boot marker, no GPU inventory: the lines are this boot's, and the AER
    fatal error on the device the `nvidia` driver owns is the GPU's `xid.pcie-aer` finding. The
    ConnectX adapter's is not judged without the RDMA inventory, the bridges never are."""
    view = fold_kernel_text(DMESG_H.read_text())
    res = check_xid(NodeFacts(kernel=view), cfg)
    assert [(f.key, f.rule, f.severity) for f in res.findings] == [
        ("aer/0000:19:00.0", "xid.pcie-aer", Severity.RESET)
    ]
    assert res.findings[0].message.startswith("PCIe AER fatal error on GPU 0000:19:00.0 ")
    assert res.status is Status.FAIL
    # with an inventory the GPU keeps its own name
    inv = GpuInventory(source="test", gpus=(Gpu(index=3, pci_bus_id="00000000:19:00.0"),))
    named = check_xid(NodeFacts(kernel=view, gpus=inv), cfg).findings
    assert [f.key for f in named] == ["aer/0000:19:00.0"] and "on GPU 3 " in named[0].message
    # the whole path: `check --from-snapshot` with the excerpt as kmsg.log
    xid = _judge(tmp_path, "kmsg.log", DMESG_H.read_bytes(), "p5.48xlarge")["xid"]
    assert xid.status is Status.FAIL and [f.key for f in xid.findings] == ["aer/0000:19:00.0"]


def test_consequences_count_with_the_causes_own_line(cfg: Config) -> None:
    """With the cause's own line in the log (the real Blackwell lines, then the cascade excerpt), the
    consequences are counted on that finding: no second finding for the cause, no Xid 45."""
    text = BLACKWELL.read_text() + CASCADE.read_text()
    found = {f.key: f for f in check_xid(NodeFacts(kernel=fold_kernel_text(text)), cfg).findings}
    own = {k: f for k, f in found.items() if k.startswith("xid/149/0019:01:00.0")}
    assert list(own) == ["xid/149/0019:01:00.0/NETIR/NETIR_INT/reset_gpu"]  # decoded, RESET_GPU
    assert own["xid/149/0019:01:00.0/NETIR/NETIR_INT/reset_gpu"].message.endswith(
        "(+3 Xid 45 lines caused by it)"
    )
    # GPU 0000:00:00.0 has two decoded 149 findings: the most severe one counts the consequences
    zero = {k: f for k, f in found.items() if k.startswith("xid/149/0000:00:00.0")}
    counted = [k for k, f in zero.items() if "caused by it" in f.message]
    assert counted == ["xid/149/0000:00:00.0/NETIR_LINK_EVT/NETIR_LINK_DOWN/reset_gpu"]
    assert "xid/149/0000:00:00.0" not in found and not any(k.startswith("xid/45/") for k in found)


@pytest.mark.parametrize(
    ("cause", "severity"), [(79, Severity.REBOOT), (48, Severity.RESET), (13, Severity.NONE)]
)
def test_any_named_cause_is_judged_at_its_catalog_severity(
    cause: int, severity: Severity, cfg: Config
) -> None:
    """The cascade excerpt's first line naming another cause: that cause's catalog entry decides."""
    line = CASCADE.read_text().splitlines()[0].replace("previous Xid 144", f"previous Xid {cause}")
    found = check_xid(NodeFacts(kernel=fold_kernel_text(line + "\n")), cfg).findings
    assert [(f.key, f.rule, f.severity) for f in found] == [
        (f"xid/{cause}/0000:01:00.0", f"xid.{cause}", severity)
    ]
    assert "named by 1 Xid 45 line" in found[0].message


def test_a_line_holding_bytes_the_kernel_never_prints_is_no_evidence(cfg: Config) -> None:
    """A NUL inside the address must not make the Xid another GPU's, nor one of an unknown GPU."""
    lines = (
        FIX / "xid-kernel-log" / "gpud-hgx-xid79-fallen-off-bus-plus-sxid20034-DERIVED-dmesg-T.log"
    ).read_text()
    damaged = lines.replace("Xid (PCI:0000:91:00)", "Xid (PCI:0000:9\x001:00)")
    assert damaged != lines
    keys = {f.key for f in check_xid(NodeFacts(kernel=fold_kernel_text(damaged)), cfg).findings}
    assert "xid/79/0000:91:00.0" in keys  # from the driver's number-less line of the same event
    assert not any(k.startswith("xid/79/") and k != "xid/79/0000:91:00.0" for k in keys)


def test_a_fallen_off_line_whose_address_was_lost_is_the_addressed_xid79(cfg: Config) -> None:
    """The driver's three-line record with its first line far away: its last line names no GPU. With
    an addressed Xid 79 in the same log it is that report again, not a fault of an unknown GPU."""
    text = (
        "[  100.000001] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus.\n"
        "[  100.000002] NVRM: fallen off the bus and is not responding to commands.\n"
    )
    found = check_xid(NodeFacts(kernel=fold_kernel_text(text)), cfg).findings
    assert [f.key for f in found] == ["xid/79/0000:91:00.0"]
    assert "(+1 'fallen off the bus' line(s) naming no GPU)" in found[0].message
    alone = check_xid(NodeFacts(kernel=fold_kernel_text(text.split("\n", 1)[1])), cfg).findings
    assert [(f.key, f.severity) for f in alone] == [("xid/79/unknown PCI", Severity.REBOOT)]


def test_the_agent_reads_a_kernel_log_line_once_its_writer_finished_it(tmp_path: Path) -> None:
    """A growing file's last line cut inside ("... 14" of "149, ...") is kept back, not read, until
    the rest arrives; a whole last line without its newline is read at once."""
    from agent.probes.kernel_tail import KernelTail

    path = tmp_path / "kmsg.log"
    line = BLACKWELL.read_text().splitlines()[3]  # "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal ..."
    cut = line.index("149") + 2
    path.write_text(line[:cut])
    tail = KernelTail(str(path), device=False)
    tail.poll()
    assert tail.view().tallies == ()
    with path.open("a") as fh:
        fh.write(line[cut:])  # whole now, still without its newline
    tail.poll()
    assert [(t.first.code, t.first.pci, t.count) for t in tail.view().tallies] == [
        (149, "00000019:01:00.0", 1)
    ]


def test_an_nvidia_device_named_earlier_makes_a_ports_aer_report_a_gpus(cfg: Config) -> None:
    """The port's "error received: <bdf>" names the source; a line the nvidia driver printed about
    that device (here its own AER detail line, earlier) says it is a GPU."""
    lines = DMESG_H.read_text().splitlines()
    text = "\n".join(
        [
            lines[1],
            "[  +0.000010] pcieport 0000:17:01.0: AER: Uncorrected (Fatal) error received: 0000:19:00.0",
        ]
    )
    found = check_xid(NodeFacts(kernel=fold_kernel_text(text + "\n")), cfg).findings
    assert [(f.key, f.severity) for f in found] == [("aer/0000:19:00.0", Severity.RESET)]
    assert "Uncorrected (Fatal) error received" in found[0].message
