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

from agent.core.pci import normalize_pci, short_pci
from agent.core.rdma import RdmaDevice, RdmaPort, RdmaSample

_PCI = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_EFA_NAME = re.compile(r"^(rdmap\d+s\d+|efa_\d+)")
_INT = re.compile(r"^\s*-?\d+\s*$")


def _natural(name: str) -> tuple[object, ...]:
    """Sort rdmap79s0 before rdmap113s0 and mlx5_2 before mlx5_10."""
    parts = re.split(r"(\d+)", name)
    return tuple((0, int(p), "") if i % 2 else (1, 0, p) for i, p in enumerate(parts))


# Plain str paths and os calls: a p5 has 32 devices × ~30 counters, and pathlib's per-object cost
# was most of this probe's time (8 ms → see bench/footprint.py).
_J = os.path.join


def _read(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except (OSError, ValueError):
        return None
    try:
        return os.read(fd, 65536).decode("utf-8", errors="replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)


def _readlink_base(path: str) -> str | None:
    try:
        target = os.readlink(path)
    except (OSError, ValueError):
        return None  # absent, or not a link
    base = target.rstrip("/").rsplit("/", 1)[-1]
    return base or None


def _is_dir(path: str) -> bool:
    try:
        return os.path.isdir(path)
    except (OSError, ValueError):
        return False


def _listdir(path: str, ordered: bool = True) -> list[str]:
    try:
        names = os.listdir(path)
    except (OSError, ValueError):
        return []
    return sorted(names, key=_natural) if ordered else names


def _after_colon(text: str | None) -> str | None:
    """sysfs state files read "4: ACTIVE" / "5: LinkUp"; keep the words after the number."""
    if text is None:
        return None
    head, sep, tail = text.partition(":")
    if sep and head.strip().isdigit():
        return tail.strip() or None
    return text or None


def _counters(port_dir: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for sub in ("counters", "hw_counters"):
        folder = _J(port_dir, sub)
        for name in _listdir(folder, ordered=False):
            text = _read(_J(folder, name))
            if text is not None and _INT.match(text):
                out[name] = int(text)
    return out


def _port(port_dir: str, number: int) -> RdmaPort:
    return RdmaPort(
        number=number,
        state=_after_colon(_read(_J(port_dir, "state"))),
        phys_state=_after_colon(_read(_J(port_dir, "phys_state"))),
        rate=_read(_J(port_dir, "rate")) or None,
        link_layer=_read(_J(port_dir, "link_layer")) or None,
        counters=_counters(port_dir),
    )


def _pci_of(dev_dir: str) -> str | None:
    base = _readlink_base(_J(dev_dir, "device"))
    if base and _PCI.match(base):
        return normalize_pci(base)
    uevent = _read(_J(dev_dir, "device", "uevent"))
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


def _device(dev_dir: str, name: str, pci_devices_dir: str | None) -> RdmaDevice:
    pci = _pci_of(dev_dir)
    vendor = _vendor(_read(_J(dev_dir, "device", "vendor")))
    driver = _readlink_base(_J(dev_dir, "device", "driver"))
    if pci_devices_dir is not None and pci is not None:
        pci_dir = _J(pci_devices_dir, short_pci(pci))
        vendor = vendor or _vendor(_read(_J(pci_dir, "vendor")))
        driver = driver or _readlink_base(_J(pci_dir, "driver"))
    if vendor is None and driver is None and _EFA_NAME.match(name):
        driver = "efa"  # the name is the only witness left (copied tree without links)
    ports: list[RdmaPort] = []
    ports_dir = _J(dev_dir, "ports")
    for entry in _listdir(ports_dir):
        if entry.isascii() and entry.isdigit() and _is_dir(_J(ports_dir, entry)):
            ports.append(_port(_J(ports_dir, entry), int(entry)))
    return RdmaDevice(name=name, pci=pci, vendor=vendor, driver=driver, ports=tuple(ports))


def read_rdma(
    class_dir: Path, pci_devices_dir: Path | None = None, taken_at: float | None = None
) -> RdmaSample:
    """Read every device under class_dir. Raises FileNotFoundError when class_dir does not exist
    (no RDMA stack loaded); an empty directory is a sample with zero devices."""
    stamp = time.monotonic() if taken_at is None else taken_at
    if not class_dir.exists():
        raise FileNotFoundError(f"{class_dir} does not exist")
    base = str(class_dir)
    pci_base = str(pci_devices_dir) if pci_devices_dir is not None else None
    names = sorted(os.listdir(base), key=_natural)
    devices = tuple(_device(_J(base, name), name, pci_base) for name in names if _is_dir(_J(base, name)))
    return RdmaSample(devices=devices, taken_at=stamp)
