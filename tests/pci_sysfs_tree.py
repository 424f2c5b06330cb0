"""Build `/sys`-shaped PCI trees in a temporary directory, at test time, from two real recordings:

* tests/fixtures/h100-vm-capture/sys/pci/<BDF>/: real sysfs attributes of every PCI function of a
  single-H100 VM (see h100-vm-capture.source.txt). Written back unchanged under the path in its
  `realpath` file, with `bus/pci/devices/<BDF>` and `driver` links re-created (the capture kept
  the driver link's name in `driver_name`).
* tests/fixtures/lspci/gpud-h100x8-cx7-lspci-vvv-full.txt: a real `lspci -vvv` of a healthy 8x H100
  SXM node with 8 ConnectX-7, 2 ConnectX-6 Dx and 4 NVSwitches behind PCIe Gen5 switches. DERIVED
  into sysfs attributes: LnkCap → max_link_speed/width, LnkSta → current_link_speed/width, the
  bridges' "Bus: primary/secondary" → the directory hierarchy (so each device's upstream port is
  its parent directory), "Kernel driver in use" → the driver link and uevent's DRIVER=, "NUMA
  node" → numa_node.
  lspci -vvv prints names, not numbers: the vendor ids of NVIDIA (0x10de), Mellanox (0x15b3),
  Intel (0x8086) and Broadcom/LSI (0x1000), the device ids printed as "Device XXXX", the ConnectX
  ids (MT2910 = 0x1021, MT2892 = 0x101d) and the class codes of the class names are the PCI ID
  database's; other vendors are written 0xffff. A device with an "Advanced Error Reporting"
  capability whose status registers show no error gets AER counter files with every count 0
  (sysfs counts since boot; lspci shows only the latched status bits) — an inference, stated here.
  The CPU's own functions ("System peripheral", "Performance counters", "Generic system
  peripheral": 390 of the 517, on root buses, no PCIe link) are left out to keep the tests fast.

* tests/fixtures/lspci/gpud-azure-a100x8-lspci-nn.txt: a real `lspci -nn` of an Azure ND A100 v4
  VM (8 A100, 6 NVSwitches, 8 ConnectX-6 VFs, one ConnectX-4 Lx VF, NVMe), each device alone in its
  own PCI domain as Hyper-V presents them. DERIVED: vendor, device and class from the numbers lspci
  printed; every device on its own root bus (no upstream port); no driver, link or AER files
  (lspci -nn shows none).

Fault variants are made by `override` ({BDF: {attribute: text, or None to delete}}) and `drop`
(functions left out), and said in each test.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

FIX = Path(__file__).parent / "fixtures"
H100_VM = FIX / "h100-vm-capture"
LSPCI_H100X8 = FIX / "lspci" / "gpud-h100x8-cx7-lspci-vvv-full.txt"
LSPCI_AZURE_A100 = FIX / "lspci" / "gpud-azure-a100x8-lspci-nn.txt"

AER_ZERO = {
    "aer_dev_correctable": "RxErr 0\nBadTLP 0\nBadDLLP 0\nRollover 0\nTimeout 0\nNonFatalErr 0\n"
    "CorrIntErr 0\nHeaderOF 0\nTOTAL_ERR_COR 0\n",
    "aer_dev_fatal": "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nCmpltAbrt 0\nUnxCmplt 0\n"
    "RxOF 0\nMalfTLP 0\nECRC 0\nUnsupReq 0\nACSViol 0\nUncorrIntErr 0\nBlockedTLP 0\n"
    "AtomicOpBlocked 0\nTLPBlockedErr 0\nPoisonTLPBlocked 0\nTOTAL_ERR_FATAL 0\n",
    "aer_dev_nonfatal": "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nCmpltAbrt 0\nUnxCmplt 0\n"
    "RxOF 0\nMalfTLP 0\nECRC 0\nUnsupReq 0\nACSViol 0\nUncorrIntErr 0\nBlockedTLP 0\n"
    "AtomicOpBlocked 0\nTLPBlockedErr 0\nPoisonTLPBlocked 0\nTOTAL_ERR_NONFATAL 0\n",
}
_VENDORS = {
    "NVIDIA Corporation": "0x10de",
    "Mellanox Technologies": "0x15b3",
    "Intel Corporation": "0x8086",
    "Broadcom / LSI": "0x1000",
}
_MELLANOX = {"MT2910": "0x1021", "MT2892": "0x101d"}
_CLASSES = {
    "3D controller": "0x030200",
    "VGA compatible controller": "0x030000",
    "Ethernet controller": "0x020000",
    "Infiniband controller": "0x020700",
    "Bridge": "0x068000",
    "PCI bridge": "0x060400",
    "Non-Volatile memory controller": "0x010802",
}
_UNCORE = ("System peripheral", "Performance counters", "Generic system peripheral")
_HEADER = re.compile(r"^([0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) ([^:]+): (.*)$")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _link(root: Path, device_dir: Path, bdf: str, driver: str | None) -> None:
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(device_dir, bus), bus / bdf)
    if driver:
        drv = root / "bus" / "pci" / "drivers" / driver
        drv.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(drv, device_dir), device_dir / "driver")


def _apply(device_dir: Path, attrs: Mapping[str, str | None]) -> None:
    for name, text in attrs.items():
        if text is None:
            (device_dir / name).unlink(missing_ok=True)
        else:
            _write(device_dir / name, text)


def build_from_capture(
    root: Path,
    *,
    override: Mapping[str, Mapping[str, str | None]] | None = None,
    drop: Iterable[str] = (),
    capture: Path = H100_VM / "sys" / "pci",
) -> Path:
    """The H100 VM's PCI bus under root; returns root/bus/pci/devices."""
    override = override or {}
    skip = set(drop)
    for src in sorted(capture.iterdir()):
        bdf = src.name
        if bdf in skip:
            continue
        real = (src / "realpath").read_text(encoding="utf-8").strip()
        device_dir = root / os.path.relpath(real, "/sys")
        device_dir.mkdir(parents=True, exist_ok=True)
        for leaf in src.iterdir():
            if leaf.name not in ("realpath", "driver_name"):
                (device_dir / leaf.name).write_bytes(leaf.read_bytes())
        driver_file = src / "driver_name"
        driver = driver_file.read_text(encoding="utf-8").strip() if driver_file.exists() else None
        _link(root, device_dir, bdf, driver or None)
        _apply(device_dir, override.get(bdf, {}))
    return root / "bus" / "pci" / "devices"


@functools.lru_cache(maxsize=4)
def _lspci_blocks(text: str) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    cur: dict[str, str] | None = None
    for line in text.splitlines():
        m = _HEADER.match(line)
        if m:
            cur = {"bdf": "0000:" + m.group(1), "class": m.group(2), "name": m.group(3)}
            out.append(cur)
            continue
        if cur is None:
            continue
        s = line.strip()
        for key, pat in (
            ("bus", r"^Bus: primary=([0-9a-f]+), secondary=([0-9a-f]+)"),
            ("lnkcap", r"^LnkCap:\s+Port #\d+, Speed ([0-9.]+)GT/s, Width x(\d+)"),
            ("lnksta", r"^LnkSta:\s+Speed ([0-9.]+)GT/s[^,]*, Width x(\d+)"),
            ("driver", r"^Kernel driver in use: (\S+)"),
            ("numa", r"^NUMA node: (\d+)"),
        ):
            mm = re.match(pat, s)
            if mm:
                cur[key] = " ".join(mm.groups())
        if "Advanced Error Reporting" in s:
            cur["aer"] = "1"
    return out


def _ids(block: dict[str, str]) -> tuple[str, str, str]:
    name, cls = block["name"], block["class"]
    vendor = next((v for k, v in _VENDORS.items() if name.startswith(k)), "0xffff")
    m = re.search(r"Device ([0-9a-f]{4})", name)
    device = "0x" + m.group(1) if m else next((v for k, v in _MELLANOX.items() if k in name), "0xffff")
    bracket = re.search(r"\[([0-9a-f]{4})\]$", cls)
    code = "0x" + bracket.group(1) + "00" if bracket else _CLASSES.get(cls, "0xff0000")
    return vendor, device, code


def _speed(gts: str) -> str:
    return f"{float(gts):.1f} GT/s PCIe"


def build_from_lspci(
    root: Path,
    *,
    override: Mapping[str, Mapping[str, str | None]] | None = None,
    drop: Iterable[str] = (),
    source: Path = LSPCI_H100X8,
) -> Path:
    """The 8x H100 node's PCI bus under root; returns root/bus/pci/devices."""
    override = override or {}
    skip = set(drop)
    blocks = _lspci_blocks(source.read_text(encoding="utf-8"))
    bridge_of_bus = {}
    for b in blocks:
        if "bus" in b:
            bridge_of_bus[b["bus"].split()[1]] = b["bdf"]
    by_bdf = {b["bdf"]: b for b in blocks}

    def path_of(bdf: str) -> Path:
        bus = bdf.split(":")[1]
        parent = bridge_of_bus.get(bus)
        if parent is None or parent == bdf:
            return root / "devices" / f"pci0000:{bus}" / bdf
        return path_of(parent) / bdf

    for b in blocks:
        bdf = b["bdf"]
        if bdf in skip or b["class"].startswith(_UNCORE):
            continue
        device_dir = path_of(bdf)
        device_dir.mkdir(parents=True, exist_ok=True)
        vendor, device, code = _ids(b)
        _write(device_dir / "vendor", vendor + "\n")
        _write(device_dir / "device", device + "\n")
        _write(device_dir / "class", code + "\n")
        _write(device_dir / "numa_node", b.get("numa", "-1") + "\n")
        driver_line = f"DRIVER={b['driver']}\n" if "driver" in b else ""
        _write(device_dir / "uevent", f"{driver_line}PCI_SLOT_NAME={bdf}\n")
        if "lnkcap" in b:
            speed, width = b["lnkcap"].split()
            _write(device_dir / "max_link_speed", _speed(speed) + "\n")
            _write(device_dir / "max_link_width", width + "\n")
        if "lnksta" in b:
            speed, width = b["lnksta"].split()
            _write(device_dir / "current_link_speed", _speed(speed) + "\n")
            _write(device_dir / "current_link_width", width + "\n")
        if "aer" in b:
            for name, text in AER_ZERO.items():
                _write(device_dir / name, text)
        _link(root, device_dir, bdf, b.get("driver"))
        _apply(device_dir, override.get(bdf, {}))
    assert by_bdf  # the recording parsed
    return root / "bus" / "pci" / "devices"


def build_rdma_class(
    root: Path, functions: Mapping[str, str], state: Mapping[str, str] | None = None
) -> Path:
    """A DERIVED /sys/class/infiniband whose devices link to PCI functions already under root
    ({name: BDF}); port 1 ACTIVE/LinkUp unless `state` says otherwise. Returns the class dir."""
    state = state or {}
    class_dir = root / "class" / "infiniband"
    class_dir.mkdir(parents=True, exist_ok=True)
    bus = root / "bus" / "pci" / "devices"
    for name, bdf in functions.items():
        pci_dir = Path(os.path.realpath(bus / bdf))
        dev_dir = pci_dir / "infiniband" / name
        port = dev_dir / "ports" / "1"
        _write(port / "state", state.get(name, "4: ACTIVE"))
        _write(port / "phys_state", "5: LinkUp")
        _write(port / "rate", "400 Gb/sec (4X NDR)")
        _write(port / "link_layer", "InfiniBand")
        os.symlink(os.path.join(os.path.relpath(pci_dir.parent, dev_dir), pci_dir.name), dev_dir / "device")
        os.symlink(os.path.relpath(dev_dir, class_dir), class_dir / name)
    return class_dir


def build_from_lspci_nn(root: Path, *, drop: Iterable[str] = (), source: Path = LSPCI_AZURE_A100) -> Path:
    """The Azure ND A100 v4 VM's PCI bus under root; returns root/bus/pci/devices."""
    line = re.compile(
        r"^(?:([0-9a-f]{4}):)?([0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) "  # [domain:]bus:dev.fn
        r".*?\[([0-9a-f]{4})\]: .*\[([0-9a-f]{4}):([0-9a-f]{4})\]"  # [class]: ... [vendor:device]
    )
    skip = set(drop)
    for text in source.read_text(encoding="utf-8").splitlines():
        m = line.match(text)
        if m is None:
            continue
        domain, rest, cls, vendor, device = m.groups()
        bdf = f"{domain or '0000'}:{rest}"
        if bdf in skip:
            continue
        device_dir = root / "devices" / f"pci{domain or '0000'}:{rest[:2]}" / bdf
        _write(device_dir / "vendor", f"0x{vendor}\n")
        _write(device_dir / "device", f"0x{device}\n")
        _write(device_dir / "class", f"0x{cls}00\n")
        _link(root, device_dir, bdf, None)
    return root / "bus" / "pci" / "devices"
