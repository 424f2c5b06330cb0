"""Read a `/sys/class/infiniband`-shaped tree: RDMA devices (EFA, Mellanox), their ports and counters.

The same code reads the live sysfs and a copied snapshot. Copies lose symlinks (`device`,
`device/driver`), so the PCI function, vendor and driver are looked up in several places and any
of them may stay None. Only a missing class directory is an error; everything below it is read
best-effort, because one unreadable counter must not hide the port state next to it.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from agent.model import RdmaDevice, RdmaPort, RdmaSample, normalize_pci, short_pci

_PCI = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_EFA_NAME = re.compile(r"^(rdmap\d+s\d+|efa_\d+)")
_INT = re.compile(r"^\s*-?\d+\s*$")


def _natural(name: str) -> tuple[object, ...]:
    """Sort rdmap79s0 before rdmap113s0 and mlx5_2 before mlx5_10."""
    parts = re.split(r"(\d+)", name)
    return tuple((0, int(p), "") if i % 2 else (1, 0, p) for i, p in enumerate(parts))


def _read(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8", errors="replace").strip()
    except (OSError, ValueError):
        return None


def _readlink_base(path: Path) -> str | None:
    try:
        if not path.is_symlink():
            return None
        target = os.readlink(path)
    except (OSError, ValueError):
        return None
    base = target.rstrip("/").rsplit("/", 1)[-1]
    return base or None


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path), key=_natural)
    except (OSError, ValueError):
        return []


def _after_colon(text: str | None) -> str | None:
    """sysfs state files read "4: ACTIVE" / "5: LinkUp"; keep the words after the number."""
    if text is None:
        return None
    head, sep, tail = text.partition(":")
    if sep and head.strip().isdigit():
        return tail.strip() or None
    return text or None


def _counters(port_dir: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for sub in ("counters", "hw_counters"):
        folder = port_dir / sub
        for name in _listdir(folder):
            text = _read(folder / name)
            if text is not None and _INT.match(text):
                out[name] = int(text)
    return out


def _port(port_dir: Path, number: int) -> RdmaPort:
    return RdmaPort(
        number=number,
        state=_after_colon(_read(port_dir / "state")),
        phys_state=_after_colon(_read(port_dir / "phys_state")),
        rate=_read(port_dir / "rate") or None,
        link_layer=_read(port_dir / "link_layer") or None,
        counters=_counters(port_dir),
    )


def _pci_of(dev_dir: Path) -> str | None:
    base = _readlink_base(dev_dir / "device")
    if base and _PCI.match(base):
        return normalize_pci(base)
    uevent = _read(dev_dir / "device" / "uevent")
    for line in (uevent or "").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "PCI_SLOT_NAME" and _PCI.match(value.strip()):
            return normalize_pci(value.strip())
    return None


def _vendor(text: str | None) -> str | None:
    if not text:
        return None
    text = text.split()[0].lower()
    if not text.startswith("0x"):
        text = "0x" + text
    return text if re.match(r"^0x[0-9a-f]{1,4}$", text) else None


def _device(dev_dir: Path, name: str, pci_devices_dir: Path | None) -> RdmaDevice:
    pci = _pci_of(dev_dir)
    vendor = _vendor(_read(dev_dir / "device" / "vendor"))
    driver = _readlink_base(dev_dir / "device" / "driver")
    if pci_devices_dir is not None and pci is not None:
        pci_dir = pci_devices_dir / short_pci(pci)
        vendor = vendor or _vendor(_read(pci_dir / "vendor"))
        driver = driver or _readlink_base(pci_dir / "driver")
    if vendor is None and driver is None and _EFA_NAME.match(name):
        driver = "efa"  # the name is the only witness left (copied tree without links)
    ports: list[RdmaPort] = []
    ports_dir = dev_dir / "ports"
    for entry in _listdir(ports_dir):
        if entry.isascii() and entry.isdigit() and _is_dir(ports_dir / entry):
            ports.append(_port(ports_dir / entry, int(entry)))
    return RdmaDevice(name=name, pci=pci, vendor=vendor, driver=driver, ports=tuple(ports))


def read_rdma(
    class_dir: Path, pci_devices_dir: Path | None = None, taken_at: float | None = None
) -> RdmaSample:
    """Read every device under class_dir. Raises FileNotFoundError when class_dir does not exist
    (no RDMA stack loaded); an empty directory is a sample with zero devices."""
    stamp = time.monotonic() if taken_at is None else taken_at
    if not class_dir.exists():
        raise FileNotFoundError(f"{class_dir} does not exist")
    names = sorted(os.listdir(class_dir), key=_natural)
    devices = tuple(
        _device(class_dir / name, name, pci_devices_dir) for name in names if _is_dir(class_dir / name)
    )
    return RdmaSample(devices=devices, taken_at=stamp)
