"""Read `/sys/bus/pci/devices`: every PCI function's identity, driver, link and AER counters.

The same code reads the live sysfs and a snapshot copy (agent.probes.capture re-creates the
device hierarchy and the `bus/pci/devices` links, so the upstream bridge survives the copy). The
bridge above a function is the parent directory of the path its link resolves to; a copy without
links leaves it None, and the link is then judged against the device's own maximum only. Every
attribute is read best-effort: one unreadable file must not hide the device next to it.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from agent.core.pci import PciDevice, PciSample, normalize_pci

_BDF = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_SPEED = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s")
_HEX = re.compile(r"^0x[0-9a-f]{1,8}$")
AER_FILES = {"fatal": "aer_dev_fatal", "nonfatal": "aer_dev_nonfatal", "correctable": "aer_dev_correctable"}
# What a snapshot copies of each function (agent.probes.capture).
PCI_ATTRS = (
    "vendor",
    "device",
    "class",
    "uevent",
    "numa_node",
    "current_link_speed",
    "max_link_speed",
    "current_link_width",
    "max_link_width",
    *AER_FILES.values(),
)
_J = os.path.join


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(65536).decode("utf-8", errors="replace").strip()
    except (OSError, ValueError):
        return None  # absent, or a read that the device refuses (EIO on a dying function)


def _hex(text: str | None) -> str | None:
    value = (text or "").split()[0].lower() if (text or "").split() else ""
    return value if _HEX.match(value) else None


def _int(text: str | None) -> int | None:
    try:
        return int((text or "").strip())
    except ValueError:
        return None


def _speed(text: str | None) -> float | None:
    """ "32.0 GT/s PCIe" → 32.0; "Unknown" / "Unknown speed" → None."""
    m = _SPEED.match(text or "")
    return float(m.group(1)) if m else None


def _aer(text: str | None) -> dict[str, int] | None:
    """ "RxErr 0\\nBadTLP 3\\n...TOTAL_ERR_COR 3" → {"RxErr": 0, "BadTLP": 3, ...}."""
    if text is None:
        return None
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.strip().rpartition(" ")
        count = _int(value)
        if name and count is not None:
            out[name.strip()] = count
    return out


def _driver(dev: str) -> str | None:
    try:
        return os.path.basename(os.readlink(_J(dev, "driver"))) or None
    except (OSError, ValueError):
        pass
    for line in (_read(_J(dev, "uevent")) or "").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "DRIVER" and value.strip():
            return value.strip()
    return None


def _upstream(dev: str) -> str | None:
    parent = os.path.basename(os.path.dirname(os.path.realpath(dev)))
    return normalize_pci(parent) if _BDF.match(parent) else None


def read_device(dev: str, address: str) -> PciDevice:
    numa = _int(_read(_J(dev, "numa_node")))
    aer: dict[str, dict[str, int]] = {}
    for kind, name in AER_FILES.items():
        counters = _aer(_read(_J(dev, name)))
        if counters is not None:
            aer[kind] = counters
    return PciDevice(
        address=normalize_pci(address),
        vendor=_hex(_read(_J(dev, "vendor"))),
        device=_hex(_read(_J(dev, "device"))),
        pci_class=_hex(_read(_J(dev, "class"))),
        driver=_driver(dev),
        upstream=_upstream(dev),
        numa_node=numa if numa is not None and numa >= 0 else None,
        speed_current=_speed(_read(_J(dev, "current_link_speed"))),
        speed_max=_speed(_read(_J(dev, "max_link_speed"))),
        width_current=_int(_read(_J(dev, "current_link_width"))),
        width_max=_int(_read(_J(dev, "max_link_width"))),
        virtual_function=os.path.lexists(_J(dev, "physfn")),
        aer=aer,
    )


def read_pci(devices_dir: Path, taken_at: float | None = None) -> PciSample:
    """Every function under devices_dir (/sys/bus/pci/devices). Raises FileNotFoundError when the
    directory does not exist; an entry that is not a PCI address is ignored."""
    stamp = time.monotonic() if taken_at is None else taken_at
    base = str(devices_dir)
    names = sorted(n for n in os.listdir(base) if _BDF.match(n))
    return PciSample(devices=tuple(read_device(_J(base, n), n) for n in names), taken_at=stamp)
