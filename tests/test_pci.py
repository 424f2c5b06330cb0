"""The PCI probe and the pci.inventory / pci.link / pci.aer checks on sysfs trees rebuilt from real
recordings (tests/pci_sysfs_tree.py says how): the single-H100 VM captured on a lent machine (with
its own nvidia-smi output) and the `lspci -vvv` of a healthy 8x H100 + ConnectX-7 node. Each fault
is a change to one of them, named in the test."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from agent.checks.pci import check_aer, check_inventory, check_link
from agent.core.facts import NodeFacts
from agent.core.findings import CheckResult
from agent.core.gpu import GpuInventory
from agent.core.pci import PciSample
from agent.core.probed import NotCaptured, ProbeError, ProbeErrorKind
from agent.core.rdma import RdmaSample
from agent.core.severity import Severity, Status
from agent.probes.live import LiveSource
from agent.probes.nvsmi_xml import parse_nvsmi_xml
from agent.probes.pci import read_pci
from tests.conftest import cfg, live_cfg
from tests.pci_sysfs_tree import H100_VM, build_from_capture, build_from_lspci, build_rdma_class

ROOT = Path(__file__).parent.parent
VM_GPU = "0000:00:06.0"
XML = (H100_VM / "nvidia-smi-q.xml").read_text(encoding="utf-8")
# The 8x H100 node's RDMA-capable functions: 8 ConnectX-7 and 2 dual-port ConnectX-6 Dx.
CX7 = ("1a", "3c", "4d", "5e", "9c", "bc", "cc", "dc")
CX_FUNCTIONS = {f"0000:{b}:00.0": f"0000:{b}:00.0" for b in CX7} | {
    f"0000:{b}:00.{fn}": f"0000:{b}:00.{fn}" for b in ("1b", "9d") for fn in (0, 1)
}
X8_GPUS = ("19", "3b", "4c", "5d", "9b", "bb", "cb", "db")


CFG = cfg()


def vm_gpus(xml: str = XML) -> GpuInventory:
    inv = parse_nvsmi_xml(xml)
    assert isinstance(inv, GpuInventory)
    return inv


def facts_for(root: Path, itype: str | None = None, **kw: object) -> NodeFacts:
    """What the agent reads from a sysfs root: the live source's own readers on the tree."""
    live = LiveSource(live_cfg(), sys_root=root)
    base = NodeFacts(
        instance_type=itype,
        profile=CFG.profiles[itype] if itype else None,
        pci=live.pci(),
        rdma=live.rdma(),
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def rules(result: CheckResult) -> list[str]:
    return [f.rule for f in result.findings]


def x8_rdma(root: Path, leave_out: tuple[str, ...] = ()) -> None:
    names = {f"mlx5_{i}": bdf for i, bdf in enumerate(sorted(CX_FUNCTIONS)) if bdf not in leave_out}
    build_rdma_class(root, names)


# --------------------------------------------------------------------------- probe


def test_probe_reads_the_real_h100_vm_bus(tmp_path: Path) -> None:
    sample = read_pci(build_from_capture(tmp_path), taken_at=1.0)
    assert len(sample.devices) == 7
    gpu = sample.by_address()["00000000:00:06.0"]
    assert (gpu.kind, gpu.vendor, gpu.device, gpu.driver) == ("gpu", "0x10de", "0x2330", "nvidia")
    assert (gpu.speed_current, gpu.speed_max, gpu.width_current, gpu.width_max) == (32.0, 32.0, 16, 16)
    assert gpu.upstream is None and gpu.numa_node is None and gpu.aer == {}  # root bus, numa -1, no AER
    virtio_net = sample.by_address()["00000000:00:03.0"]
    assert virtio_net.kind is None and virtio_net.driver == "virtio-pci"


def test_probe_finds_the_upstream_port_and_aer_on_the_x8_node(tmp_path: Path) -> None:
    by = read_pci(build_from_lspci(tmp_path)).by_address()
    gpu = by["00000000:19:00.0"]
    assert gpu.upstream == "00000000:17:01.0" and gpu.numa_node == 0
    assert by["00000000:17:01.0"].pci_class == "0x060400"
    assert gpu.aer["fatal"]["TOTAL_ERR_FATAL"] == 0 and gpu.aer["correctable"]["BadTLP"] == 0
    kinds = [d.kind for d in by.values() if d.kind]
    assert kinds.count("gpu") == 8 and kinds.count("nvswitch") == 4 and kinds.count("connectx") == 12


def test_no_pci_directory_is_unavailable_not_a_crash(tmp_path: Path) -> None:
    probed = LiveSource(live_cfg(), sys_root=tmp_path).pci()
    assert isinstance(probed, ProbeError) and probed.kind is ProbeErrorKind.UNAVAILABLE
    result = check_inventory(NodeFacts(pci=probed), CFG)
    assert result.status == Status.UNKNOWN


# --------------------------------------------------------------------------- inventory


def test_inventory_passes_on_the_real_h100_vm(tmp_path: Path) -> None:
    build_from_capture(tmp_path)
    result = check_inventory(facts_for(tmp_path, gpus=vm_gpus()), CFG)
    assert result.status == Status.PASS, result.message
    assert "1 NVIDIA GPU(s) on the bus" in result.note


def test_a_gpu_on_the_bus_the_driver_does_not_list_is_reported_with_its_address(tmp_path: Path) -> None:
    # DERIVED: the driver link is gone (RmInitAdapter failed) and nvidia-smi prints its real
    # "No devices were found".
    build_from_capture(tmp_path, override={VM_GPU: {"uevent": "PCI_SLOT_NAME=0000:00:06.0\n"}})
    (tmp_path / "devices" / "pci0000:00" / VM_GPU / "driver").unlink()
    result = check_inventory(facts_for(tmp_path, gpus=parse_nvsmi_xml("No devices were found\n")), CFG)
    assert result.status == Status.FAIL
    (f,) = result.findings
    assert f.rule == "pci.inventory.gpu-invisible" and f.severity == Severity.REBOOT
    assert f.entities == (VM_GPU,)
    assert "no driver bound" in f.message and "nvidia-smi -q -x does not list it" in f.message


def test_a_gpu_the_driver_lists_but_not_on_the_bus_is_missing(tmp_path: Path) -> None:
    build_from_capture(tmp_path, drop=[VM_GPU])  # DERIVED: the GPU's function is gone from the bus
    result = check_inventory(facts_for(tmp_path, gpus=vm_gpus()), CFG)
    (f,) = result.findings
    assert f.rule == "pci.inventory.gpu-off-bus" and f.severity == Severity.ISOLATE
    assert f.message == "GPU 0000:00:06.0 is listed by nvidia-smi -q -x but is not on the PCI bus"


def test_fewer_gpus_on_the_bus_than_the_profile_even_without_the_driver_view(tmp_path: Path) -> None:
    build_from_lspci(tmp_path, drop=["0000:9b:00.0"])  # DERIVED: one H100 fell off the bus
    x8_rdma(tmp_path)
    unread = ProbeError("nvml", ProbeErrorKind.TIMEOUT, "hung")
    result = check_inventory(facts_for(tmp_path, "dgx-h100", gpus=unread), CFG)
    assert rules(result) == ["pci.inventory.gpu-off-bus"]
    assert result.findings[0].message == "7 NVIDIA GPU(s) on the PCI bus, dgx-h100 has 8"
    assert "GPU list (nvml: timeout: hung): GPUs invisible to the driver not judged" in result.note


def test_x8_node_with_every_connectx_in_rdma_passes(tmp_path: Path) -> None:
    build_from_lspci(tmp_path)
    x8_rdma(tmp_path)
    result = check_inventory(facts_for(tmp_path, "dgx-h100"), CFG)
    assert result.status == Status.PASS, result.message
    assert "0 EFA, 12 ConnectX function(s) on the bus" in result.note and "4 NVSwitch(es)" in result.note


def test_a_connectx_without_rdma_device_is_reported(tmp_path: Path) -> None:
    build_from_lspci(tmp_path)
    x8_rdma(tmp_path, leave_out=("0000:5e:00.0",))  # DERIVED: mlx5_ib did not bind this function
    result = check_inventory(facts_for(tmp_path, "dgx-h100"), CFG)
    (f,) = result.findings
    assert f.rule == "pci.inventory.nic-invisible" and f.entities == ("0000:5e:00.0",)
    assert f.message == "ConnectX 0000:5e:00.0 is on the PCI bus (bound to mlx5_core), no RDMA device"


def test_a_gpu_gone_since_the_previous_read_is_reported(tmp_path: Path) -> None:
    before = read_pci(build_from_capture(tmp_path / "a"), taken_at=0.0)
    build_from_capture(tmp_path / "b", drop=[VM_GPU])
    facts = facts_for(tmp_path / "b", pci_previous=before, gpus=parse_nvsmi_xml("No devices were found\n"))
    result = check_inventory(facts, CFG)
    (f,) = result.findings
    assert f.rule == "pci.inventory.gpu-off-bus"
    assert f.message == "gpu 0000:00:06.0 was on the PCI bus at the previous read and is gone"


# --------------------------------------------------------------------------- link


def test_link_passes_on_the_real_h100_vm_idle_in_p0(tmp_path: Path) -> None:
    build_from_capture(tmp_path)
    result = check_link(facts_for(tmp_path, gpus=vm_gpus()), CFG)
    assert result.status == Status.PASS, result.message
    assert result.note == "1 link(s) judged"


def test_link_passes_on_the_x8_node_whose_bridges_are_downgraded(tmp_path: Path) -> None:
    # The real node has 16 "downgraded" links (switch uplinks at 16 GT/s, a BMC NIC at x1): none is
    # a GPU, NVSwitch or RDMA NIC link, and those all run at the narrower/slower end's maximum.
    build_from_lspci(tmp_path)
    result = check_link(facts_for(tmp_path), CFG)
    assert result.status == Status.PASS, result.message
    assert result.note.startswith("22 link(s) judged")  # 8 GPU + 4 NVSwitch + 8 CX-7 + 2 CX-6 Dx


def test_a_gpu_link_trained_to_x8_is_reported_against_its_upstream_port(tmp_path: Path) -> None:
    build_from_lspci(tmp_path, override={"0000:19:00.0": {"current_link_width": "8\n"}})  # DERIVED
    result = check_link(facts_for(tmp_path), CFG)
    (f,) = result.findings
    assert f.rule == "pci.link.width" and f.severity == Severity.MONITOR
    assert f.message == "gpu 0000:19:00.0: PCIe link x8, both ends support x16 (upstream port 0000:17:01.0)"


def test_a_narrow_upstream_port_is_the_weaker_end_not_a_fault(tmp_path: Path) -> None:
    # DERIVED: the switch port above GPU 19 is wired x8, and the GPU trained to x8: as it must.
    build_from_lspci(
        tmp_path,
        override={"0000:17:01.0": {"max_link_width": "8\n"}, "0000:19:00.0": {"current_link_width": "8\n"}},
    )
    assert check_link(facts_for(tmp_path), CFG).status == Status.PASS


def test_gpu_speed_judged_in_p0_and_not_when_power_saving(tmp_path: Path) -> None:
    # DERIVED: the VM's GPU link at 16 GT/s. The real nvidia-smi says P0 → a fault; the same output
    # with P8 (an idle GPU's state) → power saving, noted and not judged.
    build_from_capture(tmp_path, override={VM_GPU: {"current_link_speed": "16.0 GT/s PCIe\n"}})
    busy = check_link(facts_for(tmp_path, gpus=vm_gpus()), CFG)
    (f,) = busy.findings
    assert f.rule == "pci.link.speed"
    assert f.message == "gpu 0000:00:06.0: PCIe link at 16 GT/s, both ends support 32 GT/s"
    p8 = XML.replace("<performance_state>P0</performance_state>", "<performance_state>P8</performance_state>")
    idle = check_link(facts_for(tmp_path, gpus=vm_gpus(p8)), CFG)
    assert idle.status == Status.PASS
    assert "gpu 0000:00:06.0 at 16 of 32 GT/s in P8: not judged" in idle.note
    unknown = check_link(facts_for(tmp_path), CFG)
    assert unknown.status == Status.PASS and "performance state unknown: not judged" in unknown.note


def test_a_connectx_link_at_a_lower_speed_is_judged_always(tmp_path: Path) -> None:
    build_from_lspci(tmp_path, override={"0000:1a:00.0": {"current_link_speed": "16.0 GT/s PCIe\n"}})
    result = check_link(facts_for(tmp_path), CFG)
    (f,) = result.findings
    assert f.rule == "pci.link.speed" and f.entities == ("0000:1a:00.0",)


def test_a_link_down_reads_x0(tmp_path: Path) -> None:
    build_from_lspci(tmp_path, override={"0000:84:00.0": {"current_link_width": "0\n"}})
    (f,) = check_link(facts_for(tmp_path), CFG).findings
    assert f.message.startswith("nvswitch 0000:84:00.0: PCIe link link down (x0)")


def test_profile_pcie_width_lowers_the_gpu_expectation(tmp_path: Path) -> None:
    # DERIVED: the VM GPU at x8; a g5 profile says its GPUs are wired x8.
    build_from_capture(tmp_path, override={VM_GPU: {"current_link_width": "8\n"}})
    assert rules(check_link(facts_for(tmp_path, gpus=vm_gpus()), CFG)) == ["pci.link.width"]
    assert check_link(facts_for(tmp_path, "g5.xlarge", gpus=vm_gpus()), CFG).status == Status.PASS


# --------------------------------------------------------------------------- AER


def test_aer_skipped_where_sysfs_has_no_counters(tmp_path: Path) -> None:
    build_from_capture(tmp_path)
    result = check_aer(facts_for(tmp_path), CFG)
    assert result.status == Status.SKIPPED and "no AER counters" in (result.skipped or "")


def test_aer_passes_on_the_x8_node_with_quiet_counters(tmp_path: Path) -> None:
    build_from_lspci(tmp_path / "a")
    build_from_lspci(tmp_path / "b")
    first = read_pci(tmp_path / "a" / "bus" / "pci" / "devices", taken_at=0.0)
    result = check_aer(facts_for(tmp_path / "b", pci_previous=first), CFG)
    assert result.status == Status.PASS, result.message


def _aer(fatal: int = 0, correctable: int = 0, bad_tlp: int = 0) -> dict[str, str | None]:
    return {
        "aer_dev_fatal": f"DLP {fatal}\nTOTAL_ERR_FATAL {fatal}\n",
        "aer_dev_correctable": f"RxErr 0\nBadTLP {bad_tlp}\nTOTAL_ERR_COR {correctable}\n",
    }


def test_a_fatal_aer_error_this_boot_is_reported(tmp_path: Path) -> None:
    build_from_lspci(tmp_path, override={"0000:3b:00.0": _aer(fatal=1)})  # DERIVED
    result = check_aer(facts_for(tmp_path), CFG)
    (f,) = result.findings
    assert f.rule == "pci.aer.fatal" and f.severity == Severity.REBOOT
    assert f.message == "gpu 0000:3b:00.0: 1 fatal PCIe error(s) this boot (DLP 1)"
    assert "no previous sample" in result.note


def test_correctable_errors_judged_as_a_rate_also_at_the_upstream_port(tmp_path: Path) -> None:
    # DERIVED: the switch port above GPU 19 counts 600 BadTLP in 60 s (10/s); another port 5 (< 8/min).
    build_from_lspci(tmp_path / "a")
    build_from_lspci(
        tmp_path / "b",
        override={"0000:17:01.0": _aer(correctable=600, bad_tlp=600), "0000:39:01.0": _aer(correctable=5)},
    )
    before = read_pci(tmp_path / "a" / "bus" / "pci" / "devices", taken_at=100.0)
    now = read_pci(tmp_path / "b" / "bus" / "pci" / "devices", taken_at=160.0)
    result = check_aer(NodeFacts(pci=now, pci_previous=before), CFG)
    (f,) = result.findings
    assert f.rule == "pci.aer.correctable" and f.entities == ("0000:17:01.0",)
    assert f.message == "device 0000:17:01.0: correctable PCIe errors grew by 600 in 60 s (BadTLP 600)"


def test_pci_not_captured_skips(tmp_path: Path) -> None:
    facts = NodeFacts(pci=NotCaptured("sys/devices"), rdma=RdmaSample((), 0.0))
    for check in (check_inventory, check_link, check_aer):
        assert check(facts, CFG).status == Status.SKIPPED


def test_sample_type() -> None:
    assert PciSample((), 0.0).by_address() == {}


def test_snapshot_keeps_the_bus_and_its_hierarchy(tmp_path: Path) -> None:
    """`gpu-healthcheck snapshot` copies the whole bus; the snapshot reads back what the live node read."""
    from agent.probes.capture import capture
    from agent.probes.snapshot import SnapshotSource

    sys_root = tmp_path / "sys"
    build_from_lspci(sys_root, override={"0000:3b:00.0": _aer(fatal=1)})
    x8_rdma(sys_root)
    out = tmp_path / "snap"
    capture(
        out, timeout_s=2, sys_root=sys_root, kmsg_path=str(tmp_path / "no-kmsg"), boot_id_path=tmp_path / "x"
    )
    live = LiveSource(live_cfg(), sys_root=sys_root).pci()
    replay = SnapshotSource(out).pci()
    assert isinstance(live, PciSample) and isinstance(replay, PciSample)
    assert replay.devices == live.devices  # identity, driver, upstream port, link and AER, all kept
    assert rules(check_aer(NodeFacts(pci=replay), CFG)) == ["pci.aer.fatal"]
    rdma = SnapshotSource(out).rdma()
    assert isinstance(rdma, RdmaSample) and {d.pci for d in rdma.devices} == {
        f"00000000:{b[5:]}" for b in CX_FUNCTIONS
    }


def test_an_older_snapshot_without_the_bus_is_not_captured(tmp_path: Path) -> None:
    from agent.probes.snapshot import SnapshotSource

    (tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:4f:00.0").mkdir(parents=True)  # NIC-only copy
    assert isinstance(SnapshotSource(tmp_path).pci(), NotCaptured)


# --------------------------------------------------------------------------- Azure ND A100 v4 (lspci -nn)

AZURE_IB = {f"mlx5_{i}": f"{0x101 + i:04x}:00:00.0" for i in range(8)} | {"mlx5_8": "c941:00:02.0"}


def azure(root: Path, drop: tuple[str, ...] = ()) -> NodeFacts:
    from tests.ib_sysfs_tree import from_ibstatus
    from tests.pci_sysfs_tree import build_from_lspci_nn

    build_from_lspci_nn(root, drop=drop)
    # DERIVED: the recorded ibstatus's mlx5_0..7 linked to the eight ConnectX-6 VFs in domain order,
    # mlx5_8 (Ethernet, 40 Gb/sec) to the ConnectX-4 Lx VF.
    from_ibstatus(root, "gpud-azure-a100-ibstatus-all-active.txt", pci=AZURE_IB)
    return facts_for(root, "Standard_ND96asr_v4")


def test_real_azure_nd_a100_bus_passes(tmp_path: Path) -> None:
    facts = azure(tmp_path)
    result = check_inventory(facts, CFG)
    assert result.status == Status.PASS, result.message
    assert "8 NVIDIA GPU(s) on the bus" in result.note and "6 NVSwitch(es)" in result.note
    assert "0 EFA, 9 ConnectX function(s) on the bus" in result.note
    assert check_link(facts, CFG).status == Status.PASS  # lspci -nn: no link files, nothing judged


def test_an_nvswitch_missing_from_the_bus(tmp_path: Path) -> None:
    result = check_inventory(azure(tmp_path, drop=("0007:00:00.0",)), CFG)  # DERIVED: one NVSwitch gone
    (f,) = result.findings
    assert f.rule == "pci.inventory.nvswitch-off-bus" and f.severity == Severity.ISOLATE
    assert f.message == "5 NVSwitch(es) on the PCI bus, Standard_ND96asr_v4 has 6"


def test_an_ib_vf_gone_from_the_bus_is_named_by_its_rdma_device(tmp_path: Path) -> None:
    # DERIVED: the VF behind mlx5_3 left the bus while its RDMA device is still listed.
    result = check_inventory(azure(tmp_path, drop=("0104:00:00.0",)), CFG)
    assert [(f.rule, f.message) for f in result.findings] == [
        ("pci.inventory.nic-off-bus", "RDMA device mlx5_3 (0104:00:00.0) is not on the PCI bus"),
    ]


def test_an_idle_x8_node_is_one_note_not_eight(tmp_path: Path) -> None:
    # DERIVED: all eight GPUs of the x8 node at 2.5 GT/s (Gen1, as idle GPUs in P8 run); no P-state known.
    build_from_lspci(
        tmp_path, override={f"0000:{b}:00.0": {"current_link_speed": "2.5 GT/s PCIe\n"} for b in X8_GPUS}
    )
    result = check_link(facts_for(tmp_path), CFG)
    assert result.status == Status.PASS
    assert result.note == (
        "22 link(s) judged; 8 GPU link(s) below top speed outside P0 or with no state known: not judged"
    )


def test_capturing_twice_into_one_directory_does_not_crash(tmp_path: Path) -> None:
    from agent.probes.capture import capture

    sys_root = tmp_path / "sys"
    build_from_lspci(sys_root)
    bus = sys_root / "bus" / "pci" / "devices"
    vf = (bus / "0000:1a:00.0").resolve().parent / "0000:1a:00.1"  # DERIVED: a VF beside its PF
    vf.mkdir()
    (vf / "vendor").write_text("0x15b3\n")
    (vf / "class").write_text("0x020000\n")
    os.symlink(
        os.path.relpath(vf, sys_root / "bus" / "pci" / "devices"),
        sys_root / "bus" / "pci" / "devices" / vf.name,
    )
    os.symlink("../0000:1a:00.0", vf / "physfn")
    x = tmp_path / "x"
    for _ in range(2):
        capture(tmp_path / "snap", timeout_s=2, sys_root=sys_root, kmsg_path=str(x), boot_id_path=x)
    from agent.probes.snapshot import SnapshotSource

    replay = SnapshotSource(tmp_path / "snap").pci()
    assert isinstance(replay, PciSample) and sum(d.virtual_function for d in replay.devices) == 1
