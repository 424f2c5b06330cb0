"""topo_sysfs: the topo -m code between two PCI functions from their places on the PCI tree, by the
legend nvidia-smi prints. Hand-made places for the shapes the HGX tree of tests/test_nvml_topo.py does
not show (that test holds the whole rule to a real topo -m)."""

from __future__ import annotations

from agent.probes.topo_sysfs import PciPlace, cpu_ranges, level, sysfs_bdf


def at(root: str, *bridges: str, numa: int | None = 0) -> PciPlace:
    return PciPlace(root, tuple(bridges), numa)


def test_the_legend_codes() -> None:
    switch = ("0000:15:01.0", "0000:16:00.0")  # a root port and a switch's upstream port
    gpu = at("pci0000:15", *switch, "0000:17:01.0")
    assert level(gpu, at("pci0000:15", *switch, "0000:17:02.0")) == "PIX"  # one switch between
    assert level(gpu, at("pci0000:15", *switch, "0000:17:01.0")) == "PIX"  # the same downstream port
    nested = at("pci0000:15", *switch, "0000:17:03.0", "0000:18:00.0", "0000:19:01.0")
    assert level(gpu, nested) == "PXB"  # a second switch below the first
    assert level(gpu, at("pci0000:15", "0000:15:02.0")) == "PHB"  # another root port of the bridge
    assert level(gpu, at("pci0000:37", "0000:37:01.0")) == "NODE"  # another host bridge, same node
    assert level(gpu, at("pci0000:97", "0000:97:01.0", numa=1)) == "SYS"  # another NUMA node
    assert level(gpu, at("pci0000:97", "0000:97:01.0", numa=None)) == "NODE"  # node unknown (-1)


def test_names_and_ranges() -> None:
    assert sysfs_bdf("00000000:1B:00.0") == "0000:1b:00.0"
    assert cpu_ranges([0, 1, 2, 5, 96, 97]) == "0-2,5,96-97"
    assert cpu_ranges([]) == ""
