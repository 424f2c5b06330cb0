"""read_rdma on the real Mellanox sysfs tree and on the derived p5 EFA tree (built at test time)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.core.rdma import RdmaSample
from agent.probes.rdma import read_rdma
from tests.efa_sysfs_tree import build_efa_tree, p5_devices

FIX = Path(__file__).parent / "fixtures"
MLX = FIX / "infiniband-sysfs" / "gpud-h100-sys-class-infiniband"


def test_real_mlx5_tree() -> None:
    sample = read_rdma(MLX, taken_at=5.0)
    assert sample.taken_at == 5.0
    names = [d.name for d in sample.devices]
    assert names == [
        "mlx5_0",
        "mlx5_1",
        "mlx5_4",
        "mlx5_5",
        "mlx5_6",
        "mlx5_7",
        "mlx5_8",
        "mlx5_9",
        "mlx5_bond_0",
    ]
    for dev in sample.devices:
        assert not dev.is_efa
        # The copied tree has no device symlink: nothing says which PCI function, vendor or driver.
        assert dev.pci is None and dev.vendor is None and dev.driver is None
        (port,) = dev.ports
        assert port.number == 1 and port.state == "ACTIVE" and port.phys_state == "LinkUp"
    mlx0 = sample.devices[0].ports[0]
    assert mlx0.rate == "400 Gb/sec (4X NDR)" and mlx0.link_layer == "InfiniBand"
    assert mlx0.counters["port_rcv_data"] == int((MLX / "mlx5_0/ports/1/counters/port_rcv_data").read_text())
    assert "out_of_buffer" in mlx0.counters and "link_downed" in mlx0.counters
    bond = sample.devices[-1].ports[0]
    assert bond.link_layer == "Ethernet" and bond.rate == "200 Gb/sec (2X NDR)"


def test_default_taken_at_is_monotonic() -> None:
    assert isinstance(read_rdma(MLX).taken_at, float)


def test_missing_class_dir_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_rdma(tmp_path / "nope")


def test_empty_class_dir_is_zero_devices(tmp_path: Path) -> None:
    assert read_rdma(tmp_path, taken_at=1.0) == RdmaSample(devices=(), taken_at=1.0)


def test_derived_p5_efa_tree_with_links(tmp_path: Path) -> None:
    class_dir = build_efa_tree(tmp_path)
    sample = read_rdma(class_dir, taken_at=0.0)
    assert len(sample.devices) == 32
    names = [d.name for d in sample.devices]
    assert names[0] == "rdmap79s0" and names[-1] == "rdmap201s0"  # natural order
    assert set(names) == set(p5_devices())
    first = sample.devices[0]
    assert first.is_efa and first.vendor == "0x1d0f" and first.driver == "efa"
    assert first.pci == "00000000:4f:00.0"  # from the basename of the device symlink
    (port,) = first.ports
    assert port.state == "ACTIVE" and port.link_layer == "Unspecified"
    assert port.counters["tx_pkts"] == 1667468  # the real value from the .prom file
    assert port.counters["rx_drops"] == 0 and "retrans_timeout_events" in port.counters


def test_copied_efa_tree_without_links(tmp_path: Path) -> None:
    """A snapshot copy loses symlinks: PCI from device/uevent, vendor from device/vendor."""
    class_dir = build_efa_tree(tmp_path, with_links=False)
    dev = read_rdma(class_dir).devices[0]
    assert dev.pci == "00000000:4f:00.0" and dev.vendor == "0x1d0f" and dev.driver is None
    assert dev.is_efa


def test_vendor_and_driver_from_pci_devices_dir(tmp_path: Path) -> None:
    class_dir = tmp_path / "class"
    port = class_dir / "rdmap79s0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (class_dir / "rdmap79s0" / "device").mkdir()
    (class_dir / "rdmap79s0" / "device" / "uevent").write_text("PCI_SLOT_NAME=0000:4f:00.0\n")
    pci = tmp_path / "pci" / "0000:4f:00.0"
    pci.mkdir(parents=True)
    (pci / "vendor").write_text("0x1d0f\n")
    (tmp_path / "drivers" / "efa").mkdir(parents=True)
    os.symlink("../../drivers/efa", pci / "driver")
    dev = read_rdma(class_dir, tmp_path / "pci").devices[0]
    assert (dev.vendor, dev.driver, dev.pci) == ("0x1d0f", "efa", "00000000:4f:00.0")


def test_efa_inferred_from_name_only_when_nothing_else_says(tmp_path: Path) -> None:
    for name in ("rdmap80s0", "efa_0", "mlx5_0"):
        (tmp_path / name / "ports" / "1").mkdir(parents=True)
    devs = {d.name: d for d in read_rdma(tmp_path).devices}
    assert devs["rdmap80s0"].driver == "efa" and devs["rdmap80s0"].is_efa
    assert devs["efa_0"].is_efa
    assert not devs["mlx5_0"].is_efa and devs["mlx5_0"].driver is None
    # Vendor says Mellanox: the rdmap-style name must not turn it into EFA.
    (tmp_path / "rdmap81s0" / "device").mkdir(parents=True)
    (tmp_path / "rdmap81s0" / "device" / "vendor").write_text("0x15b3\n")
    dev = {d.name: d for d in read_rdma(tmp_path).devices}["rdmap81s0"]
    assert dev.vendor == "0x15b3" and dev.driver is None and not dev.is_efa


def test_unreadable_bits_become_none(tmp_path: Path) -> None:
    port = tmp_path / "rdmap79s0" / "ports" / "1"
    (port / "hw_counters").mkdir(parents=True)
    (port / "hw_counters" / "rx_drops").write_text("12\n")
    (port / "hw_counters" / "garbage").write_text("N/A\n")
    (port / "hw_counters" / "a_directory").mkdir()
    (port / "state").mkdir()  # not a file: reading fails
    (port / "phys_state").write_bytes(b"\xff\xfe")
    (tmp_path / "rdmap79s0" / "ports" / "notaport").mkdir()
    (tmp_path / "stray-file").write_text("x")  # files at top level are not devices
    sample = read_rdma(tmp_path)
    (dev,) = sample.devices
    (p,) = dev.ports
    assert p.state is None and p.rate is None and p.link_layer is None
    assert p.counters == {"rx_drops": 12}


def test_port_down_and_missing_device(tmp_path: Path) -> None:
    class_dir = build_efa_tree(
        tmp_path, omit=["rdmap201s0"], port_state={"rdmap80s0": ("1: DOWN", "3: Disabled")}
    )
    sample = read_rdma(class_dir)
    assert len(sample.devices) == 31
    dev = {d.name: d for d in sample.devices}["rdmap80s0"]
    assert dev.ports[0].state == "DOWN" and dev.ports[0].phys_state == "Disabled"
