"""Every real shape of a kernel log line gives the same findings (issue 15, item 3): dmesg -T / -H,
journal short-precise, lines without their host field, remote collectors (Talos), the driver's
three-line "fallen off the bus" record, Xid 154 in every wording, PCIe AER on a GPU or a NIC.

The format variants are DERIVED from the real gpud HGX capture (their .source.txt says how)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.checks.xid import check_xid, recovery_severity
from agent.config import Config
from agent.core.facts import NodeFacts
from agent.core.gpu import Gpu, GpuInventory
from agent.core.rdma import RdmaDevice, RdmaSample
from agent.core.severity import Severity, Status
from agent.probes.kernel_tail import fold_kernel_text

ROOT = Path(__file__).resolve().parent.parent
XK = Path(__file__).parent / "fixtures" / "xid-kernel-log"
KL = Path(__file__).parent / "fixtures" / "kernel-log"
HGX = "gpud-hgx-xid79-fallen-off-bus-plus-sxid20034"
H100 = "gpud-h100-xid48-63-94-dbe-rowremap-iso"
GPU19 = GpuInventory(source="test", gpus=(Gpu(index=3, pci_bus_id="00000000:19:00.0"),))


def _judge(path: Path, cfg: Config, **facts: object) -> dict[str, tuple[str, Severity, str]]:
    res = check_xid(NodeFacts(kernel=fold_kernel_text(path.read_text()), **facts), cfg)  # type: ignore[arg-type]
    return {f.key: (f.rule, f.severity, f.message) for f in res.findings}


def _counts(found: dict[str, tuple[str, Severity, str]]) -> dict[str, str]:
    return {k: m.split(" ×", 1)[1].split(":", 1)[0].split(",")[0] for k, (_, _, m) in found.items()}


@pytest.mark.parametrize(
    "variant",
    ["dmesg-T", "dmesg-H", "journal-short-precise", "syslog-no-host", "journal-short-iso-no-host", "talos"],
)
def test_every_line_format_gives_the_findings_of_the_real_capture(variant: str, cfg: Config) -> None:
    real = _judge(XK / f"{HGX}-BLOCKQUOTE.txt", cfg)
    assert _counts(real) == {
        "xid/79/0000:91:00.0": "1",
        "sxid/20034/0000:06:00.0": "1",
        "sxid/20034/0000:05:00.0": "4",
        "sxid/20034/0000:07:00.0": "3",
    }
    assert _counts(_judge(XK / f"{HGX}-DERIVED-{variant}.log", cfg)) == _counts(real)


@pytest.mark.parametrize(
    "variant", ["three-line-record-dmesg", "three-line-record-kmsg", "three-line-record-plus-xid79-journal"]
)
def test_the_drivers_three_line_record_is_one_xid79_on_its_gpu(variant: str, cfg: Config) -> None:
    found = _judge(XK / f"{HGX}-DERIVED-{variant}.log", cfg)
    xid79 = {k: v for k, v in found.items() if k.startswith("xid/")}
    assert list(xid79) == ["xid/79/0000:91:00.0"]  # not one without an address, not a second one
    rule, severity, message = xid79["xid/79/0000:91:00.0"]
    assert rule == "xid.79" and severity is Severity.REBOOT and " ×1: " in message
    if "plus-xid79" in variant:
        assert "Xid (PCI:0000:91:00): 79" in message  # the numbered line's text is the finding's text


def test_a_user_space_line_is_never_the_driver_even_without_a_host_field(cfg: Config) -> None:
    text = (
        "Nov 14 22:14:01 gpu-healthcheck[812]: NVRM: Xid (PCI:0000:91:00): 79, GPU has fallen off the bus.\n"
        "Nov 14 22:14:01 node-3 python3[99]: NVRM: Xid (PCI:0000:91:00): 79, GPU has fallen off the bus.\n"
    )
    assert check_xid(NodeFacts(kernel=fold_kernel_text(text)), cfg).findings == ()


@pytest.mark.parametrize(
    ("slug", "severity"),
    [
        ("gpu-reset-required", Severity.RESET),
        ("node-reboot-required", Severity.REBOOT),
        ("drain-and-reset", Severity.RESET),
        ("pf-flr", Severity.RESET),
        ("drain-p2p", Severity.RESET),
        ("two-lines", Severity.REBOOT),
        ("reset-then-none", Severity.MONITOR),
    ],
)
def test_xid154_follows_the_recovery_action_in_every_wording(
    slug: str, severity: Severity, cfg: Config
) -> None:
    found = _judge(XK / f"{H100}-DERIVED-xid154-{slug}.log", cfg, gpus=GPU19)
    rule, got, message = found["xid/154/0000:19:00.0"]
    assert (rule, got) == ("xid.154", severity)
    assert " ×1: " in message or slug == "reset-then-none"


def test_recovery_action_wordings() -> None:
    assert recovery_severity("None") is Severity.NONE and recovery_severity(None) is Severity.NONE
    assert recovery_severity("Node Reboot Required") is Severity.REBOOT
    assert recovery_severity("Reboot") is Severity.REBOOT  # nvidia-smi's wording
    for text in (
        "GPU Reset Required",
        "Drain and Reset",
        "Drain P2P",
        "PF FLR",
        "Reset",
        "Recover IMEX Domain",
    ):
        assert recovery_severity(text) is Severity.RESET, text
    assert recovery_severity("Something New") is Severity.MONITOR  # not guessed, not ignored


def test_pcie_aer_fatal_on_a_gpu_and_a_nic_are_findings_without_any_xid(cfg: Config) -> None:
    nic = RdmaDevice(name="mlx5_0", pci="00000000:1a:00.0", vendor="0x15b3", driver="mlx5_core", ports=())
    res = check_xid(
        NodeFacts(
            kernel=fold_kernel_text(
                (KL / "gpud-h100-boot-dmesg-decode-iso-DERIVED-pcie-aer-gpu-and-nic.log").read_text()
            ),
            gpus=GPU19,
            rdma=RdmaSample(devices=(nic,), taken_at=0.0),
        ),
        cfg,
    )
    assert res.status is Status.FAIL
    found = {f.key: f for f in res.findings}
    assert set(found) == {"aer/0000:19:00.0", "aer/0000:1a:00.0"}  # not the bridge, not the corrected error
    gpu, nic_f = found["aer/0000:19:00.0"], found["aer/0000:1a:00.0"]
    assert gpu.rule == nic_f.rule == "xid.pcie-aer" and gpu.severity is Severity.RESET
    assert gpu.message.startswith("PCIe AER fatal error on GPU 3 (0000:19:00.0) (0000:19:00.0) ×2")
    assert nic_f.message.startswith("PCIe AER fatal error on RDMA adapter mlx5_0 (0000:1a:00.0) ×2")
    assert "can't recover" in nic_f.message


def test_the_healthy_boot_log_has_no_aer_finding(cfg: Config) -> None:
    assert _judge(KL / "gpud-h100-boot-dmesg-decode-iso-no-xid.log", cfg, gpus=GPU19) == {}


def test_xid48_with_a_failed_retirement_in_the_same_burst_is_isolate(cfg: Config) -> None:
    found = _judge(XK / f"{H100}-DERIVED-xid64-retirement-failed.log", cfg, gpus=GPU19)
    rule, severity, message = found["xid/48/0000:19:00.0"]
    assert (rule, severity) == ("xid.48", Severity.ISOLATE)
    assert "(with Xid 64: page retirement failed)" in message
    assert found["xid/64/0000:19:00.0"][1] is Severity.RESET


def test_xid48_with_a_successful_retirement_stays_reset(cfg: Config) -> None:
    assert _judge(XK / f"{H100}.log", cfg, gpus=GPU19)["xid/48/0000:19:00.0"][1] is Severity.RESET


def test_an_xid64_in_a_later_burst_does_not_escalate_the_dbe(cfg: Config) -> None:
    """A burst on one GPU lasts until 3 min of silence: a 64 seven minutes later is another incident."""
    view = fold_kernel_text((XK / f"{H100}-DERIVED-xid64-seven-minutes-later.log").read_text())
    bursts = {t.first.code: t.burst for t in view.tallies}
    assert bursts[48] == bursts[63] == bursts[94] == 1 and bursts[64] == 2
    found = _judge(XK / f"{H100}-DERIVED-xid64-seven-minutes-later.log", cfg, gpus=GPU19)
    assert found["xid/48/0000:19:00.0"][1] is Severity.RESET
