"""The PCI bus as sysfs shows it (devices, links, AER counters), and the one spelling of a PCI address that
every reader normalises to."""

from __future__ import annotations

from dataclasses import dataclass, field

NVIDIA_VENDOR, AMAZON_VENDOR, MELLANOX_VENDOR = "0x10de", "0x1d0f", "0x15b3"


@dataclass(frozen=True)
class PciDevice:
    """One PCI function as /sys/bus/pci/devices shows it. Link speeds in GT/s. `aer` maps
    "fatal"/"nonfatal"/"correctable" to that file's counters (TOTAL_ERR_* included); absent files
    (no AER capability, old kernel) leave the kind out."""

    address: str  # normalised, as normalize_pci
    vendor: str | None = None  # "0x10de"
    device: str | None = None  # "0x2330"
    pci_class: str | None = None  # "0x030200"
    driver: str | None = None  # "nvidia", "mlx5_core", "efa"; None: unbound (or unknown in a copy)
    upstream: str | None = None  # the bridge above (normalised); None: on a root bus, or unknown
    numa_node: int | None = None
    speed_current: float | None = None
    speed_max: float | None = None
    width_current: int | None = None
    width_max: int | None = None
    virtual_function: bool = False  # an SR-IOV VF (has a physfn link): its link is the PF's
    aer: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def kind(self) -> str | None:
        """ "gpu", "nvswitch", "efa", "connectx" for the devices the agent judges, else None."""
        vendor, cls, dev = self.vendor or "", self.pci_class or "", self.device or ""
        if vendor == NVIDIA_VENDOR and cls.startswith(("0x0300", "0x0302")):
            return "gpu"
        if vendor == NVIDIA_VENDOR and cls.startswith("0x0680"):
            return "nvswitch"
        if vendor == AMAZON_VENDOR and dev.startswith("0xefa"):
            return "efa"  # 0x1d0f is also the ENA Ethernet adapter (0xec20, ...): only 0xefa* is EFA
        if vendor == MELLANOX_VENDOR and cls.startswith("0x02"):
            return "connectx"
        return None

    @property
    def label(self) -> str:
        return f"{self.kind or 'device'} {short_pci(self.address)}"


@dataclass(frozen=True)
class PciSample:
    """Every PCI function on the bus, with the time it was read (for AER counter rates)."""

    devices: tuple[PciDevice, ...]
    taken_at: float

    def by_address(self) -> dict[str, PciDevice]:
        return {d.address: d for d in self.devices}


def normalize_pci(bus_id: str) -> str:
    """ "0000:53:00.0", "00000000:53:00.0", "53:00.0" → "00000000:53:00.0" (lower case)."""
    text = bus_id.strip().lower()
    if text.startswith("pci:"):
        text = text[4:]
    parts = text.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        return text
    domain, bus, devfn = parts
    if "." not in devfn:
        devfn = devfn + ".0"
    dev, _, fn = devfn.partition(".")
    try:
        return f"{int(domain, 16):08x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn, 16):x}"
    except ValueError:
        return text


def short_pci(bus_id: str) -> str:
    """ "00000000:53:00.0" → "0000:53:00.0" (the sysfs / lspci form people recognise)."""
    norm = normalize_pci(bus_id)
    domain, _, rest = norm.partition(":")
    if len(domain) == 8 and rest:
        return f"{domain[4:]}:{rest}"
    return norm
