"""NVLink: each GPU's links and speeds (`nvidia-smi nvlink -s` or NVML), and their error counters read over
time."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.core.probed import SourceLine


@dataclass(frozen=True)
class NvlinkGpu:
    """`nvidia-smi nvlink -s` for one GPU. links maps link number → speed in GB/s, None if inactive."""

    index: int
    name: str | None
    uuid: str | None
    links: dict[int, float | None]
    all_inactive: bool = False  # "Unable to retrieve NVLink information as all links are inactive"
    unavailable: str | None = None  # why links could not be queried (MIG mode); not a link fault
    # Its header line and the lines that state a fault (<inactive> links, "all links are inactive").
    where: tuple[SourceLine, ...] = field(default=(), compare=False, repr=False)

    @property
    def active_links(self) -> int:
        return sum(1 for v in self.links.values() if v is not None)

    @property
    def inactive_links(self) -> int:
        return sum(1 for v in self.links.values() if v is None)


@dataclass(frozen=True)
class NvlinkReport:
    gpus: tuple[NvlinkGpu, ...] = ()
    # False: nvidia-smi says "Device does not have or support Nvlink"; None: the listing is empty
    # (GPUs without NVLink print nothing, and so does a capture that lost everything).
    supported: bool | None = True
    source: str = "nvidia-smi nvlink -s"


@dataclass(frozen=True)
class NvlinkErrorCounts:
    """One GPU's NVLink error counters: link → {"replay", "recovery", "crc_flit", "crc_data"} → count
    (only the counters the driver reports for that link)."""

    index: int
    pci_bus_id: str
    links: dict[int, dict[str, int]]


@dataclass(frozen=True)
class NvlinkErrorSample:
    """One read of every GPU's NVLink error counters, with the time it was taken (for rates)."""

    gpus: tuple[NvlinkErrorCounts, ...]
    taken_at: float
